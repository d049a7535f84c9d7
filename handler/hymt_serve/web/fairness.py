"""Fair sharing of TorchServe among the front end's clients.

TorchServe answers 503 as soon as a model's job queue is full, to everyone alike, and a batch
holding one client's hundreds of texts makes every other request in it wait. So the front end
never lets its own calls fill the queue, and never lets one client take the server:

- ``Upstream``: every call this front end makes to TorchServe holds one of a fixed number of
  slots, sized from the model's job queue (``UPSTREAM_SHARE`` of it, the rest left to other
  callers). A call that finds none free waits for one, up to ``wait_s``; then 503 with
  ``Retry-After`` (never TorchServe's own "no worker" text, which is wrong advice here).
- Bulk: a request with more texts than one call takes (a LibreTranslate or DeepL list) is sent
  by ``fan_out`` in chunks of at most ``BULK_CHUNK`` texts, its calls marked bulk. Bulk calls
  have a gate of their own in ``Upstream``: up to ``BULK_ALONE`` of them in flight once no
  other call has been for ``QUIET_S``, and ``BULK_SHARED`` (two) while others come. A
  huge request runs at the server's pace on an idle server and takes longer on a busy one; it
  never takes the batch from others. Each request also has at most ``window`` chunks in flight,
  and a chunk that TorchServe refuses as busy is sent again (``BUSY_RETRIES`` times, backing
  off).
- ``KeyLimits``: each client key has at most ``per_key`` requests in progress; more get 429 at
  once. (Without keys, on loopback, the front end cannot tell its clients apart: the slots above
  still bound them all.)

:class:`Busy` carries the status, the message and the seconds to wait; the routes turn it into
their API's error shape.

Everything here runs on the front end's one event loop: a call waiting for a slot is a
suspended coroutine, not a thread, and the counts need no lock (they change between awaits
only). ``Upstream.release`` and ``KeyLimits.hold`` never await, so a cancelled stream gives its
slot back in a ``finally`` whatever cancelled it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any, Protocol

Answer = tuple[int, dict[str, Any]]  # (HTTP status, JSON object)


class Post(Protocol):
    """A call of ``model``'s predictions with ``body`` (``bulk``: one chunk of a fan-out)."""

    async def __call__(self, model: str, body: dict[str, Any], *, bulk: bool = False) -> Answer: ...


