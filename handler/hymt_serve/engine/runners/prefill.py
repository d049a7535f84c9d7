"""The fast engine's prefill: prompts packed end to end into one forward (a CUDA graph per
token bucket), each prompt's kept prefix copied into its slot instead of computed again
(:mod:`hymt_serve.engine.runners.prefixes`); and *mixed steps*, where chunks of prompts ride in the
running batch's decode step (one read of the weights for both; a graph per decode bucket and
chunk bucket), so that admitting rows never stalls the batch and a long prompt prefills a
chunk per step. A part of :class:`~hymt_serve.engine.runners.fast.FastRunner`, which owns the cache
and the decode steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from hymt_serve.engine.models.base import Architecture
from hymt_serve.engine.models.weights import ModelShape, ModelWeights
from hymt_serve.engine.runners.inputs import (
    PackedPrompts,
    layout_size,
    packed_layout,
    pinned,
    to_device,
)
from hymt_serve.engine.runners.prefixes import PrefixCache, copy_positions

PREFILL_BUCKETS = (32, 64, 128, 192, 256, 384, 512, 768, 1024)
PREFILL_TOKENS = PREFILL_BUCKETS[-1]  # packed tokens per prefill call (a longer prompt alone)
PREFIX_TOKENS = 256  # the longest prompt prefix kept for reuse
# Mixed graphs, captured for every decode bucket: (prompt tokens, keys) of the chunks riding
# in the step, at most MIXED_ROWS prompts. Chunks attend to every position before them, so a
# chunk of a long prompt has many more keys than tokens: the largest bucket takes 2,048.
MIXED_BUCKETS = (
    *((16, 64), (32, 128), (64, 256), (96, 384)),
    *((128, 512), (160, 640), (192, 768), (256, 2048)),
)
MIXED_TOKENS, MIXED_KEYS = MIXED_BUCKETS[-1]
MIXED_ROWS = 32


class PackedPrefill:
    """Prefill for :class:`~hymt_serve.engine.runners.fast.FastRunner` (its attributes below)."""

    architecture: Architecture
    weights: ModelWeights
    shape: ModelShape
    fns: Any  # the architecture's step functions
    rope: tuple[Tensor, Tensor]
    caches: tuple[list[Tensor], list[Tensor]]
    kv: Tensor
    tokens: Tensor
    positions: Tensor
    slots: Tensor
    bucket: int
    mixed_tokens: int  # prompt tokens per mixed step (0: none, no mixed graphs)
    device: torch.device
    max_batch_size: int
    max_seq_len: int
    cache_len: int
    scratch_slot: int

    def setup_prefill(self, prefix_entries: int) -> None:
        """The prefill's buffers, and ``prefix_entries`` kept prefixes (none when 0)."""
        self.prefill_budget: int | None = PREFILL_TOKENS
        # Mixed graphs, per (decode bucket, chunk bucket); their logits go to one buffer: the
        # decode rows', then the chunks'.
        self.mixed_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.mixed_logits: Tensor | None = None
        self._moves: list[tuple[int, int, int]] = []  # kept prefixes to copy into slots
        # Prefill graphs: inputs go to one flat buffer (laid out per bucket, see packed_layout),
        # logits of up to max_batch_size prompts come out in one buffer shared by all buckets.
        self.prefill_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.prefill_inputs = torch.zeros(
            layout_size(PREFILL_TOKENS, 2 * PREFILL_TOKENS, self.max_batch_size),
            dtype=torch.int64,
            device=self.device,
        )
        self.prefill_logits: Tensor | None = None
        self.prefixes = (
            PrefixCache(prefix_entries, min(PREFIX_TOKENS, self.max_seq_len - 1))
            if prefix_entries
            else None
        )
        shape, dtype = self.shape, self.weights.dtype
        length = min(PREFIX_TOKENS, self.cache_len)
        self.kept = torch.zeros(  # laid out as the cache (kv), entries for slots
            (2, shape.layers, prefix_entries, shape.kv_heads, length, shape.head_dim),
            device=self.device,
            dtype=dtype,
        )

    def prefill(self, prompts: Sequence[Sequence[int]], slots: Sequence[int]) -> Tensor:
        """Fill the slots' caches with the prompts; logits after each prompt ``[R, V]``.

        A kept prefix of a prompt is copied into its slot and only the rest is computed; new
        prefixes worth keeping are copied out after (:mod:`hymt_serve.engine.runners.prefixes`).
        Runs in groups of at most ``PREFILL_TOKENS`` packed tokens (a longer prompt alone).
        Does not wait for the device (inputs go over with asynchronous copies). The logits of
        a single group may live in the prefill buffer: use them before the next prefill.
        """
        starts = [self.begin(prompt, slot) for prompt, slot in zip(prompts, slots, strict=True)]
        self._copy_begun()
        groups, start, tokens, keys = [], 0, 0, 0
        for end, (prompt, reused) in enumerate(zip(prompts, starts, strict=True)):
            packed = len(prompt) - reused
            full = tokens + packed > PREFILL_TOKENS or keys + len(prompt) > 2 * PREFILL_TOKENS
            if end > start and full:
                groups.append((start, end))
                start, tokens, keys = end, 0, 0
            tokens, keys = tokens + packed, keys + len(prompt)
        groups.append((start, len(prompts)))
        if len(groups) == 1:
            logits = self._packed_pass(0, prompts, slots, starts)
        else:
            logits = torch.cat(
                [
                    self._packed_pass(0, prompts[a:b], slots[a:b], starts[a:b]).clone()
                    for a, b in groups
                ]
            )
        self.finish(prompts, slots, starts)
        return logits

    def begin(self, prompt: Sequence[int], slot: int) -> int:
        """A row starts in ``slot``: the slot gets the prompt's longest kept prefix (copied
        before the next pass); returns how many tokens of the prompt the slot holds."""
        if self.prefixes is None:
            return 0
        length, entry = self.prefixes.lookup(tuple(prompt))
        if length:
            self._moves.append((entry, slot, length))
        return length

    def mixed_step(
        self,
        prompts: Sequence[Sequence[int]],
        slots: Sequence[int],
        starts: Sequence[int],
        *,
        decode: bool,
    ) -> tuple[Tensor | None, Tensor]:
        """One pass: the batch's decode step (when ``decode``) and a chunk of each prompt.

        Prompt ``i`` is computed from ``starts[i]`` (the tokens its slot holds) to its end
        (give a prompt up to the chunk's end); its keys are every position before. Returns
        the decode step's logits ``[bucket, V]`` (None without ``decode``) and the logits
        after each chunk ``[R, V]``. Replays a mixed graph when one fits, else runs eagerly;
        does not wait for the device. The logits may live in a graph's buffer: use them
        before the next pass.
        """
        self._copy_begun()
        bucket = self.bucket if decode else 0
        logits = self._packed_pass(bucket, prompts, slots, starts)
        return (logits[:bucket] if bucket else None), logits[bucket:]

    def _copy_begun(self) -> None:
        """Copy the kept prefixes that :meth:`begin` gave slots."""
        if self._moves:
            copy_positions(self.kept, self.kv, self._moves, self.device)
            self._moves = []

    def finish(
        self, prompts: Sequence[Sequence[int]], slots: Sequence[int], reused: Sequence[int]
    ) -> None:
        """Rows whose prompts are complete in their slots (``reused`` tokens of each from a
        kept prefix): copy out the prefixes worth keeping."""
        if self.prefixes is None:
            return
        # entry -> (slot, length): when a later prompt's prefix takes the entry an earlier
        # one's just got (all entries in use), only the later copy may go there
        into: dict[int, tuple[int, int]] = {}
        for prompt, slot, held in zip(prompts, slots, reused, strict=True):
            length = self.prefixes.candidate(tuple(prompt), held)
            if length:
                into[self.prefixes.keep(tuple(prompt[:length]))] = (slot, length)
        moves = [(slot, entry, length) for entry, (slot, length) in into.items()]
        copy_positions(self.kv, self.kept, moves, self.device)

    def _packed_pass(
        self,
        bucket: int,
        prompts: Sequence[Sequence[int]],
        slots: Sequence[int],
        starts: Sequence[int],
    ) -> Tensor:
        """The prompts from their starts, with the decode step of the first ``bucket`` batch
        positions (none when 0): through the smallest captured graph that holds them (its
        tokens, keys and rows), else eagerly. Logits ``[bucket + R, V]``."""
        rows, keys = len(prompts), sum(len(p) for p in prompts)
        tokens = keys - sum(starts)
        if bucket:
            shapes = [(c, k, self._mixed_rows(c)) for c, k in MIXED_BUCKETS]
            shapes = [shape for shape in shapes if (bucket, shape[0]) in self.mixed_graphs]
        else:  # a prefill bucket of b tokens takes 2b keys
            shapes = [(b, 2 * b, self._prefill_rows(b)) for b in self.prefill_graphs]
        # padding tokens need a padding key of their own
        fits = (s for s in shapes if s[0] >= tokens and s[1] >= keys + (s[0] > tokens))
        shape = next((s for s in fits if s[2] >= rows), None)
        if shape is None:
            layout = packed_layout(
                prompts, slots, tokens=tokens, rows=rows, scratch_slot=self.scratch_slot,
                starts=starts, keys=keys,
            )  # fmt: skip
            flat = to_device(layout, torch.int64, self.tokens.device)
            return self._mixed_forward(bucket, PackedPrompts.view(flat, tokens, keys, rows))
        layout = packed_layout(
            prompts, slots, tokens=shape[0], rows=shape[2], scratch_slot=self.scratch_slot,
            starts=starts, keys=shape[1],
        )  # fmt: skip
        self.prefill_inputs[: len(layout)].copy_(pinned(layout, torch.int64), non_blocking=True)
        if bucket:
            self.mixed_graphs[bucket, shape[0]].replay()
            out = self.mixed_logits
        else:
            self.prefill_graphs[shape[0]].replay()
            out = self.prefill_logits
        assert out is not None
        return out[: bucket + rows]

    def _prefill_rows(self, bucket: int) -> int:
        return min(bucket, self.max_batch_size)

    def _mixed_rows(self, chunk: int) -> int:
        return min(chunk, self.max_batch_size, MIXED_ROWS)

    def _idle_prefill_inputs(
        self, bucket: int, keys: int | None = None, rows: int | None = None
    ) -> PackedPrompts:
        """The bucket's view of the prefill inputs (``bucket`` tokens, ``keys`` keys: twice
        as many by default), set to padding only (scratch slot)."""
        keys = 2 * bucket if keys is None else keys
        rows = self._prefill_rows(bucket) if rows is None else rows
        self.prefill_inputs.zero_()
        flat = self.prefill_inputs[: layout_size(bucket, keys, rows)]
        view = PackedPrompts.view(flat, bucket, keys, rows)
        for slots in (view.token_slots, view.key_slots):
            slots.fill_(self.scratch_slot)
        for sequence in (view.sequence, view.key_sequence):
            sequence.fill_(-1)
        return view

    def _mixed_forward(self, bucket: int, batch: PackedPrompts) -> Tensor:
        """The first ``bucket`` batch positions' decode step (none when 0) with ``batch``'s
        prompt tokens."""
        decode = (self.tokens[:bucket], self.positions[:bucket], self.slots[:bucket])
        return self.architecture.forward(
            self.weights, self.shape, self.fns, self.rope, self.caches, decode if bucket else None,
            batch,
        )  # fmt: skip

    def _capture_prefill(self) -> None:
        """One graph per prefill bucket (largest first, sharing one memory pool); the inputs
        at warm-up and capture point every token at the scratch slot."""
        self.prefill_logits = torch.zeros(
            self.max_batch_size, self.shape.vocab, dtype=torch.float32, device=self.tokens.device
        )
        buckets = list(reversed(PREFILL_BUCKETS))
        with side_stream():
            for bucket in buckets:
                self._mixed_forward(0, self._idle_prefill_inputs(bucket))
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for bucket in buckets:
            inputs = self._idle_prefill_inputs(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._mixed_forward(0, inputs)
                self.prefill_logits[: logits.shape[0]].copy_(logits)
            graphs[bucket] = graph
        torch.cuda.synchronize()
        self.prefill_graphs = dict(sorted(graphs.items()))

    def _capture_mixed(self, decode_buckets: Sequence[int]) -> None:
        """One graph per (decode bucket, chunk bucket), sharing one memory pool; at warm-up
        and capture the batch is empty and every token points at the scratch slot."""
        self.mixed_logits = torch.zeros(
            max(decode_buckets) + self._mixed_rows(MIXED_TOKENS), self.shape.vocab,
            dtype=torch.float32, device=self.tokens.device,
        )  # fmt: skip
        pairs = [(b, c) for b in reversed(decode_buckets) for c in reversed(MIXED_BUCKETS)]
        with side_stream():
            for bucket, (chunk, keys) in pairs:
                inputs = self._idle_prefill_inputs(chunk, keys, self._mixed_rows(chunk))
                self._mixed_forward(bucket, inputs)
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for bucket, (chunk, keys) in pairs:
            inputs = self._idle_prefill_inputs(chunk, keys, self._mixed_rows(chunk))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._mixed_forward(bucket, inputs)
                self.mixed_logits[: logits.shape[0]].copy_(logits)
            graphs[bucket, chunk] = graph
        torch.cuda.synchronize()
        self.mixed_graphs = graphs


@contextlib.contextmanager
def side_stream() -> Iterator[None]:
    """Run the block on a fresh stream (warm-up before capture, as CUDA graphs require), then
    wait for it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
