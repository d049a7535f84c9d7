"""A closed-loop load client (standard library only, so it runs on a bare GPU machine).

Each of ``users`` threads sends a request, waits for the answer, and sends the next, for a
fixed time. Requests still running at the end are waited for and counted with their real
latency; requests/s counts completions over the whole time. With ``processes > 1`` the users
are split over that many forked processes, so that the client's own Python (one interpreter
lock per process) does not cap what a fast server can be shown to do. By default each request
opens its own connection (urllib); ``keep_alive`` gives each user one HTTP/1.1 connection for
all its requests, as a client with a connection pool has.
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
from typing import Any

Job = tuple[str, dict[str, Any], dict[str, str], int]  # url, body, headers, output tokens


@dataclass
class Outcome:
    latencies_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0  # as the replies count them (0: the server does not say)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, latency_ms: float, tokens: tuple[int, int], error: str | None) -> None:
        """``tokens``: (output, prompt) of one reply."""
        with self.lock:
            if error is None:
                self.latencies_ms.append(latency_ms)
                self.output_tokens += tokens[0]
                self.prompt_tokens += tokens[1]
            else:
                self.errors += 1
                if len(self.error_samples) < 5:
                    self.error_samples.append(error)


def send(job: Job, timeout: float) -> tuple[tuple[int, int], str | None]:
    """((output tokens, prompt tokens), None) on success, ((0, 0), what went wrong)
    otherwise."""
    url, body, headers, expected = job
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return (0, 0), f"HTTP {exc.code}: {exc.read()[:200]!r}"
    except (OSError, ValueError) as exc:
        return (0, 0), f"{type(exc).__name__}: {exc}"
    return _counted(answer, expected), None


def _counted(answer: dict[str, Any], expected: int) -> tuple[int, int]:
    usage = answer.get("usage", answer)
    return int(usage.get("output_tokens", expected)), int(usage.get("input_tokens", 0))


class KeptAlive:
    """One user's connection, kept open between its requests and opened again after an
    error. A request on a reused connection that the server had closed meanwhile is sent
    once more on a new one (as connection pools do); any other failure is the request's."""

    def __init__(self) -> None:
        self.connection: http.client.HTTPConnection | None = None

    def send(self, job: Job, timeout: float) -> tuple[tuple[int, int], str | None]:
        url, body, headers, expected = job
        request = (urllib.parse.urlsplit(url), json.dumps(body).encode(), headers, timeout)
        reused = self.connection is not None
        try:
            try:
                status, payload = self._post(*request)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                status, payload = self._post(*request)  # closed while idle: on a new one
        except (OSError, http.client.HTTPException) as exc:  # (_post closed the connection)
            return (0, 0), f"{type(exc).__name__}: {exc}"
        if status >= 400:
            return (0, 0), f"HTTP {status}: {payload[:200]!r}"
        try:
            return _counted(json.loads(payload), expected), None
        except ValueError as exc:
            return (0, 0), f"{type(exc).__name__}: {exc}"

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
    stop_at = started + duration_s
    processes = max(1, min(processes, users))
    if processes == 1:
        outcome = _run_users(make_job, range(users), stop_at, timeout, seed, keep_alive)
    else:
        outcome = _run_forked(make_job, users, stop_at, timeout, seed, processes, keep_alive)
    return summarise(outcome, users, time.monotonic() - started)


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
            tokens, error = kept.send(job, timeout) if kept else send(job, timeout)
            outcome.add((time.perf_counter() - started) * 1000, tokens, error)
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
    back its latencies, tokens and errors."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child(indices: Sequence[int]) -> None:
        done = _run_users(make_job, indices, stop_at, timeout, seed, keep_alive)
        results.put(
            (done.latencies_ms, done.output_tokens, done.prompt_tokens, done.errors,
             done.error_samples)
        )  # fmt: skip

    workers = [
        context.Process(target=child, args=(range(i, users, processes),), daemon=True)
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    merged = Outcome()
    for _ in workers:  # read before joining: a child blocks until its result is taken
        latencies, tokens, prompt_tokens, errors, samples = results.get()
        merged.latencies_ms.extend(latencies)
        merged.output_tokens += tokens
        merged.prompt_tokens += prompt_tokens
        merged.errors += errors
        merged.error_samples.extend(samples[: 5 - len(merged.error_samples)])
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
        "error_samples": outcome.error_samples,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
