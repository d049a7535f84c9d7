"""A row's way through the scheduler: its :class:`Job`, the :class:`WaitingLine` it joins when
submitted, and the :class:`Readback` that brings the running rows' progress to the host."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hymt_serve.core.errors import QueueFull
from hymt_serve.core.types import GenerationResult, GenerationRow, OnTokens
from hymt_serve.engine.scheduler.stops import StopWatch

IDLE_POLL_S = 0.5  # how long an idle stepping thread waits for an arrival per round


@dataclass(eq=False)
class Job:
    """One row on its way through the scheduler."""

    row: GenerationRow
    future: Future[GenerationResult]
    on_tokens: OnTokens | None
    arrived: float = field(default_factory=time.monotonic)
    slot: int = -1
    done: int = 0  # prompt tokens in its slot's cache (mixed steps prefill in chunks)
    reused: int = 0  # of those, a kept prefix's
    joined: int = 0  # the scheduler's decode-step count when the row was prefilled
    sent: int = 0  # tokens already passed to ``on_tokens``
    watch: StopWatch | None = None  # the row's stop strings against its text, if it has any


class WaitingLine:
    """Rows submitted and not yet admitted: any thread puts, the stepping thread takes.

    Submissions go through a thread-safe inbox; the stepping thread moves them to the line, in
    order. ``stats`` (the scheduler's) counts ``submitted`` and ``rejected``.
    """

    def __init__(self, max_waiting: int | None, stats: dict[str, float]) -> None:
        self.max_waiting = max_waiting
        self._stats = stats
        self._inbox: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._line: deque[Job] = deque()
        self._lock = threading.Lock()
        self.pending = 0  # submitted, not yet admitted (inbox and line)

    def put(self, job: Job) -> None:
        """Any thread. Raises QueueFull when ``max_waiting`` rows wait already."""
        with self._lock:
            if self.max_waiting is not None and self.pending >= self.max_waiting:
                self._stats["rejected"] += 1
                raise QueueFull(
                    f"{self.pending} texts already wait for the model",
                    allowed="retry after a short pause, or add workers",
                )
            self.pending += 1
            self._stats["submitted"] += 1
        self._inbox.put(job)

    def take(self, *, block: bool) -> None:
        """Move submitted jobs to the line (waiting a while for one when ``block``)."""
        if block:
            try:
                self._line.append(self._inbox.get(timeout=IDLE_POLL_S))
            except queue.Empty:
                return
        while True:
            try:
                self._line.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def __len__(self) -> int:
        return len(self._line)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._line)

    def first_arrival(self) -> float:
        return self._line[0].arrived

    def pop(self, count: int) -> list[Job]:
        """Up to ``count`` jobs from the front, skipping those whose requests gave up already."""
        jobs = [self._line.popleft() for _ in range(min(count, len(self._line)))]
        with self._lock:
            self.pending -= len(jobs)
        return [job for job in jobs if not job.future.cancelled()]

    def put_back(self, jobs: Sequence[Job]) -> None:
        """Return popped jobs to the front, in order."""
        with self._lock:
            self.pending += len(jobs)
        self._line.extendleft(reversed(jobs))

    def drain(self) -> list[Job]:
        """Everything still waiting (the scheduler stops)."""
        self.take(block=False)
        return self.pop(len(self._line))


@dataclass(eq=False)
class Readback:
    """A snapshot of the running rows' progress on its way to the host."""

    jobs: list[Job]
    done: Tensor  # [rows] bool
    generated: Tensor  # [rows] tokens generated at the snapshot
    out: Tensor  # [rows, widest] the tokens
    event: torch.cuda.Event | None  # None on the CPU: the copies are already done
    steps_after: int = 0  # decode steps queued since

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
