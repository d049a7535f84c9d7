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
    starts: Sequence[int] | None = None,
    keys: int | None = None,
) -> list[int]:
    """The prefill's inputs as one host list: ids, positions, cache slots and sequence numbers
    of the packed tokens (``tokens`` long each: prompts end to end, then padding that writes to
    ``scratch_slot`` and attends only to padding); then the slots, positions and sequence
    numbers of the keys each prompt attends to (``keys`` long each, default ``tokens``: every
    position of its slot up to its last token); then each prompt's last packed index (``rows``
    long, padded with 0); then the blocks of :func:`prompt_blocks`. ``starts``: per prompt,
    how many leading tokens its slot holds already (a reused prefix): only the rest is packed,
    the keys cover them all."""
    starts = starts or [0] * len(prompts)
    keys = tokens if keys is None else keys
    ids: list[int] = []
    positions: list[int] = []
    token_slots: list[int] = []
    sequence: list[int] = []
    key_slots: list[int] = []
    key_positions: list[int] = []
    key_sequence: list[int] = []
    last: list[int] = []
    # per prompt: its first packed index, packed tokens, slot and first packed position
    spans: list[tuple[int, int, int, int]] = []
    for row, (prompt, slot, start) in enumerate(zip(prompts, slots, starts, strict=True)):
        spans.append((len(ids), len(prompt) - start, slot, start))
        ids.extend(prompt[start:])
        positions.extend(range(start, len(prompt)))
        token_slots.extend([slot] * (len(prompt) - start))
        sequence.extend([row] * (len(prompt) - start))
        key_slots.extend([slot] * len(prompt))
        key_positions.extend(range(len(prompt)))
        key_sequence.extend([row] * len(prompt))
        last.append(len(ids) - 1)
    pad, pad_keys, pad_rows = tokens - len(ids), keys - len(key_slots), rows - len(last)
    if pad < 0 or pad_rows < 0 or pad_keys < 0 or (pad and not pad_keys):
        raise ValueError(
            f"{len(ids)} tokens, {len(key_slots)} keys in {len(last)} rows exceed "
            f"{tokens}, {keys} and {rows}"
        )
    return (
        ids + [0] * pad
        + positions + [0] * pad
        + token_slots + [scratch_slot] * pad
        + sequence + [-1] * pad
        + key_slots + [scratch_slot] * pad_keys
        + key_positions + [0] * pad_keys
        + key_sequence + [-1] * pad_keys
        + last + [0] * pad_rows
        + prompt_blocks(spans, tokens, rows, scratch_slot)
    )  # fmt: skip


def prompt_blocks(
    spans: Sequence[tuple[int, int, int, int]], tokens: int, rows: int, scratch: int
) -> list[int]:
    """The packed tokens in blocks of at most ``PROMPT_BLOCK`` that never span two prompts,
    for the prompt attention kernel. ``spans``: per prompt, its first packed index, its packed
    token count, its slot and the position of its first packed token. Returns four lists of
    ``max_blocks(tokens, rows)``: each block's first packed index, its token count (0: unused),
    its slot and its last token's position. The padding after the prompts (``tokens`` in all)
    makes blocks of the scratch slot."""
    blocks: list[tuple[int, int, int, int]] = []  # (first, count, slot, last position)
    end = 0
    for first, count, slot, position in spans:
        end = first + count
        for start in range(first, end, PROMPT_BLOCK):
            size = min(PROMPT_BLOCK, end - start)
            blocks.append((start, size, slot, position + start - first + size - 1))
    for start in range(end, tokens, PROMPT_BLOCK):  # padding: position 0 of the scratch slot
        blocks.append((start, min(PROMPT_BLOCK, tokens - start), scratch, 0))
    unused = max_blocks(tokens, rows) - len(blocks)
    assert unused >= 0, "more blocks than max_blocks allows"
    blocks += [(0, 0, scratch, 0)] * unused
    return [value for column in zip(*blocks, strict=True) for value in column]


PROMPT_BLOCK = 16  # packed tokens per program of the prompt attention kernel


def max_blocks(tokens: int, rows: int) -> int:
    """Blocks of :func:`prompt_blocks` for ``tokens`` packed tokens of at most ``rows``
    prompts: a prompt adds at most one short block, the padding one more."""
    return tokens // PROMPT_BLOCK + rows + 1


def layout_size(tokens: int, keys: int, rows: int) -> int:
    """The length of a :func:`packed_layout` list."""
    return 4 * tokens + 3 * keys + rows + 4 * max_blocks(tokens, rows)


@dataclass(frozen=True)
class PackedPrompts:
    """The device side of :func:`packed_layout`: views of one flat int64 tensor."""

    ids: Tensor  # [N]
    positions: Tensor  # [N]
    token_slots: Tensor  # [N]
    sequence: Tensor  # [N] which prompt each token belongs to (-1: padding)
    key_slots: Tensor  # [K] the cache slot of each key
    key_positions: Tensor  # [K] its position there
    key_sequence: Tensor  # [K] which prompt attends to it (-1: padding)
    last: Tensor  # [R] packed index of each prompt's last token
    blocks: Tensor  # [4, max_blocks] see prompt_blocks

    @classmethod
    def view(cls, flat: Tensor, tokens: int, keys: int, rows: int) -> PackedPrompts:
        count = max_blocks(tokens, rows)
        sizes = [tokens] * 4 + [keys] * 3 + [rows, 4 * count]
        parts = list(flat[: layout_size(tokens, keys, rows)].split(sizes))
        parts[-1] = parts[-1].view(4, count)  # blocks
        return cls(*parts)


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
