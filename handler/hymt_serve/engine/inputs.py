"""The fast engine's inputs on their way to the device: prompts packed end to end for one
prefill (:func:`packed_layout`, :class:`PackedPrompts`), and host lists copied without waiting
for the device (:func:`to_device`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def packed_layout(
    prompts: Sequence[Sequence[int]],
    slots: Sequence[int],
    *,
    tokens: int,
    rows: int,
    scratch_slot: int,
) -> list[int]:
    """The prefill's inputs as one host list: ids, positions, cache slots and sequence numbers
    of the packed tokens (``tokens`` long each: prompts end to end, then padding that writes to
    ``scratch_slot`` and attends only to padding), then each prompt's last packed index
    (``rows`` long, padded with 0)."""
    ids: list[int] = []
    positions: list[int] = []
    token_slots: list[int] = []
    sequence: list[int] = []
    last: list[int] = []
    for row, (prompt, slot) in enumerate(zip(prompts, slots, strict=True)):
        ids.extend(prompt)
        positions.extend(range(len(prompt)))
        token_slots.extend([slot] * len(prompt))
        sequence.extend([row] * len(prompt))
        last.append(len(ids) - 1)
    pad, pad_rows = tokens - len(ids), rows - len(last)
    if pad < 0 or pad_rows < 0:
        raise ValueError(f"{len(ids)} tokens in {len(last)} rows exceed {tokens} and {rows}")
    return (
        ids + [0] * pad
        + positions + [0] * pad
        + token_slots + [scratch_slot] * pad
        + sequence + [-1] * pad
        + last + [0] * pad_rows
    )  # fmt: skip


@dataclass(frozen=True)
class PackedPrompts:
    """The device side of :func:`packed_layout`: views of one flat int64 tensor."""

    ids: Tensor  # [N]
    positions: Tensor  # [N]
    token_slots: Tensor  # [N]
    sequence: Tensor  # [N] which prompt each token belongs to (-1: padding)
    last: Tensor  # [R] packed index of each prompt's last token

    @classmethod
    def view(cls, flat: Tensor, tokens: int, rows: int) -> PackedPrompts:
        ids, positions, slots, sequence, last = flat[: 4 * tokens + rows].split(
            [tokens, tokens, tokens, tokens, rows]
        )
        return cls(ids, positions, slots, sequence, last)


def pinned(values: Sequence[int] | Sequence[float], dtype: torch.dtype) -> Tensor:
    """A host list in page-locked memory, ready for an asynchronous copy to the device."""
    return torch.tensor(values, dtype=dtype).pin_memory()


def to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> Tensor:
    """A host list as a device tensor without waiting for the device: ``torch.tensor(values,
    device=cuda)`` copies from pageable memory and synchronises the stream; a pinned copy does
    not (the caching host allocator keeps the buffer until the copy is done)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return pinned(values, dtype).to(device, non_blocking=True)
