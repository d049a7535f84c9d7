"""A closed-loop load client (standard library only, so it runs on a bare GPU machine).

Each of ``users`` threads sends a request, waits for the answer, and sends the next, for a
fixed time. Requests still running at the end are waited for and counted with their real
latency; requests/s counts completions over the whole time. With ``processes > 1`` the users
are split over that many forked processes, so that the client's own Python (one interpreter
lock per process) does not cap what a fast server can be shown to do. By default each request
opens its own connection (urllib); ``keep_alive`` gives each user one HTTP/1.1 connection for
all its requests, as a client with a connection pool has.

A job may be bad on purpose (``Job.expected_status`` 400): its 400 is an expected error,
counted apart and never as an error; anything else a request gets that its job did not expect
(another status, no reply, a timeout) is an error. Every request's end is kept, so that a long
level can be cut into windows afterwards (:func:`windows`).

Output tokens are read from the reply's ``usage``: the request API's ``output_tokens`` and
``input_tokens``, or OpenAI's ``completion_tokens`` and ``prompt_tokens``. A good reply that
counts other output tokens than its job asked for is counted (``output_mismatches``): the
systems compared must generate the same tokens (random weights never stop early, so each
request's length is fixed by its ``max_new_tokens``).
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import random
import statistics
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Job(NamedTuple):
    """One request: where it goes, its JSON body and headers, the output tokens it asks for,
    and the status a correct server answers it with (400 for a request bad on purpose)."""

    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    output_tokens: int
    expected_status: int = 200


class Reply(NamedTuple):
    """What one request got: a translation's (output, prompt) tokens, or the error status its
    job expected (``expected_error``), or else what went wrong (``error``). ``other_length``:
    the reply counts other output tokens than the job asked for."""

    tokens: tuple[int, int] = (0, 0)
    error: str | None = None
    expected_error: bool = False
    other_length: bool = False


GOOD, EXPECTED, UNEXPECTED = 0, 1, 2  # a finished request's kind (Outcome.finished)


@dataclass
class Outcome:
    latencies_ms: list[float] = field(default_factory=list)  # of good requests
    output_tokens: int = 0
    prompt_tokens: int = 0  # as the replies count them (0: the server does not say)
    errors: int = 0  # unexpected ones
    expected_errors: int = 0
    output_mismatches: int = 0  # good replies with other output tokens than asked for
    error_samples: list[str] = field(default_factory=list)
    finished: list[tuple[float, float, int]] = field(default_factory=list)  # (end, ms, kind)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, latency_ms: float, reply: Reply, ended: float) -> None:
        """``ended``: time.monotonic() when the reply was read (one clock for every process)."""
        with self.lock:
            if reply.expected_error:
                self.expected_errors += 1
                self.finished.append((ended, latency_ms, EXPECTED))
            elif reply.error is None:
                self.latencies_ms.append(latency_ms)
                self.output_tokens += reply.tokens[0]
                self.prompt_tokens += reply.tokens[1]
                self.output_mismatches += reply.other_length
                self.finished.append((ended, latency_ms, GOOD))
            else:
                self.errors += 1
                self.finished.append((ended, latency_ms, UNEXPECTED))
                if len(self.error_samples) < 5:
                    self.error_samples.append(reply.error)

    def parts(self) -> dict[str, Any]:
        """Everything but the lock (what a forked process sends back)."""
        return {name: value for name, value in vars(self).items() if name != "lock"}

    def merge(self, parts: dict[str, Any]) -> None:
        self.latencies_ms.extend(parts["latencies_ms"])
        self.finished.extend(parts["finished"])
        for name in (
            "output_tokens", "prompt_tokens", "errors", "expected_errors", "output_mismatches"
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + parts[name])
        self.error_samples.extend(parts["error_samples"][: 5 - len(self.error_samples)])


def send(job: Job, timeout: float) -> Reply:
    """Send one job on a connection of its own."""
    data = json.dumps(job.body).encode()
    req = urllib.request.Request(
        job.url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", **job.headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as exc:
        return judged(job, exc.code, exc.read())
    except (OSError, ValueError) as exc:
        return Reply(error=f"{type(exc).__name__}: {exc}")
    return judged(job, status, payload)


def judged(job: Job, status: int, payload: bytes) -> Reply:
    """The reply as the job expected it or not."""
    if status != job.expected_status:
        wanted = "" if job.expected_status == 200 else f" ({job.expected_status} expected)"
        return Reply(error=f"HTTP {status}{wanted}: {payload[:200]!r}")
    if status != 200:
        return Reply(expected_error=True)
    try:
        tokens = counted_tokens(json.loads(payload), job.output_tokens)
    except (ValueError, TypeError, AttributeError) as exc:
        return Reply(error=f"{type(exc).__name__}: {exc}")
    return Reply(tokens=tokens, other_length=tokens[0] != job.output_tokens)


def counted_tokens(answer: dict[str, Any], expected: int) -> tuple[int, int]:
    """(output, prompt) tokens as a reply counts them: the request API's ``usage`` (or the
    naive server's top level) ``output_tokens`` and ``input_tokens``, or OpenAI's
    ``completion_tokens`` and ``prompt_tokens``; ``expected`` output and 0 prompt tokens where
    the reply does not say."""
    usage = answer.get("usage", answer)
    if "completion_tokens" in usage:  # OpenAI's usage
        return int(usage["completion_tokens"]), int(usage.get("prompt_tokens", 0))
    return int(usage.get("output_tokens", expected)), int(usage.get("input_tokens", 0))


class KeptAlive:
    """One user's connection, kept open between its requests and opened again after an
    error. A request on a reused connection that the server had closed meanwhile is sent
    once more on a new one (as connection pools do); any other failure is the request's."""

    def __init__(self) -> None:
        self.connection: http.client.HTTPConnection | None = None

    def send(self, job: Job, timeout: float) -> Reply:
        request = (urllib.parse.urlsplit(job.url), json.dumps(job.body).encode(), job.headers)
        reused = self.connection is not None
        try:
            try:
                status, payload = self._post(*request, timeout)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                status, payload = self._post(*request, timeout)  # closed while idle: anew
        except (OSError, http.client.HTTPException) as exc:  # (_post closed the connection)
            return Reply(error=f"{type(exc).__name__}: {exc}")
        return judged(job, status, payload)

    def _post(
        self,
        target: urllib.parse.SplitResult,
        data: bytes,
        headers: dict[str, str],
        timeout: float,
    ) -> tuple[int, bytes]:
        if self.connection is None:
            host = target.hostname or "127.0.0.1"
            self.connection = http.client.HTTPConnection(host, target.port, timeout=timeout)
        try:
            self.connection.request(
                "POST",
                target.path,
                body=data,
                headers={"Content-Type": "application/json", **headers},
            )
            response = self.connection.getresponse()
            payload = response.read()
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, payload

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def run_closed_loop(
    make_job: Callable[[random.Random], Job],
    users: int,
    duration_s: float,
    timeout: float = 600.0,
    seed: int = 0,
    processes: int = 1,
    keep_alive: bool = False,
) -> dict[str, Any]:
    """Drive ``users`` closed-loop clients for ``duration_s``; summary statistics."""
    started = time.monotonic()
    outcome = drive(make_job, users, duration_s, timeout, seed, processes, keep_alive)
    return summarise(outcome, users, time.monotonic() - started)


