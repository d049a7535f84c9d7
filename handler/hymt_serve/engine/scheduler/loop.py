"""The one scheduler: admission, decode steps and finishing, for every way the engine is used.

Rows arrive through :meth:`Scheduler.submit` (thread-safe) and leave through their futures.
:meth:`Scheduler.step` is one round: take arrivals, collect a read-back, admit waiting rows,
run one decode step. With the fast engine (a :class:`MixingRunner`) admitting is part of the
step: chunks of the new rows' prompts ride in the decode step's pass, within a token budget,
decode first (rows part-way through a long prompt go on, then waiting rows take free slots);
a row joins the batch when its prompt is complete. Otherwise waiting rows are prefilled
between steps, gathered first since the prefill stalls the batch. Who calls it:

- offline and TorchServe batch mode: the caller submits its rows, then :meth:`Scheduler.run`
  steps on its own thread until their futures are done;
- TorchServe async mode: :meth:`Scheduler.start` runs rounds on a serving thread, rows join the
  running batch between decode steps and leave it when they finish (continuous batching).

Which rows finished is read back after every step, one read-back in flight at a time;
streaming rows get their new tokens at those read-backs, and a row that samples a stop token
keeps its slot until then. A row with stop strings has its new tokens' text searched at each
read-back too (:mod:`~hymt_serve.engine.scheduler.stops`) and leaves the batch once it holds
one. Read-backs are asynchronous (the host queues up to ``LOOKAHEAD``
more steps before it waits for one) and admitting never waits for the device, so the GPU is
not left idle while the host does its bookkeeping. A row that reaches its length (which the
host knows) leaves the batch as soon as the read-back that holds its last token is queued.
The runner (:class:`Runner`) owns the cache and the forward;
:class:`~hymt_serve.engine.scheduler.slots.SlotState` samples and records. A failure fails the
rows it touched (as :func:`~hymt_serve.core.errors.as_engine_error` says); the scheduler goes
on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import wait as wait_all
from typing import Any

import torch
from torch import Tensor

from hymt_serve.core.errors import ContextTooLong, RowRejected
from hymt_serve.core.types import (
    FinishReason,
    GenerationResult,
    GenerationRow,
    OnTokens,
    cut_at_stop,
)
from hymt_serve.engine.runners.fast import STEP_HEADROOM
from hymt_serve.engine.runners.inputs import to_device
from hymt_serve.engine.runners.protocol import MixingRunner, RecordingRunner, Runner
from hymt_serve.engine.scheduler.admission import Admission
from hymt_serve.engine.scheduler.jobs import Job, Readback, WaitingLine
from hymt_serve.engine.scheduler.slots import SlotState
from hymt_serve.engine.scheduler.stops import Decode, StopWatch

logger = logging.getLogger(__name__)

SYNC_EVERY = 1  # decode steps between read-backs of the running rows' progress
# Decode steps the host may queue past a read-back before it waits for it. One, not two: a
# finished row leaves a step sooner, and the host's bookkeeping still overlaps the queued step.
LOOKAHEAD = 1
# A row keeps stepping until the host learns that it finished: the runner's headroom covers it.
assert SYNC_EVERY + 2 * LOOKAHEAD < STEP_HEADROOM
# A prefill of a few short prompts costs about one decode step (both read all the weights), so
# arrivals gather before they interrupt the running batch: until this many wait, or the first
# has waited this long. An idle engine admits at once.
ADMIT_ROWS = 16
ADMIT_WAIT_S = 0.02
# What describe() counts; recorded_steps: decode steps of greedy batches that recorded their
# tokens in the runner's step; prefills: passes that carried prompt tokens (mixed steps: those
# computed, without kept prefixes, in prefill_tokens); *_s: host seconds admitting (prefill_s:
# its runner calls), stepping and collecting read-backs; stop_strings: rows a stop string ended.
COUNTERS = (
    *("submitted", "rejected", "finished", "failed", "steps", "recorded_steps", "row_steps"),
    "prefills",
    *("prefill_rows", "prefill_tokens", "mixed_steps", "readbacks", "readback_waits"),
    *("admit_s", "prefill_s", "step_s", "sync_s", "stop_strings"),
)


ResultOf = Callable[[list[int], FinishReason], GenerationResult]


class Scheduler(Admission):
    """Admission, steps and finishing over one runner's cache slots. ``decode`` (token ids to
    text) lets rows' stop strings end them; without it rows run to a stop token or their
    length."""

    def __init__(
        self,
        runner: Runner,
        stop_ids: Collection[int],
        result: ResultOf,
        *,
        max_seq_len: int,
        max_waiting: int | None = None,
        before_prefill: Callable[[Sequence[GenerationRow]], None] | None = None,
        admit_rows: int = ADMIT_ROWS,
        admit_wait_s: float = ADMIT_WAIT_S,
        decode: Decode | None = None,
    ) -> None:
        self._runner, self._result, self._before_prefill = runner, result, before_prefill
        self._text_of = decode  # token ids to text, for stop strings
        self._admit_rows, self._admit_wait_s = admit_rows, admit_wait_s
        self._device = runner.device
        self._stop = set(stop_ids)
        self._state = SlotState(
            runner.max_batch_size + 1, max_seq_len, runner.vocab, stop_ids, runner.device
        )
        self._free = list(range(runner.max_batch_size - 1, -1, -1))
        self.stats: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._waiting = WaitingLine(max_waiting, self.stats)
        self._running: list[Job] = []
        self._prefilling: list[Job] = []  # rows with a slot, part of their prompt computed
        self._mixer = runner if isinstance(runner, MixingRunner) and runner.mixed_tokens else None
        # Greedy batches' decode steps record their tokens in the runner's step (one graph).
        self._recorder = runner if isinstance(runner, RecordingRunner) else None
        if self._recorder is not None:
            self._recorder.record_with(self._state.record_greedy)
        self._readback: Readback | None = None
        self._decoded = 0  # decode steps run so far (a running job has 1 + this - joined tokens)
        self._since_sync = 0
        self._length_due = 0  # steps until the first running row reaches its length
        self._all_due = 0  # steps until every running row has reached its length
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    # The submission side (any thread).

    def submit(
        self, row: GenerationRow, on_tokens: OnTokens | None = None
    ) -> Future[GenerationResult]:
        """Queue ``row``; its future gets the result. ``on_tokens`` (called on the thread that
        steps) gets new token ids as they are known. Raises RowRejected or ContextTooLong for
        a row the engine cannot take, QueueFull when too many rows wait already."""
        if not row.prompt_ids or row.max_new_tokens < 1:
            raise RowRejected("a row needs at least one prompt token and max_new_tokens >= 1")
        context, total = self._runner.context, len(row.prompt_ids) + row.max_new_tokens
        if context.tokens and total > context.tokens:
            raise ContextTooLong(
                f"prompt + max_new_tokens is {total} tokens",
                allowed=f"at most {context.tokens} ({context.source})",
                field="max_new_tokens",
            )
        watch = StopWatch(row.stop, self._text_of) if row.stop and self._text_of else None
        job = Job(row, Future(), on_tokens, watch=watch)
        self._waiting.put(job)
        return job.future

    def run(self, futures: Sequence[Future[Any]]) -> None:
        """Return once every future is done: step on this thread, or wait for the serving
        thread when :meth:`start` ran."""
        if self._thread is not None:
            wait_all(futures)
            return
        with torch.inference_mode():
            while not all(future.done() for future in futures):
                if not self.step() and not all(future.done() for future in futures):
                    raise RuntimeError("the scheduler is idle with rows unfinished")

    def start(self) -> None:
        """Serve on a thread of its own from now on (TorchServe's async mode)."""
        self._thread = threading.Thread(target=self._serve, name="hymt-scheduler", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the serving thread; rows still waiting or running fail."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def describe(self) -> dict[str, object]:
        steps = self.stats["steps"]
        return {
            "slots": self._runner.max_batch_size,
            "running": len(self._running),
            "waiting": self._waiting.pending,
            "max_waiting": self._waiting.max_waiting,
            "mean_running_rows": round(self.stats["row_steps"] / steps, 2) if steps else 0.0,
            "prefilling": len(self._prefilling),
            "mixed_tokens": self._mixer.mixed_tokens if self._mixer is not None else 0,
            "admit_rows": self._admit_rows,
            "admit_wait_ms": round(self._admit_wait_s * 1000, 1),
            "sync_every": SYNC_EVERY,
            **{k: round(v, 2) for k, v in self.stats.items()},
        }

    # One round (the stepping thread only).

    def step(self, *, block: bool = False) -> bool:
        """Take arrivals (waiting up to a moment for one when ``block`` and idle), collect a
        read-back, admit, decode one step. Returns whether rows still run or wait (rows that
        finishing rows' callbacks submitted meanwhile included)."""
        idle = not (self._running or self._waiting or self._prefilling or self._readback)
        self._waiting.take(block=block and idle)
        try:
            if self._readback is not None:
                self._collect()
                self._retire()
            if self._mixer is None and self._waiting and self._free and self._admit_now():
                started = time.perf_counter()
                self._admit()
                self.stats["admit_s"] += time.perf_counter() - started
            decode = bool(self._running) and self._all_due > 0
            chunks = self._plan(self._mixer) if self._mixer is not None else []
            if chunks:
                self._mixed(chunks, decode)
            elif decode:
                self._decode()
            if self._running and self._all_due <= 0 and self._readback is None:
                self._start_readback()  # all at their length: collect
            self._retire()
        except Exception as error:  # the running rows fail, the scheduler goes on
            self._reset(error)
        return bool(self._running or self._prefilling or self._waiting.pending or self._readback)

    def _serve(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        # The clean-up too runs in inference mode: clearing the runner's batch writes to its
        # inference tensors (outside, that raised and left the waiting rows' futures unset).
        with torch.inference_mode():
            try:
                while not self._closed.is_set():
                    self.step(block=True)
            finally:
                self._closed.set()
                stopped = RuntimeError("the scheduler stopped")
                self._reset(stopped, log=False)
                self._fail(self._waiting.drain(), stopped, log=False)

    def _membership_changed(self) -> None:
        self._state.set_batch([job.slot for job in self._running], self._runner.batch_slots())
        self._set_length_due()

    def _set_length_due(self) -> None:
        remaining = [job.row.max_new_tokens - self._tokens_of(job) for job in self._running]
        self._length_due, self._all_due = min(remaining), max(remaining)

    def _tokens_of(self, job: Job) -> int:
        """Tokens a running job has generated (the prefill's one, then one per decode step)."""
        return 1 + self._decoded - job.joined

    def _decode(self) -> None:
        started = time.perf_counter()
        if self._recorder is not None and self._state.greedy_batch:
            self._recorder.recorded_step()
            self.stats["recorded_steps"] += 1
            self._counted()
        else:
            self._stepped(self._runner.step())
        self.stats["step_s"] += time.perf_counter() - started

    def _stepped(self, logits: Tensor) -> None:
        """Sample and record a decode step's tokens and feed them to the next step."""
        self._runner.advance(self._state.record(logits))
        self._counted()

    def _counted(self) -> None:
        """A decode step's tokens are recorded: count it, and read back when one is due."""
        self._decoded += 1
        self._length_due -= 1
        self._all_due -= 1
        self._since_sync += 1
        self.stats["steps"] += 1
        self.stats["row_steps"] += len(self._running)
        if self._readback is not None:
            self._readback.steps_after += 1
        elif self._length_due <= 0 or self._since_sync >= SYNC_EVERY:
            self._start_readback()

    def _start_readback(self) -> None:
        """Queue copies of the running rows' progress to the host, behind the queued steps."""
        self._since_sync = 0
        jobs = list(self._running)
        done, generated, out = self._state.snapshot(
            len(jobs), max(self._tokens_of(job) for job in jobs)
        )
        event = None
        if self._device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self._readback = Readback(jobs, done, generated, out, event)
        self.stats["readbacks"] += 1

    def _collect(self) -> None:
        """Deliver what the pending read-back shows once it has arrived (waiting for it only
        when the host is ``LOOKAHEAD`` steps past it); finished rows leave the batch."""
        readback = self._readback
        assert readback is not None
        if not readback.ready():
            # More steps help nobody once every row has its length, and with no row running a
            # round has nothing to queue unless prompts wait: wait at once then.
            busy = self._all_due > 0 if self._running else self._prefilling or self._waiting
            if readback.steps_after < LOOKAHEAD and busy:
                return
            self.stats["readback_waits"] += 1
        started = time.perf_counter()
        readback.wait()
        self._readback = None
        done, generated = readback.done.tolist(), readback.generated.tolist()
        finished: set[int] = set()
        for i, job in enumerate(readback.jobs):
            count = min(generated[i], job.row.max_new_tokens)
            stop_at = self._watched(job, readback.out[i], count)
            ended = bool(done[i]) or stop_at is not None
            if ended or job.on_tokens is not None:
                tokens = readback.out[i, : stop_at or count].tolist()
                self._deliver(job, tokens, ended, stopped=stop_at is not None)
            if ended:
                finished.add(id(job))
        if finished:
            self._remove(finished)
        if self._running:
            self._set_length_due()
            if self._length_due <= 0:  # a row reached its length after the snapshot
                self._start_readback()
        self.stats["sync_s"] += time.perf_counter() - started

    def _watched(self, job: Job, out: Tensor, count: int) -> int | None:
        """The row's token count up to the end of its first stop string, when its tokens up
        to ``count`` (of ``out``, its read-back) complete one; only the new ones are read."""
        if job.watch is None or count <= job.watch.seen:
            return None
        stop_at = job.watch.push(out[job.watch.seen : count].tolist())
        if stop_at is not None:
            self.stats["stop_strings"] += 1
        return stop_at

    def _retire(self) -> None:
        """Rows at their length in the read-back just queued leave the batch before the next
        step, not when the read-back arrives: its copies come before any later write to their
        slots on the device's stream, so the slots are free at once. The read-back delivers them.
        (A row that sampled a stop token is only known at the read-back.)"""
        readback = self._readback
        if readback is None or readback.steps_after or self._length_due > 0:
            return
        queued = {id(job) for job in readback.jobs}
        at_length = {
            id(job)
            for job in self._running
            if id(job) in queued and self._tokens_of(job) >= job.row.max_new_tokens
        }
        if at_length:
            self._remove(at_length)

    def _remove(self, finished: set[int]) -> None:
        """Free the finished rows' slots and compact the batch to the others (rows that
        :meth:`_retire` took out already are not in it)."""
        keep = [i for i, job in enumerate(self._running) if id(job) not in finished]
        if len(keep) == len(self._running):
            return
        self._free.extend(job.slot for job in self._running if id(job) in finished)
        self._running = [self._running[i] for i in keep]
        if self._running:
            self._runner.keep(to_device(keep, torch.int64, self._device))
            self._membership_changed()
        else:
            self._runner.clear()

    def _deliver(self, job: Job, tokens: list[int], finished: bool, *, stopped: bool) -> None:
        """Stream the row's new visible tokens; a finished row's future gets its result
        ("stop" when a stop token or, ``stopped``, a stop string ended it)."""
        visible, finish = cut_at_stop(tokens, self._stop)
        finish = "stop" if stopped else finish
        if job.on_tokens is not None and len(visible) > job.sent:
            try:
                job.on_tokens(visible[job.sent :])
            except Exception as error:  # a failing listener must not stop the batch
                # Its message may quote streamed text: the type only above DEBUG.
                logger.warning("stream listener failed: %s", type(error).__name__)
                logger.debug("stream listener failure in full", exc_info=error)
            job.sent = len(visible)
        if finished:
            self.stats["finished"] += 1
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
                job.future.set_result(self._result(visible, finish))

    def _reset(self, error: BaseException, *, log: bool = True) -> None:
        """Fail every running row, every row part-way through its prompt and every retired row
        that its read-back had yet to deliver; empty the batch."""
        jobs, self._running = self._running + self._prefilling, []
        self._prefilling = []
        self._free.extend(job.slot for job in jobs)  # retired rows' slots are free already
        if self._readback is not None:
            held = {id(job) for job in jobs}
            jobs += [job for job in self._readback.jobs if id(job) not in held]
            self._readback = None
        self._runner.clear()
        self._fail(jobs, error, log=log)
