"""Fair sharing of TorchServe among the front end's clients.

TorchServe answers 503 as soon as a model's job queue is full, to everyone alike. So the front
end never lets its own calls fill it, and never lets one client take all of it:

- ``Upstream``: every call this front end makes to TorchServe holds one of a fixed number of
  slots, sized from the model's job queue (``UPSTREAM_SHARE`` of it, the rest left to other
  callers). A call that finds none free waits for one, up to ``wait_s``; then 503 with
  ``Retry-After`` (never TorchServe's own "no worker" text, which is wrong advice here).
- ``fan_out``: a request with more texts than TorchServe takes at once (a LibreTranslate or
  DeepL list) is sent in chunks, at most ``window`` of them in flight: a huge request takes
  longer instead of taking the queue. A chunk that TorchServe refuses as busy is sent again
  (``BUSY_RETRIES`` times, backing off): the request goes on when others made room.
- ``KeyLimits``: each client key has at most ``per_key`` requests in progress; more get 429 at
  once. (Without keys, on loopback, the front end cannot tell its clients apart: the slots above
  still bound them all.)

:class:`Busy` carries the status, the message and the seconds to wait; the routes turn it into
their API's error shape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

Post = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]  # (model, body) -> answer

DEFAULT_QUEUE = 100  # TorchServe's job_queue_size when the model does not say
UPSTREAM_SHARE = 0.75
WINDOW = 4
PER_KEY = 32
WAIT_S = 60.0
ASK_EVERY_S = 5.0  # how often an unknown queue size is asked again
BUSY_RETRIES = 4
BUSY_BACKOFF_S = 0.25
RETRY_AFTER_S = 2
# 503s that only say "not now": TorchServe's full queue, the engine's own admission limit.
BUSY_TYPES = ("server_busy", "overloaded")


class Busy(Exception):
    """The front end refuses work for now: ``status`` 503 (the server is full) or 429 (this
    client has too much in progress), with a message that says what to do."""

    def __init__(self, status: int, message: str, retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after

    def body(self) -> dict[str, Any]:
        kind = "server_busy" if self.status == 503 else "too_many_requests"
        return {"error": self.message, "error_type": kind}


class Upstream:
    """At most ``limit`` calls to TorchServe in flight from this front end.

    ``queue_size`` answers the model's job queue size once TorchServe tells it (None until
    then: ``DEFAULT_QUEUE`` meanwhile, asked again at the next call)."""

    def __init__(
        self, queue_size: Callable[[], int | None] | None = None, wait_s: float = WAIT_S
    ) -> None:
        self._queue_size = queue_size
        self._limit: int | None = None
        self._asked = -ASK_EVERY_S
        self._in_flight = 0
        self._waiting = 0
        self._wait_s = wait_s
        self._free = threading.Condition()

    @property
    def limit(self) -> int:
        """``UPSTREAM_SHARE`` of the model's job queue (of ``DEFAULT_QUEUE`` until known)."""
        if self._limit is not None:
            return self._limit
        now = time.monotonic()
        if self._queue_size is not None and now - self._asked >= ASK_EVERY_S:
            self._asked = now
            known = self._queue_size()
            if known is not None and known > 0:
                self._limit = max(1, int(known * UPSTREAM_SHARE))
                return self._limit
        return max(1, int(DEFAULT_QUEUE * UPSTREAM_SHARE))

    def acquire(self) -> None:
        """Take a slot, waiting up to ``wait_s`` for one; Busy(503) when none came."""
        limit = self.limit
        deadline = time.monotonic() + self._wait_s
        with self._free:
            self._waiting += 1
            try:
                while self._in_flight >= limit:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise Busy(
                            503,
                            f"the translation server is busy ({self._in_flight} calls in "
                            f"progress, {self._waiting} waiting): retry in a moment",
                        )
                    self._free.wait(left)
                self._in_flight += 1
            finally:
                self._waiting -= 1

    def release(self) -> None:
        with self._free:
            self._in_flight -= 1
            self._free.notify()

    @contextmanager
    def slot(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def counts(self) -> dict[str, int]:
        with self._free:
            return {"in_flight": self._in_flight, "waiting": self._waiting, "limit": self.limit}


class KeyLimits:
    """At most ``per_key`` requests in progress for each client."""

    def __init__(self, per_key: int = PER_KEY) -> None:
        self.per_key = per_key
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, client: str) -> Iterator[None]:
        """Count one request of ``client`` while the block runs; Busy(429) past the limit."""
        with self._lock:
            held = self._held.get(client, 0)
            if held >= self.per_key:
                raise Busy(
                    429,
                    f"this client has {held} requests in progress (at most {self.per_key}): "
                    "wait for one to finish",
                )
            self._held[client] = held + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held[client] - 1
                if left:
                    self._held[client] = left
                else:
                    del self._held[client]


def fan_out(
    post: Post, model: str, bodies: Sequence[dict[str, Any]], window: int = WINDOW
) -> list[tuple[int, dict[str, Any]]]:
    """The answers to ``bodies`` in order, at most ``window`` in flight. After the first
    answer that is not a 200 the rest are not sent: the list ends at that answer."""
    failed = threading.Event()

    def one(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        if failed.is_set():
            return None
        try:
            answer = post_patiently(post, model, body)
        except BaseException:
            failed.set()
            raise
        if answer[0] != 200:
            failed.set()
        return answer

    answers: list[tuple[int, dict[str, Any]]] = []
    with ThreadPoolExecutor(max_workers=max(1, min(window, len(bodies)))) as pool:
        for answer in pool.map(one, bodies):
            if answer is None:
                break
            answers.append(answer)
            if answer[0] != 200:
                break
    return answers


def post_patiently(post: Post, model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``post``, sent again (backing off) while TorchServe answers that it is busy."""
    answer = post(model, body)
    for attempt in range(BUSY_RETRIES):
        if answer[0] != 503 or answer[1].get("error_type") not in BUSY_TYPES:
            break
        time.sleep(BUSY_BACKOFF_S * 2**attempt)
        answer = post(model, body)
    return answer