def drive(
    make_job: Callable[[random.Random], Job],
    users: int,
    duration_s: float,
    timeout: float = 600.0,
    seed: int = 0,
    processes: int = 1,
    keep_alive: bool = False,
) -> Outcome:
    """Drive ``users`` closed-loop clients for ``duration_s``, then wait for the requests
    still running; every request's outcome."""
    stop_at = time.monotonic() + duration_s
    processes = max(1, min(processes, users))
    if processes == 1:
        return _run_users(make_job, range(users), stop_at, timeout, seed, keep_alive)
    return _run_forked(make_job, users, stop_at, timeout, seed, processes, keep_alive)


def _run_users(
    make_job: Callable[[random.Random], Job],
    indices: Sequence[int],
    stop_at: float,
    timeout: float,
    seed: int,
    keep_alive: bool = False,
) -> Outcome:
    outcome = Outcome()

    def user(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        kept = KeptAlive() if keep_alive else None
        while time.monotonic() < stop_at:
            job = make_job(rng)
            started = time.perf_counter()
            reply = kept.send(job, timeout) if kept else send(job, timeout)
            outcome.add((time.perf_counter() - started) * 1000, reply, time.monotonic())
        if kept is not None:
            kept.close()

    threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in indices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcome


def _run_forked(
    make_job: Callable[[random.Random], Job],
    users: int,
    stop_at: float,
    timeout: float,
    seed: int,
    processes: int,
    keep_alive: bool = False,
) -> Outcome:
    """The users split over forked processes (fork: ``make_job`` may be a closure); each sends
    back its outcome (time.monotonic() is one clock for all processes)."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child(indices: Sequence[int]) -> None:
        results.put(_run_users(make_job, indices, stop_at, timeout, seed, keep_alive).parts())

    workers = [
        context.Process(target=child, args=(range(i, users, processes),), daemon=True)
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    merged = Outcome()
    for _ in workers:  # read before joining: a child blocks until its result is taken
        merged.merge(results.get())
    for worker in workers:
        worker.join()
    return merged


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarise(outcome: Outcome, users: int, elapsed: float) -> dict[str, Any]:
    done = len(outcome.latencies_ms)
    return {
        "users": users,
        "elapsed_s": round(elapsed, 2),
        "requests": done,
        "requests_per_s": round(done / elapsed, 3),
        "output_tokens_per_s": round(outcome.output_tokens / elapsed, 1),
        "prompt_tokens_per_s": round(outcome.prompt_tokens / elapsed, 1)
        if outcome.prompt_tokens
        else None,
        "p50_ms": _round(percentile(outcome.latencies_ms, 50)),
        "p95_ms": _round(percentile(outcome.latencies_ms, 95)),
        "p99_ms": _round(percentile(outcome.latencies_ms, 99)),
        "mean_ms": _round(statistics.fmean(outcome.latencies_ms) if done else None),
        "errors": outcome.errors,
        "expected_errors": outcome.expected_errors,
        "output_mismatches": outcome.output_mismatches,
        "error_samples": outcome.error_samples,
    }


def windows(
    finished: Sequence[tuple[float, float, int]], start: float, window_s: float, count: int
) -> list[dict[str, Any]]:
    """``count`` windows of ``window_s`` from ``start`` (time.monotonic()), each with the
    requests that ended in it: good ones a second, their p50 and p99, unexpected and expected
    errors. Requests that ended after the last window (those still running when the level
    stopped) are in none."""
    rows: list[dict[str, Any]] = [
        {"good": [], "errors": 0, "expected_errors": 0} for _ in range(count)
    ]
    for ended, latency_ms, kind in finished:
        index = int((ended - start) // window_s)
        if not 0 <= index < count:
            continue
        if kind == GOOD:
            rows[index]["good"].append(latency_ms)
        else:
            rows[index]["errors" if kind == UNEXPECTED else "expected_errors"] += 1
    return [_window(index, row, window_s) for index, row in enumerate(rows)]


def _window(index: int, row: dict[str, Any], window_s: float) -> dict[str, Any]:
    good = row["good"]
    return {
        "window": index + 1,
        "end_s": round((index + 1) * window_s, 1),
        "requests": len(good),
        "requests_per_s": round(len(good) / window_s, 2),
        "p50_ms": _round(percentile(good, 50)),
        "p99_ms": _round(percentile(good, 99)),
        "errors": row["errors"],
        "expected_errors": row["expected_errors"],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
