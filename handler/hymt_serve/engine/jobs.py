"""A row's way through the scheduler: its :class:`Job`, and the :class:`Readback` that brings
the running rows' progress to the host."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hymt_serve.engine.types import GenerationResult, GenerationRow, OnTokens


@dataclass(eq=False)
class Job:
    """One row on its way through the scheduler."""

    row: GenerationRow
    future: Future[GenerationResult]
    on_tokens: OnTokens | None
    arrived: float = field(default_factory=time.monotonic)
    slot: int = -1
    steps: int = 0  # tokens generated so far (host count)
    sent: int = 0  # tokens already passed to ``on_tokens``


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
