"""What the engine knows about each cache slot's row, on the device: its generated tokens, how
many, its limit, whether it is done, and its sampling settings.

:meth:`SlotState.start` and :meth:`SlotState.record` are the one sample / record / stop step:
the first token after a prefill and each decode step's tokens go through them. Nothing here
waits for the device; :meth:`SlotState.snapshot` queues copies that the host reads later.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from hymt_serve.core.types import GenerationRow
from hymt_serve.engine.runners.inputs import to_device
from hymt_serve.engine.scheduler.sampling import (
    RowSampling,
    SlotSampling,
    greedy_tokens,
    record_tokens,
    sample_next,
)


class SlotState:
    """Per-slot progress: ``out [slots, width]`` tokens, ``generated``, ``max_new``, ``done``."""

    def __init__(
        self,
        slots: int,
        width: int,
        vocab: int,
        stop_ids: Collection[int],
        device: torch.device,
    ) -> None:
        self.device, self.width = device, width
        self.sampling = SlotSampling(slots, vocab, device)
        self.out = torch.zeros(slots, width, dtype=torch.int64, device=device)
        self.generated = torch.zeros(slots, dtype=torch.int64, device=device)
        self.max_new = torch.ones(slots, dtype=torch.int64, device=device)
        self.done = torch.zeros(slots, dtype=torch.bool, device=device)
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.int64, device=device)
        self._batch: RowSampling | None = None

    def start(self, slots: Sequence[int], rows: Sequence[GenerationRow], logits: Tensor) -> Tensor:
        """Give ``slots`` their rows and sample each row's first token from its prefill
        ``logits [R, V]``; returns the tokens ``[R]``."""
        self.sampling.assign(slots, rows)
        index = to_device(list(slots), torch.int64, self.device)
        batch = self.sampling.batch(slots, index)
        tokens = sample_next(logits, batch, index)  # positions 0: each row's first token
        record_tokens(batch, index, tokens)
        max_new = to_device([row.max_new_tokens for row in rows], torch.int64, self.device)
        self.out[index, 0] = tokens
        self.generated.index_fill_(0, index, 1)  # t[index] = 1 would wait for the device
        self.max_new[index] = max_new
        self.done[index] = self._stopped(tokens) | (max_new <= 1)
        return tokens

    def set_batch(self, slots: Sequence[int], index: Tensor) -> None:
        """The running batch changed: ``index`` holds the slot of each batch position (padding
        included), ``slots`` the running rows' slots."""
        self._batch = self.sampling.batch(slots, index)
        self._index = index

    @property
    def greedy_batch(self) -> bool:
        """Whether every row of the batch decodes greedily (:meth:`record_greedy` serves it)."""
        return self._batch is not None and self._batch.all_greedy

    def record(self, logits: Tensor) -> Tensor:
        """Sample the batch's next tokens from a decode step's ``logits [bucket, V]``, record
        them and mark rows that stopped or reached their length; returns the tokens."""
        assert self._batch is not None
        index = self._index
        positions = self.generated[index] if self._batch.any_seeded else None
        tokens = sample_next(logits, self._batch, index, positions)
        record_tokens(self._batch, index, tokens)
        self._store(tokens, index)
        return tokens

    def record_greedy(self, logits: Tensor, index: Tensor) -> Tensor:
        """:meth:`record` for a batch of greedy rows whose slots ``index`` holds (padding
        included): the runner's own tensor, so that a CUDA graph can hold this with the step.
        Reads nothing host-side."""
        tokens = greedy_tokens(logits)
        self._store(tokens, index)
        return tokens

    def _store(self, tokens: Tensor, index: Tensor) -> None:
        generated = self.generated[index]
        self.out[index, generated.clamp(max=self.width - 1)] = tokens
        generated = (generated + 1).clamp(max=self.width - 1)
        self.generated[index] = generated
        self.done[index] |= self._stopped(tokens) | (generated >= self.max_new[index])

    def _stopped(self, tokens: Tensor) -> Tensor:
        return (tokens[:, None] == self.stop_ids).any(-1)

    def snapshot(self, rows: int, widest: int) -> tuple[Tensor, Tensor, Tensor]:
        """Host copies (queued, not waited for) of the first ``rows`` batch positions' done
        flags, generated counts and first ``widest`` tokens."""
        index = self._index[:rows]
        on_device = (self.done[index], self.generated[index], self.out[index, :widest])
        done, generated, out = (t.to("cpu", non_blocking=True) for t in on_device)
        return done, generated, out
