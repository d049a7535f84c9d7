"""Schedulers for TorchServe's async mode: requests arrive one by one, the engine batches them.

With ``asyncCommunication: true`` TorchServe hands each request to the handler as soon as it
arrives; the handler submits its rows here and awaits their futures. One thread owns the model:

- :class:`ContinuousBatcher` (the fast engine): rows join the running batch between decode steps
  (prefill into a free KV-cache slot, first token sampled) and leave it when they finish, so a
  short translation never waits for a long one and a free slot is refilled at once. Which rows
  finished is read back every ``SYNC_EVERY`` steps, or at once when a row reaches its length;
  streaming rows get their new tokens at those read-backs. Read-backs are asynchronous (the
  host queues up to ``LOOKAHEAD`` more steps before it waits for one) and admitting a row never
  waits for the GPU, so the GPU is not left idle while the host does its bookkeeping.
- :class:`~hymt_serve.engine.scheduler.GenerateBatcher` (transformers ``generate``, in
  :mod:`.scheduler` with the submission side both share): whatever waits is generated
  together, up to ``max_batch_rows``; streams run one at a time.

:meth:`Scheduler.submit` raises :class:`~hymt_serve.request.errors.Overloaded` when ``max_waiting``
rows already wait for the engine. A failure while serving rows fails their futures only (an
error in a decode step fails the running rows); the thread goes on serving.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hymt_serve.engine.fast import LOOKAHEAD, PREFILL_TOKENS, SYNC_EVERY, FastGenerator
from hymt_serve.engine.model import to_device
from hymt_serve.engine.sampling import SlotSampling, record_tokens, sample_next
from hymt_serve.engine.scheduler import ErrorMap, GenerateBatcher, Job, Scheduler
from hymt_serve.engine.types import FinishReason, GenerationResult, GenerationRow, cut_at_stop

__all__ = ["ADMIT_ROWS", "ADMIT_WAIT_S", "ContinuousBatcher", "GenerateBatcher", "Readback"]

logger = logging.getLogger(__name__)

# A prefill of a few short prompts costs about one decode step (both read all the weights), so
# arrivals gather before they interrupt the running batch: until this many wait, or the first
# has waited this long. An idle engine admits at once.
ADMIT_ROWS = 16
ADMIT_WAIT_S = 0.02


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
        return self.event is None or bool(self.event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


class ContinuousBatcher(Scheduler):
    """Continuous batching over a :class:`FastGenerator`'s cache slots and decode graphs."""

    def __init__(
        self,
        generator: FastGenerator,
        stop_ids: Collection[int],
        result: Callable[[list[int], FinishReason], GenerationResult],
        *,
        max_waiting: int,
        on_error: ErrorMap,
        before_prefill: Callable[[Sequence[GenerationRow]], None] | None = None,
        admit_rows: int = ADMIT_ROWS,
        admit_wait_s: float = ADMIT_WAIT_S,
    ) -> None:
        super().__init__(max_waiting=max_waiting, on_error=on_error, name="hymt-continuous")
        self._admit_rows, self._admit_wait_s = admit_rows, admit_wait_s
        runner = generator.runner
        self._generator, self._runner = generator, runner
        self._result, self._before_prefill = result, before_prefill
        device = runner.tokens.device
        self._device = device
        slots = runner.max_batch_size + 1  # the last one is the runner's scratch slot
        self._free = list(range(runner.max_batch_size - 1, -1, -1))
        self._sampling = SlotSampling(slots, runner.shape.vocab, device)
        self._width = generator.max_seq_len
        self._out = torch.zeros(slots, self._width, dtype=torch.int64, device=device)
        self._generated = torch.zeros(slots, dtype=torch.int64, device=device)
        self._max_new = torch.ones(slots, dtype=torch.int64, device=device)
        self._done = torch.zeros(slots, dtype=torch.bool, device=device)
        self._stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.int64, device=device)
        self._stop = set(stop_ids)
        self._running: list[Job] = []
        self._readback: Readback | None = None
        self._bucket = 0
        self._since_sync = 0
        self._length_due = 0  # steps until the first running row reaches its length
        self._all_due = 0  # steps until every running row has reached its length
        self.stats.update({"steps": 0, "row_steps": 0, "prefills": 0, "prefill_rows": 0})
        self.stats.update({"readbacks": 0, "readback_waits": 0})
        # Host seconds spent admitting (prefill included), stepping and collecting read-backs.
        # (prefill_s: the part of admit_s spent in the prefill call itself.)
        self.stats.update({"admit_s": 0.0, "prefill_s": 0.0, "step_s": 0.0, "sync_s": 0.0})

    def describe(self) -> dict[str, object]:
        steps = self.stats["steps"]
        return {
            "scheduler": "continuous",
            "slots": self._runner.max_batch_size,
            "running": len(self._running),
            "mean_running_rows": round(self.stats["row_steps"] / steps, 2) if steps else 0.0,
            "admit_rows": self._admit_rows,
            "admit_wait_ms": round(self._admit_wait_s * 1000, 1),
            **super().describe(),
        }

    def _check(self, row: GenerationRow) -> None:
        self._generator.check_row(row)

    def _serve(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        with torch.inference_mode():
            while not self._closed.is_set():
                self._take(block=not self._running and not self._waiting)
                try:
                    if self._readback is not None:
                        self._collect()
                    if self._waiting and self._free and self._admit_now():
                        started = time.perf_counter()
                        self._admit()
                        self.stats["admit_s"] += time.perf_counter() - started
                    if self._running:
                        self._step()
                except Exception as error:  # the running rows fail, the thread goes on
                    self._reset(error)
            self._reset(RuntimeError("the scheduler stopped"), log=False)

    def _admit_now(self) -> bool:
        return (
            not self._running
            or len(self._waiting) >= min(self._admit_rows, len(self._free))
            or time.monotonic() - self._waiting[0].arrived >= self._admit_wait_s
        )

    def _admit(self) -> None:
        """Prefill waiting rows into free slots and add them to the running batch."""
        packed, count = 0, 0
        for job in list(self._waiting)[: len(self._free)]:
            packed += len(job.row.prompt_ids)
            if count and packed > PREFILL_TOKENS:
                break
            count += 1
        jobs = self._pop_waiting(count)
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
        runner, count = self._runner, len(self._running)
        try:
            slots = to_device([job.slot for job in jobs], torch.int64, self._device)
            lengths = to_device(
                [len(job.row.prompt_ids) for job in jobs], torch.int64, self._device
            )
            self._bucket = runner.load(
                torch.cat([runner.tokens[:count], tokens]),
                torch.cat([runner.positions[:count], lengths]),
                torch.cat([runner.slots[:count], slots]),
            )
        except Exception as error:  # these rows fail here; the running ones in _serve
            self._free.extend(job.slot for job in jobs)
            self._fail(jobs, error)
            raise
        self._running.extend(jobs)
        self._membership_changed()
        self.stats["prefills"] += 1
        self.stats["prefill_rows"] += len(jobs)

    def _prefill_one_by_one(self, jobs: Sequence[Job]) -> tuple[list[Job], Tensor]:
        admitted, tokens = [], []
        for job in jobs:
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
        slot_list = [job.slot for job in jobs]
        slots = to_device(slot_list, torch.int64, self._device)
        self._sampling.assign(slot_list, rows)
        started = time.perf_counter()
        logits = self._generator.prefill([row.prompt_ids for row in rows], slot_list)
        self.stats["prefill_s"] += time.perf_counter() - started
        batch = self._sampling.batch(slot_list, slots)
        tokens = sample_next(logits, batch, slots)
        record_tokens(batch, slots, tokens)
        max_new = to_device([row.max_new_tokens for row in rows], torch.int64, self._device)
        self._out[slots, 0] = tokens
        self._generated[slots] = 1
        self._max_new[slots] = max_new
        self._done[slots] = torch.isin(tokens, self._stop_ids) | (max_new <= 1)
        for job in jobs:
            job.steps = 1
        return tokens

    def _membership_changed(self) -> None:
        slots = [job.slot for job in self._running]
        self._index = self._runner.slots[: self._bucket].clone()
        self._batch = self._sampling.batch(slots, self._index)
        self._set_length_due()

    def _set_length_due(self) -> None:
        remaining = [job.row.max_new_tokens - job.steps for job in self._running]
        self._length_due, self._all_due = min(remaining), max(remaining)

    def _step(self) -> None:
        started = time.perf_counter()
        runner, index = self._runner, self._index
        logits = runner.step(self._bucket)
        tokens = sample_next(logits, self._batch, index)
        record_tokens(self._batch, index, tokens)
        generated = self._generated[index]
        self._out[index, generated.clamp(max=self._width - 1)] = tokens
        generated = (generated + 1).clamp(max=self._width - 1)
        self._generated[index] = generated
        stopped = torch.isin(tokens, self._stop_ids)
        self._done[index] |= stopped | (generated >= self._max_new[index])
        runner.advance(self._bucket, tokens)
        for job in self._running:
            job.steps += 1
        self._length_due -= 1
        self._all_due -= 1
        self._since_sync += 1
        self.stats["steps"] += 1
        self.stats["row_steps"] += len(self._running)
        if self._readback is not None:
            self._readback.steps_after += 1
        elif self._length_due <= 0 or self._since_sync >= SYNC_EVERY:
            self._start_readback()
        self.stats["step_s"] += time.perf_counter() - started

    def _start_readback(self) -> None:
        """Queue copies of the running rows' progress to the host, behind the queued steps."""
        self._since_sync = 0
        jobs = list(self._running)
        index = self._index[: len(jobs)]
        widest = max(job.steps for job in jobs)
        snapshot = (self._done[index], self._generated[index], self._out[index, :widest])
        done, generated, out = (t.to("cpu", non_blocking=True) for t in snapshot)
        event = None
        if self._device.type == "cuda":
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
        self._readback = Readback(jobs, done, generated, out, event)
        self.stats["readbacks"] += 1

    def _collect(self) -> None:
        """Deliver what the pending read-back shows once it has arrived (waiting for it only
        when the host is ``LOOKAHEAD`` steps past it); finished rows leave the batch."""
        readback = self._readback
        assert readback is not None
        if not readback.ready():
            # More steps help nobody once every row has its length: wait at once then.
            if readback.steps_after < LOOKAHEAD and self._all_due > 0:
                return
            self.stats["readback_waits"] += 1
        started = time.perf_counter()
        readback.wait()
        self._readback = None
        done, generated = readback.done.tolist(), readback.generated.tolist()
        finished: set[int] = set()
        for i, job in enumerate(readback.jobs):
            if done[i] or job.emit is not None:
                count = min(generated[i], job.row.max_new_tokens)
                self._deliver(job, readback.out[i, :count].tolist(), done[i])
            if done[i]:
                finished.add(id(job))
        if finished:
            self._remove(finished)
        if self._running:
            self._set_length_due()
            if self._length_due <= 0:  # a row reached its length after the snapshot
                self._start_readback()
        self.stats["sync_s"] += time.perf_counter() - started

    def _remove(self, finished: set[int]) -> None:
        """Free the finished rows' slots and compact the batch to the others."""
        keep = [i for i, job in enumerate(self._running) if id(job) not in finished]
        self._free.extend(job.slot for job in self._running if id(job) in finished)
        self._running = [self._running[i] for i in keep]
        if self._running:
            self._bucket = self._runner.compact(to_device(keep, torch.int64, self._device))
            self._membership_changed()
        else:
            self._runner.clear()

    def _deliver(self, job: Job, tokens: list[int], finished: bool) -> None:
        visible, finish = cut_at_stop(tokens, self._stop)
        if job.emit is not None and len(visible) > job.sent:
            try:
                job.emit(visible[job.sent :])
            except Exception:  # a failing listener must not stop the batch
                logger.exception("stream listener failed")
            job.sent = len(visible)
        if finished:
            self._finish(job, self._result(visible, finish))

    def _reset(self, error: BaseException, *, log: bool = True) -> None:
        """Fail every running row and empty the batch."""
        jobs, self._running = self._running, []
        self._readback = None
        self._free.extend(job.slot for job in jobs)
        self._runner.clear()
        self._fail(jobs, error, log=log)
