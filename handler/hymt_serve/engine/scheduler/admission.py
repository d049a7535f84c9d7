"""How rows get into the running batch, a part of
:class:`~hymt_serve.engine.scheduler.loop.Scheduler` (its attributes below).

With a :class:`~hymt_serve.engine.runners.protocol.MixingRunner` (the fast engine) admission
rides in the decode step: each pass takes prompt chunks within a token budget, decode first (the
running rows always step), rows part-way through a long prompt before waiting ones; a row whose
prompt is complete samples its first token and joins the batch. A failing pass fails the rows
whose chunks it carried; the running rows step again next round.

Otherwise (transformers' runner, or ``mixed_tokens: 0``) waiting rows are prefilled between
decode steps, gathered first (``ADMIT_ROWS`` or ``ADMIT_WAIT_S``) since a prefill stalls the
batch; a failing prefill is retried row by row so that only the culprits fail.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import InvalidStateError
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hymt_serve.core.errors import as_engine_error
from hymt_serve.core.types import GenerationRow
from hymt_serve.engine.runners.inputs import to_device
from hymt_serve.engine.runners.protocol import MixingRunner, Runner
from hymt_serve.engine.scheduler.jobs import Job, WaitingLine
from hymt_serve.engine.scheduler.slots import SlotState

logger = logging.getLogger(__name__)


class Admission:
    """Admission for :class:`~hymt_serve.engine.scheduler.loop.Scheduler`."""

    _runner: Runner
    _mixer: MixingRunner | None
    _state: SlotState
    _waiting: WaitingLine
    _free: list[int]
    _running: list[Job]
    _prefilling: list[Job]
    _before_prefill: Callable[[Sequence[GenerationRow]], None] | None
    _admit_rows: int
    _admit_wait_s: float
    _decoded: int
    _device: torch.device
    stats: dict[str, float]

    if TYPE_CHECKING:

        def _stepped(self, logits: Tensor) -> None: ...

        def _membership_changed(self) -> None: ...

    def _admit_now(self) -> bool:
        return self._runner.can_admit(len(self._running)) and (
            not self._running
            or len(self._waiting) >= min(self._admit_rows, len(self._free))
            or time.monotonic() - self._waiting.first_arrival() >= self._admit_wait_s
        )

    def _admit(self) -> None:
        """Prefill waiting rows into free slots and add them to the running batch."""
        packed, count, budget = 0, 0, self._runner.prefill_budget
        for job in itertools.islice(self._waiting, len(self._free)):
            packed += len(job.row.prompt_ids)
            if count and budget is not None and packed > budget:
                break
            count += 1
        jobs = self._waiting.pop(count)
        if not jobs:
            return
        for job in jobs:
            job.slot = self._free.pop()
        try:
            tokens = self._prefill(jobs)
        except Exception:  # no other slot was written; retry alone, to fail only the culprits
            jobs, tokens = self._prefill_one_by_one(jobs)
            if not jobs:
                return
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += sum(len(job.row.prompt_ids) for job in jobs)
        self._join(jobs, tokens)

    def _join(self, jobs: Sequence[Job], tokens: Tensor) -> None:
        """Rows whose prompts are complete (first tokens sampled) join the running batch."""
        for job in jobs:
            job.joined = self._decoded
        try:
            self._runner.add(
                tokens,
                to_device([len(job.row.prompt_ids) for job in jobs], torch.int64, self._device),
                to_device([job.slot for job in jobs], torch.int64, self._device),
                len(self._running),
            )
        except Exception as error:  # these rows fail here; the running ones in step()
            self._free.extend(job.slot for job in jobs)
            self._fail(jobs, error)
            raise
        self._running.extend(jobs)
        self._membership_changed()
        self.stats["prefill_rows"] += len(jobs)

    # Mixed steps (a MixingRunner).

    def _plan(self, mixer: MixingRunner) -> list[tuple[Job, int]]:
        """This pass's prompt chunks, as (job, end): rows part-way through their prompts
        first, in order, then waiting rows while free slots and the token budget last. Beside
        running rows a pass also stays within the runner's keys and rows (a chunk with more
        keys alone runs anyway); without, it takes the prefill's larger budget."""
        tokens = mixer.mixed_tokens
        keys, rows = mixer.mixed_keys, mixer.mixed_rows
        if not self._running:
            tokens, keys = max(mixer.prefill_budget or 0, tokens), 1 << 62
            rows = mixer.max_batch_size
        chunks: list[tuple[Job, int]] = []
        going = iter(list(self._prefilling))
        while tokens > 0 and len(chunks) < rows:
            job = next(going, None)
            if job is None:
                if not (self._free and self._waiting):
                    break
                job = self._begin(mixer)
                if job is None:
                    continue
            end = min(len(job.row.prompt_ids), job.done + tokens)
            if chunks and end > keys:
                break
            tokens, keys = tokens - (end - job.done), keys - end
            chunks.append((job, end))
        return chunks

    def _begin(self, mixer: MixingRunner) -> Job | None:
        """The first waiting row takes a free slot (with its kept prefix, if any); None when
        it gave up waiting or failed its pre-prefill check (it fails alone)."""
        jobs = self._waiting.pop(1)
        if not jobs:
            return None
        job = jobs[0]
        try:
            if self._before_prefill is not None:
                self._before_prefill([job.row])
        except Exception as error:
            self._fail([job], error)
            return None
        job.slot = self._free.pop()
        job.done = job.reused = mixer.begin(job.row.prompt_ids, job.slot)
        self._prefilling.append(job)
        return job

    def _mixed(self, chunks: Sequence[tuple[Job, int]], decode: bool) -> None:
        """One pass: the running rows' decode step (when ``decode``) with these chunks; rows
        whose prompts are complete sample their first token and join the batch."""
        assert self._mixer is not None
        started = time.perf_counter()
        jobs = [job for job, _ in chunks]
        prompts = [job.row.prompt_ids[:end] for job, end in chunks]
        slots = [job.slot for job in jobs]
        try:
            step, logits = self._mixer.mixed_step(
                prompts, slots, [job.done for job in jobs], decode=decode
            )
        except Exception as error:  # the chunks' rows fail; the running rows step again
            self._drop_prefilling(jobs, error)
            return
        self.stats["prefill_s"] += time.perf_counter() - started
        if step is not None:
            self.stats["mixed_steps"] += 1
            self._stepped(step)
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += sum(end - job.done for job, end in chunks)
        complete = [i for i, (job, end) in enumerate(chunks) if end == len(job.row.prompt_ids)]
        for job, end in chunks:
            job.done = end
        if complete:
            joining = [jobs[i] for i in complete]
            self._prefilling = [job for job in self._prefilling if job not in joining]
            if len(complete) < len(jobs):
                logits = logits[to_device(complete, torch.int64, self._device)]
            rows = [job.row for job in joining]
            self._mixer.finish(
                [row.prompt_ids for row in rows], [job.slot for job in joining],
                [job.reused for job in joining],
            )  # fmt: skip
            self._join(joining, self._state.start([job.slot for job in joining], rows, logits))
        self.stats["admit_s"] += time.perf_counter() - started

    def _drop_prefilling(self, jobs: Sequence[Job], error: BaseException) -> None:
        """These rows part-way through their prompts fail and free their slots."""
        self._prefilling = [job for job in self._prefilling if job not in jobs]
        self._free.extend(job.slot for job in jobs)
        self._fail(jobs, error)

    # Prefills between steps (a runner that does not mix).

    def _prefill_one_by_one(self, jobs: Sequence[Job]) -> tuple[list[Job], Tensor]:
        """Prefill ``jobs`` alone each; a row whose prefill fails fails alone. A runner that
        takes one prefill per batch (transformers') admits the first that succeeds; the rest
        wait again, in order."""
        admitted: list[Job] = []
        tokens: list[Tensor] = []
        for position, job in enumerate(jobs):
            if admitted and not self._runner.can_admit(len(self._running) + len(admitted)):
                self._free.extend(job.slot for job in jobs[position:])
                self._waiting.put_back(jobs[position:])
                break
            try:
                tokens.append(self._prefill([job]))
                admitted.append(job)
            except Exception as error:
                self._free.append(job.slot)
                self._fail([job], error)
        return admitted, torch.cat(tokens) if tokens else torch.empty(0)

    def _prefill(self, jobs: Sequence[Job]) -> Tensor:
        rows = [job.row for job in jobs]
        if self._before_prefill is not None:
            self._before_prefill(rows)
        slots = [job.slot for job in jobs]
        started = time.perf_counter()
        logits = self._runner.prefill([row.prompt_ids for row in rows], slots)
        self.stats["prefill_s"] += time.perf_counter() - started
        return self._state.start(slots, rows, logits)

    def _fail(self, jobs: Sequence[Job], error: BaseException, *, log: bool = True) -> None:
        if not jobs:
            return
        mapped = as_engine_error(error, rows=len(jobs))
        if log:
            logger.warning("%d rows failed: %s", len(jobs), type(mapped).__name__)
        if isinstance(error, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
        self.stats["failed"] += len(jobs)  # the stepping thread's counter (no lock needed)
        for job in jobs:
            with contextlib.suppress(InvalidStateError):
                job.future.set_exception(mapped)