DEFAULT_QUEUE = 100  # TorchServe's job_queue_size when the model does not say
UPSTREAM_SHARE = 0.75
WINDOW = 8
BULK_CHUNK = 16
BULK_ALONE = 8
BULK_SHARED = 2
PER_KEY = 32
WAIT_S = 60.0
QUIET_S = 1.0  # no other call for this long: bulk may fill up to BULK_ALONE
BULK_WAIT_S = 600.0  # a bulk chunk waits its turn behind others' (up to this, then 503)
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
    then: ``DEFAULT_QUEUE`` meanwhile, asked again ``ASK_EVERY_S`` later)."""

    def __init__(
        self,
        queue_size: Callable[[], Awaitable[int | None]] | None = None,
        wait_s: float = WAIT_S,
    ) -> None:
        self._queue_size = queue_size
        self._limit: int | None = None
        self._asked = -ASK_EVERY_S
        self._asking: asyncio.Future[int | None] | None = None  # the question in flight
        self._in_flight = 0
        self._bulk = 0  # of them bulk calls
        self._other_seen = -QUIET_S  # when a call that is not bulk last ended
        self._waiting = 0
        self._wait_s = wait_s
        # Set (and replaced) at each release: every waiter looks again. Made on the loop.
        self._freed: asyncio.Event | None = None

    async def limit(self) -> int:
        """``UPSTREAM_SHARE`` of the model's job queue (of ``DEFAULT_QUEUE`` until known). While
        TorchServe is being asked, every caller waits for that one answer."""
        if self._limit is not None:
            return self._limit
        now = time.monotonic()
        due = now - self._asked >= ASK_EVERY_S
        if self._asking is None and self._queue_size is not None and due:
            self._asked = now
            self._asking = asyncio.ensure_future(self._queue_size())
        if self._asking is not None:
            asking = self._asking
            try:  # shielded: one caller cancelled leaves the answer to the others
                known = await asyncio.shield(asking)
            finally:
                if asking.done() and self._asking is asking:
                    self._asking = None
            if known is not None and known > 0:
                self._limit = max(1, int(known * UPSTREAM_SHARE))
                return self._limit
        return max(1, int(DEFAULT_QUEUE * UPSTREAM_SHARE))

    async def acquire(self, bulk: bool = False) -> None:
        """Take a slot (a ``bulk`` one through the bulk gate too), waiting up to ``wait_s``
        (``BULK_WAIT_S`` for bulk) for one; Busy(503) when none came."""
        limit = await self.limit()
        deadline = time.monotonic() + (BULK_WAIT_S if bulk else self._wait_s)
        self._waiting += 1
        try:
            while self._in_flight >= limit or (bulk and not self._bulk_may_go()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(
                        503,
                        f"the translation server is busy ({self._in_flight} calls in "
                        f"progress, {self._waiting} waiting): retry in a moment",
                    )
                # bulk looks again after QUIET_S: the others may have gone quiet meanwhile
                await self._released(min(left, QUIET_S) if bulk else left)
            self._in_flight += 1
            self._bulk += bulk
        finally:
            self._waiting -= 1

    async def _released(self, timeout: float) -> None:
        """Until the next release, or ``timeout`` seconds."""
        if self._freed is None:
            self._freed = asyncio.Event()
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._freed.wait(), timeout)

    def _bulk_may_go(self) -> bool:
        """One more bulk call: up to BULK_ALONE while no other call has been in flight for
        ``QUIET_S``, else BULK_SHARED."""
        alone = self._in_flight == self._bulk and time.monotonic() - self._other_seen >= QUIET_S
        return self._bulk < (BULK_ALONE if alone else BULK_SHARED)

    def release(self, bulk: bool = False) -> None:
        """Give a slot back (never awaits: safe in a ``finally`` of a cancelled task)."""
        self._in_flight -= 1
        self._bulk -= bulk
        if not bulk:
            self._other_seen = time.monotonic()
        if self._freed is not None:  # waiters differ in what they wait for: wake them all
            self._freed.set()
            self._freed = None

    @asynccontextmanager
    async def slot(self, bulk: bool = False) -> AsyncIterator[None]:
        await self.acquire(bulk)
        try:
            yield
        finally:
            self.release(bulk)

    async def counts(self) -> dict[str, int]:
        return {
            "in_flight": self._in_flight,
            "bulk": self._bulk,
            "waiting": self._waiting,
            "limit": await self.limit(),
        }


class KeyLimits:
    """At most ``per_key`` requests in progress for each client."""

    def __init__(self, per_key: int = PER_KEY) -> None:
        self.per_key = per_key
        self._held: dict[str, int] = {}

    @contextmanager
    def hold(self, client: str) -> Iterator[None]:
        """Count one request of ``client`` while the block runs; Busy(429) past the limit."""
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
            left = self._held[client] - 1
            if left:
                self._held[client] = left
            else:
                del self._held[client]


async def fan_out(
    post: Post,
    model: str,
    bodies: Sequence[dict[str, Any]],
    window: int = WINDOW,
    bulk: bool | None = None,
) -> list[Answer]:
    """The answers to ``bodies`` in order, at most ``window`` in flight, sent as ``bulk``
    calls (by default when there are several). After the first answer that is not a 200 (or
    a call that raised) the rest are not sent: the list ends at that answer, or the exception
    of the first call that raised is raised."""
    marked = len(bodies) > 1 if bulk is None else bulk
    results: list[Answer | Exception | None] = [None] * len(bodies)
    queue = iter(range(len(bodies)))
    failed = False

    async def sender() -> None:
        nonlocal failed
        for index in queue:  # shared: each index goes to one sender
            if failed:
                return
            try:
                answer = await post_patiently(post, model, bodies[index], bulk=marked)
            except Exception as error:  # raised below, in order
                results[index], failed = error, True
                return
            results[index] = answer
            failed = failed or answer[0] != 200

    await asyncio.gather(*(sender() for _ in range(max(1, min(window, len(bodies))))))
    answers: list[Answer] = []
    for result in results:
        if result is None:
            break
        if isinstance(result, Exception):
            raise result
        answers.append(result)
        if result[0] != 200:
            break
    return answers


async def post_patiently(
    post: Post, model: str, body: dict[str, Any], *, bulk: bool = False
) -> Answer:
    """``post``, sent again (backing off) while TorchServe answers that it is busy."""
    answer = await post(model, body, bulk=bulk)
    for attempt in range(BUSY_RETRIES):
        if answer[0] != 503 or answer[1].get("error_type") not in BUSY_TYPES:
            break
        await asyncio.sleep(BUSY_BACKOFF_S * 2**attempt)
        answer = await post(model, body, bulk=bulk)
    return answer
