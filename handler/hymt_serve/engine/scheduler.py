"""Schedulers for TorchServe's async mode: requests arrive one by one, the engine batches them.

With ``asyncCommunication: true`` TorchServe hands each request to the handler as soon as it
arrives; the handler submits its rows here and awaits their futures. One thread owns the model.
:class:`Scheduler` is the submission side and the serving thread's life, shared by:

- :class:`~hymt_serve.engine.continuous.ContinuousBatcher` (the fast engine): continuous batching over
  KV-cache slots;
- :class:`GenerateBatcher` (transformers ``generate``): whatever waits is generated together,
  up to ``max_batch_rows``; streams run one at a time.

:meth:`Scheduler.submit` raises :class:`~hymt_serve.request.errors.Overloaded` when ``max_waiting``
rows already wait for the engine. A failure while serving rows fails their futures only; the
thread goes on serving.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass

from hymt_serve.engine.types import GenerationResult, GenerationRow
from hymt_serve.request.errors import Overloaded

logger = logging.getLogger(__name__)

Emit = Callable[[list[int]], None]
# An engine's translation of a failure (e.g. torch.OutOfMemoryError -> OutOfMemory (507)).
ErrorMap = Callable[[BaseException, int], BaseException]
IDLE_POLL_S = 0.5


@dataclass(eq=False)
class Job:
    """One row on its way through a scheduler."""

    row: GenerationRow
    future: Future[GenerationResult]
    emit: Emit | None
    arrived: float
    slot: int = -1
    steps: int = 0  # tokens generated so far (host count)
    sent: int = 0  # tokens already passed to ``emit``


class Scheduler:
    """The submission side shared by both schedulers, and the serving thread's life."""

    def __init__(self, *, max_waiting: int, on_error: ErrorMap, name: str) -> None:
        self._max_waiting = max_waiting
        self._on_error = on_error
        self._inbox: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._waiting: deque[Job] = deque()
        self._lock = threading.Lock()
        self._pending = 0  # submitted, not yet taken by the engine
        self._closed = threading.Event()
        self.stats: dict[str, float] = {"submitted": 0, "rejected": 0, "finished": 0, "failed": 0}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, row: GenerationRow, emit: Emit | None = None) -> Future[GenerationResult]:
        """Queue ``row``; its future gets the result. ``emit`` (called on the serving thread)
        gets new token ids as they are known. Raises Overloaded when too many rows wait."""
        self._check(row)
        with self._lock:
            if self._pending >= self._max_waiting:
                self.stats["rejected"] += 1
                raise Overloaded(
                    f"{self._pending} texts already wait for the model",
                    allowed="retry after a short pause, or add workers",
                )
            self._pending += 1
            self.stats["submitted"] += 1
        job = Job(row, Future(), emit, time.monotonic())
        self._inbox.put(job)
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        """Stop the serving thread; rows still waiting fail."""
        self._closed.set()
        self._thread.join(timeout)

    def describe(self) -> dict[str, object]:
        return {
            "waiting": self._pending,
            "max_waiting": self._max_waiting,
            **{k: round(v, 2) for k, v in self.stats.items()},
        }

    def _check(self, row: GenerationRow) -> None:
        """Raise ValueError for a row the engine cannot take."""

    def _run(self) -> None:
        try:
            self._serve()
        except Exception:
            logger.exception("the scheduler thread stopped")
            raise
        finally:
            self._closed.set()
            self._take(block=False)
            self._fail(list(self._waiting), RuntimeError("the scheduler stopped"), log=False)
            self._waiting.clear()

    def _serve(self) -> None:
        raise NotImplementedError

    def _take(self, *, block: bool) -> None:
        """Move submitted jobs to the waiting line (waiting a while for one when ``block``)."""
        if block:
            try:
                self._waiting.append(self._inbox.get(timeout=IDLE_POLL_S))
            except queue.Empty:
                return
        while True:
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _pop_waiting(self, count: int) -> list[Job]:
        """Up to ``count`` waiting jobs, skipping those whose requests gave up already."""
        jobs = [self._waiting.popleft() for _ in range(min(count, len(self._waiting)))]
        with self._lock:
            self._pending -= len(jobs)
        return [job for job in jobs if not job.future.cancelled()]

    def _finish(self, job: Job, result: GenerationResult) -> None:
        self.stats["finished"] += 1
        with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
            job.future.set_result(result)

    def _fail(self, jobs: Sequence[Job], error: BaseException, *, log: bool = True) -> None:
        if not jobs:
            return
        mapped = self._on_error(error, len(jobs))
        if log:
            logger.error("generation failed for %d rows: %r", len(jobs), error)
        with self._lock:
            self.stats["failed"] += len(jobs)
        for job in jobs:
            with contextlib.suppress(InvalidStateError):
                job.future.set_exception(mapped)


class GenerateBatcher(Scheduler):
    """Batches for an engine's ``generate``: what waits goes together, streams alone."""

    def __init__(
        self,
        generate: Callable[[Sequence[GenerationRow]], list[GenerationResult]],
        stream: Callable[[GenerationRow, Emit], GenerationResult],
        *,
        max_rows: int,
        max_waiting: int,
        on_error: ErrorMap,
    ) -> None:
        super().__init__(max_waiting=max_waiting, on_error=on_error, name="hymt-generate")
        self._generate, self._stream, self._max_rows = generate, stream, max_rows

    def describe(self) -> dict[str, object]:
        return {"scheduler": "generate", "max_rows": self._max_rows, **super().describe()}

    def _serve(self) -> None:
        while not self._closed.is_set():
            self._take(block=not self._waiting)
            if not self._waiting:
                continue
            if self._waiting[0].emit is not None:
                for job in self._pop_waiting(1):  # none when its request gave up
                    self._run_stream(job)
                continue
            count = 0
            while count < min(self._max_rows, len(self._waiting)):
                if self._waiting[count].emit is not None:
                    break
                count += 1
            self._run_batch(self._pop_waiting(count))

    def _run_batch(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        try:
            results = self._generate([job.row for job in jobs])
        except Exception as error:
            self._fail(jobs, error)
            return
        for job, result in zip(jobs, results, strict=True):
            self._finish(job, result)

    def _run_stream(self, job: Job) -> None:
        assert job.emit is not None
        try:
            result = self._stream(job.row, job.emit)
        except Exception as error:
            self._fail([job], error)
            return
        self._finish(job, result)
