"""What the scheduler asks of a runner: the fast engine's
(:class:`~hymt_serve.engine.runners.fast.FastRunner`) or transformers' forward
(:class:`~hymt_serve.engine.runners.hf_forward.HFRunner`), and what the fast engine's can do
besides (mixed steps, recorded greedy steps)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor


class Context(NamedTuple):
    """The most prompt + max_new_tokens tokens one row may have (0: no bound), and what sets
    that bound (for the client's error message)."""

    tokens: int
    source: str


class Runner(Protocol):
    """What the scheduler drives: :class:`~hymt_serve.engine.runners.fast.FastRunner`, or
    transformers' forward (:class:`~hymt_serve.engine.runners.hf_forward.HFRunner`). Rows
    live in slots ``0..max_batch_size-1``; the *batch* is the rows being decoded, in batch
    positions."""

    max_batch_size: int
    device: torch.device
    # Prompt tokens admitted at once (a prefill stalls the running batch); None: no bound.
    prefill_budget: int | None
    # Prompt tokens that may ride in one decode step (:class:`MixingRunner`); 0: none, rows
    # join between steps through prefill().
    mixed_tokens: int

    @property
    def vocab(self) -> int: ...

    @property
    def context(self) -> Context:
        """What one row may hold; the scheduler checks each row against it when it is
        submitted."""

    def can_admit(self, running: int) -> bool:
        """Whether new rows may join a batch of ``running`` rows now."""

    def prefill(self, prompts: Sequence[Sequence[int]], slots: Sequence[int]) -> Tensor:
        """Run the prompts into their slots' caches; fp32 logits after each ``[R, V]``."""

    def add(self, tokens: Tensor, lengths: Tensor, slots: Tensor, running: int) -> None:
        """Append just-prefilled rows (first tokens, prompt lengths, slots) to the batch."""

    def keep(self, keep: Tensor) -> None:
        """Keep only these batch positions, in order."""

    def clear(self) -> None:
        """Empty the batch."""

    def batch_slots(self) -> Tensor:
        """The slot of each batch position (padding positions: the slot past the last)."""

    def step(self) -> Tensor:
        """One decode step of the batch; fp32 logits per batch position ``[B, V]``."""

    def advance(self, next_tokens: Tensor) -> None:
        """Feed each batch position its sampled token for the next step."""

    def describe(self) -> dict[str, object]:
        """JSON-ready facts (device, sizes, kernels, timings)."""


@runtime_checkable
class MixingRunner(Runner, Protocol):
    """A runner whose decode steps can carry prompt chunks (the fast engine's)."""

    # A pass beside running rows is fast (graphed) within these: the keys its chunks attend
    # to (each chunk's end) and its prompts.
    mixed_keys: int
    mixed_rows: int

    def begin(self, prompt: Sequence[int], slot: int) -> int:
        """The row starts in ``slot``: how many leading prompt tokens the slot holds already."""

    def mixed_step(
        self,
        prompts: Sequence[Sequence[int]],
        slots: Sequence[int],
        starts: Sequence[int],
        *,
        decode: bool,
    ) -> tuple[Tensor | None, Tensor]:
        """The batch's decode step (when ``decode``) with each prompt computed from its start
        to its end; the step's logits ``[B, V]`` (or None) and those after each prompt."""

    def finish(
        self, prompts: Sequence[Sequence[int]], slots: Sequence[int], reused: Sequence[int]
    ) -> None:
        """These rows' prompts are complete in their slots."""


# The scheduler's greedy recording of a decode step: (logits [B, V], the batch's slots [B]) ->
# the next tokens [B]; device work only.
Recorder = Callable[[Tensor, Tensor], Tensor]


@runtime_checkable
class RecordingRunner(Runner, Protocol):
    """A runner whose decode step can also record its greedy tokens and feed them back in
    (the fast engine's)."""

    def record_with(self, recorder: Recorder) -> None:
        """Greedy steps record with ``recorder`` from now on (CUDA: captured with the step)."""

    def recorded_step(self) -> None:
        """One decode step of a batch of greedy rows, recorded and fed back: :meth:`step`,
        ``recorder(logits, slots)`` and :meth:`advance` in one."""
