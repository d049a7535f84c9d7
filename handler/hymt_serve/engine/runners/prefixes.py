"""Shared prompt prefixes computed once: which prefixes the fast engine keeps, and moving their
K/V between the kept copies and the rows' cache slots.

Prompts that share a beginning (the same instruction template and target language; the
context and glossary of one document's segments) need not compute it again: its keys and
values at positions 0..L-1 depend on those L tokens only. The engine keeps up to ``entries``
such prefixes (at most ``max_tokens`` long each) in tensors of their own, least recently used
first out. A prompt that starts with a kept prefix (and goes on past it) gets the prefix's K/V
copied into its slot, and its prefill packs only the tokens after it.

Which prefixes are worth keeping is learnt from the prompts themselves, with no knowledge of
templates: each prompt is compared with recent prompts that start with the same
``min_tokens`` tokens, and the longest beginning it shares with at least two of them is kept
(taken from the slot the prompt was just prefilled into). A prompt seen before counts once:
repeated texts do not turn whole prompts into kept prefixes. Three prompts in one template and
target language are enough to keep that template; a beginning two prompts share by chance
is not kept. So a template shared by every request is computed once, and so is a long
context shared by one document's segments.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

import torch
from torch import Tensor

from hymt_serve.engine.runners.inputs import to_device

RECENT_PER_START = 8  # recent prompts compared with, per group of prompts with one beginning
MAX_STARTS = 256  # groups remembered


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


class PrefixCache:
    """Which prefixes are kept, in which entry (host side; no device work)."""

    def __init__(self, entries: int, max_tokens: int, min_tokens: int = 8) -> None:
        self.entries, self.max_tokens, self.min_tokens = entries, max_tokens, min_tokens
        self._kept: OrderedDict[tuple[int, ...], int] = OrderedDict()  # prefix -> entry, LRU
        # the kept prefixes by their first min_tokens tokens: a lookup compares only those
        self._by_start: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        self._recent: OrderedDict[tuple[int, ...], deque[tuple[int, ...]]] = OrderedDict()
        self.stats = {"hits": 0, "reused_tokens": 0, "kept": 0, "evicted": 0}

    def lookup(self, prompt: tuple[int, ...]) -> tuple[int, int]:
        """The longest kept prefix of ``prompt`` that leaves at least one token to prefill:
        (its length, its entry), or (0, -1)."""
        best, entry = 0, -1
        for prefix in self._by_start.get(prompt[: self.min_tokens], ()):
            if best < len(prefix) < len(prompt) and prompt[: len(prefix)] == prefix:
                best, entry = len(prefix), self._kept[prefix]
        if entry >= 0:
            self._kept.move_to_end(prompt[:best])
            self.stats["hits"] += 1
            self.stats["reused_tokens"] += best
        return best, entry

    def candidate(self, prompt: tuple[int, ...], reused: int) -> int:
        """The prefix length of ``prompt`` worth keeping now (0: none): the longest beginning
        it shares with two recent prompts of the same start, when longer than ``reused`` and
        not kept already. Then remembers ``prompt``."""
        start = prompt[: self.min_tokens]
        recent = self._recent.get(start)
        if recent is None:
            recent = self._recent[start] = deque(maxlen=RECENT_PER_START)
            if len(self._recent) > MAX_STARTS:
                self._recent.popitem(last=False)
        self._recent.move_to_end(start)
        others = [other for other in recent if other != prompt]  # a repeat teaches nothing
        shared = sorted((common_length(prompt, other) for other in others), reverse=True)
        if len(others) == len(recent):
            recent.append(prompt)
        if len(shared) < 2:
            return 0
        length = min(shared[1], self.max_tokens, len(prompt) - 1)  # two others go this far
        if length < self.min_tokens or length <= reused or prompt[:length] in self._kept:
            return 0
        return length

    def keep(self, prefix: tuple[int, ...]) -> int:
        """An entry for ``prefix`` (at least ``min_tokens`` long; the least recently used
        entry when all are taken)."""
        assert len(prefix) >= self.min_tokens, prefix
        if len(self._kept) < self.entries:
            entry = len(self._kept)
        else:
            evicted, entry = self._kept.popitem(last=False)
            self._by_start[evicted[: self.min_tokens]].discard(evicted)
            self.stats["evicted"] += 1
        self._kept[prefix] = entry
        self._by_start.setdefault(prefix[: self.min_tokens], set()).add(prefix)
        self.stats["kept"] += 1
        return entry

    def describe(self) -> dict[str, object]:
        return {
            "prefix_entries": self.entries,
            "prefix_max_tokens": self.max_tokens,
            "prefixes_kept_now": len(self._kept),
            **{f"prefix_{key}": value for key, value in self.stats.items()},
        }


def copy_positions(
    source: Tensor, target: Tensor, moves: Sequence[tuple[int, int, int]], device: torch.device
) -> None:
    """Between K/V stores laid out ``[2, layers, slots, kv_heads, len, dim]``: copy positions
    ``0..length-1`` of slot ``from`` in ``source`` to slot ``to`` in ``target`` for each
    (from, to, length) in ``moves``, all layers, K and V, in one indexed copy."""
    if not moves:
        return
    froms = [move[0] for move in moves for _ in range(move[2])]
    tos = [move[1] for move in moves for _ in range(move[2])]
    positions = [p for move in moves for p in range(move[2])]
    src, dst, pos = (to_device(values, torch.int64, device) for values in (froms, tos, positions))
    target[:, :, dst, :, pos] = source[:, :, src, :, pos]
