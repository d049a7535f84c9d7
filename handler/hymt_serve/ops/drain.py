"""Draining a server before it stops (``hymt drain``, the Kubernetes preStop hook).

The sequence: mark the work folder as draining, so that ``hymt health`` (the readiness probe)
fails at once and the pod leaves the Service's endpoints; wait ``endpoint_wait`` seconds for
that removal to reach every proxy (requests still arrive meanwhile and are served); then wait
until every prediction TorchServe accepted has been answered, or ``timeout`` runs out. The
caller (kubelet's SIGTERM, ``hymt stop``) stops TorchServe afterwards.

TorchServe 0.12.0 has no in-flight gauge, so the count is made from two of its own records:

- accepted: ``ts_inference_requests_total`` on the metrics port, counted when a prediction
  for a model passes the token check and the model exists (a 404 or a refused key is not);
- answered: the prediction lines of TorchServe's access log (``logs/access_log.log`` and its
  rolled ``access_log.*.log.gz``), one per answer, written once the answer, streamed or not,
  is complete.

The count must also show the job queue empty (the describe API's ``pendingRequests``) and stay
at zero for ``settle`` seconds. Known limits: a prediction refused before it reached the model
(a wrong or expired key) is in the log but not in the counter, so each such refusal since the
start lowers the count by one and can end the drain early while that many requests are still
being generated; gRPC predictions are counted but never logged (our configs keep gRPC on
loopback, unused), so with gRPC traffic the drain waits its whole timeout.
"""

from __future__ import annotations

import gzip
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from hymt_serve.ops.launcher import Server

UNANSWERED_S = 30.0
ACCEPTED = re.compile(r'^ts_inference_requests_total\{[^}]*model_name="([^"]+)"[^}]*\}\s+(\S+)$')
# The request line of an access-log entry that TorchServe's predict() served: /predictions/M,
# /models/M/invoke, /M/predict (legacy), /invocations, and the KServe protocols'
# /v1/models/M:predict and /v2/models/M[/versions/V]/infer (counted as accepted too); any
# method but OPTIONS.
ANSWERED = re.compile(
    rb'"(?!OPTIONS )[A-Z]+ (?:/predictions/[^ ]+|/models/[^/ ]+/invoke[^ ]*|/invocations[^ ]*'
    rb"|/v1/models/[^/ ]+:predict[^ ]*|/v2/models/[^ ]+/infer[^ ]*"
    rb'|/[^/ ]+(?:/[^/ ]+)?/predict[^ ]*) HTTP/[0-9.]+" \d{3} '
)


@dataclass(frozen=True)
class Load:
    """What a server holds: predictions accepted and answered since it started, jobs queued."""

    accepted: int
    answered: int
    queued: int

    @property
    def in_flight(self) -> int:
        """Predictions accepted and not answered yet (at least the queued ones)."""
        return max(self.accepted - self.answered, self.queued, 0)


def count_answers(text: bytes) -> int:
    """Prediction answers among access-log lines."""
    return len(ANSWERED.findall(text))


class AccessLog:
    """Counts the answers in a log folder's access logs, reading only what was added."""

    def __init__(self, log_dir: Path) -> None:
        self.live = log_dir / "access_log.log"
        self.log_dir = log_dir
        self._rolled: dict[str, int] = {}
        self._offset = 0
        self._live_count = 0
        self._inode = 0

    def answered(self) -> int:
        rolled = sorted(self.log_dir.glob("access_log.*.log.gz"))
        for path in rolled:
            key = f"{path.name}:{path.stat().st_size}"
            if key not in self._rolled:
                with gzip.open(path, "rb") as file:
                    self._rolled[key] = count_answers(file.read())
        stat = self.live.stat() if self.live.exists() else None
        size, inode = (stat.st_size, stat.st_ino) if stat else (0, 0)
        if size < self._offset or inode != self._inode:  # rolled over: a new file
            self._offset, self._live_count, self._inode = 0, 0, inode
        if size > self._offset:
            with open(self.live, "rb") as file:
                file.seek(self._offset)
                chunk = file.read(size - self._offset)
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written counts next time
            self._live_count += count_answers(complete)
            self._offset += len(complete)
        names = {f"{path.name}:{path.stat().st_size}" for path in rolled}
        return self._live_count + sum(n for key, n in self._rolled.items() if key in names)


def accepted(metrics_text: str, models: Sequence[str]) -> int:
    """Predictions accepted for ``models``, from the metrics port's Prometheus text."""
    total = 0.0
    for line in metrics_text.splitlines():
        match = ACCEPTED.match(line.strip())
        if match and match.group(1) in models:
            total += float(match.group(2))
    return int(total)


def measure(server: Server, models: Sequence[str], log: AccessLog) -> Load:
    """The server's load now. Raises requests.RequestException when it does not answer."""
    metrics = requests.get(f"{server.metrics_url()}/metrics", timeout=10)
    metrics.raise_for_status()
    queued = 0
    for name in models:
        described = requests.get(
            f"{server.management_url()}/models/{name}",
            headers=server.headers("management"),
            timeout=10,
        )
        described.raise_for_status()
        queued += int(described.json()[0].get("jobQueueStatus", {}).get("pendingRequests", 0))
    # The answers are read last: an answer logged after the counter was read only lowers
    # the count, never hides a request.
    return Load(accepted(metrics.text, models), log.answered(), queued)


def drain(
    server: Server,
    models: Sequence[str],
    *,
    endpoint_wait: float,
    timeout: float,
    poll: float = 0.5,
    settle: float = 1.0,
    say: Callable[[str], None] = print,
) -> bool:
    """Take ``server`` out of rotation and wait until its predictions are answered; True when
    they are (or no server runs), False when ``timeout`` ran out first."""
    server.drain_marker.write_text(f"{time.time():.3f}\n", encoding="utf-8")
    say(f"draining: readiness fails now; waiting {endpoint_wait:g} s for endpoint removal")
    time.sleep(endpoint_wait)
    log = AccessLog(server.log_dir)
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    answered_at = time.monotonic()
    while True:
        if server.pid() is None:
            say("drained: no TorchServe runs from this work folder")
            return True
        try:
            load: Load | None = measure(server, models, log)
            answered_at = time.monotonic()
        except (requests.RequestException, ValueError, KeyError, IndexError) as exc:
            say(f"cannot measure the load: {type(exc).__name__}")
            load = None
        now = time.monotonic()
        if now - answered_at > UNANSWERED_S:  # hung (a liveness restart): nothing to wait for
            say(f"TorchServe has not answered for {UNANSWERED_S:g} s: giving up the drain")
            return False
        if load is not None and load.in_flight == 0:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= settle:
                say(f"drained: {load.accepted} predictions accepted, all answered")
                return True
        else:
            quiet_since = None
        if now > deadline and (quiet_since is None or now > deadline + settle):
            # (quiet at the deadline: the settle time still runs, once)
            say(f"drain timed out after {timeout:g} s with {load} still held")
            return False
        time.sleep(poll)
