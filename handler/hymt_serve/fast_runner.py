"""The KV cache, the decode-step input buffers and the CUDA graphs, one per batch bucket.

Rows live in cache *slots*; a batch position holds (token, position, slot). Rows that leave
the batch are dropped by compacting these three small vectors, so no KV data moves. Padding
positions of a bucket point at a scratch slot (the last one) and are never read back.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from hymt_serve.fast_forward import (
    ModelShape,
    ModelWeights,
    decode_forward,
    make_step_functions,
    prefill_forward,
    rope_tables,
)

logger = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def bucket_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch_size``, and ``max_batch_size`` itself."""
    sizes = {b for b in DEFAULT_BUCKETS if b < max_batch_size} | {max_batch_size}
    return tuple(sorted(sizes))


class DecodeRunner:
    """Owns the cache and runs prefill and decode steps, replaying graphs when captured."""

    def __init__(
        self, weights: ModelWeights, shape: ModelShape, *, max_batch_size: int, cache_len: int
    ) -> None:
        self.weights, self.shape = weights, shape
        self.max_batch_size, self.cache_len = max_batch_size, cache_len
        self.buckets = bucket_sizes(max_batch_size)
        device, dtype = weights.embed.device, weights.embed.dtype
        self.scratch_slot = max_batch_size
        cache_shape = (max_batch_size + 1, shape.kv_heads, cache_len, shape.head_dim)
        self.caches = (
            [torch.zeros(cache_shape, device=device, dtype=dtype) for _ in range(shape.layers)],
            [torch.zeros(cache_shape, device=device, dtype=dtype) for _ in range(shape.layers)],
        )
        self.rope = rope_tables(weights.inv_freq, cache_len, dtype)
        self.tokens = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        self.positions = torch.zeros_like(self.tokens)
        self.slots = torch.full_like(self.tokens, self.scratch_slot)
        self.fns = make_step_functions(shape, compile_=False)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.compiled = False
        self.timings: dict[str, float] = {}

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for part in self.caches for t in part)

    def bucket_for(self, rows: int) -> int:
        """The smallest bucket holding ``rows`` rows."""
        return next(b for b in self.buckets if b >= rows)

    def prefill(self, ids: Tensor, lengths: Tensor, slots: Tensor) -> Tensor:
        """Fill the slots' caches with right-padded prompts; logits at each last token."""
        return prefill_forward(
            self.weights, self.shape, self.rope, self.caches, ids, lengths, slots
        )

    def load(self, tokens: Tensor, positions: Tensor, slots: Tensor) -> int:
        """Put a batch in the step buffers, padded to its bucket; returns the bucket."""
        rows = tokens.shape[0]
        bucket = self.bucket_for(rows)
        self.tokens[:rows] = tokens
        self.positions[:rows] = positions
        self.slots[:rows] = slots
        self.tokens[rows:bucket] = 0
        self.positions[rows:bucket] = 0
        self.slots[rows:bucket] = self.scratch_slot
        return bucket

    def clear(self) -> None:
        """Point every batch position at the scratch slot (before capture or measurement)."""
        self.tokens.zero_()
        self.positions.zero_()
        self.slots.fill_(self.scratch_slot)

    def compact(self, keep: Tensor) -> int:
        """Keep only the batch positions ``keep`` (in order); returns the new bucket."""
        return self.load(self.tokens[keep], self.positions[keep], self.slots[keep])

    def step(self, bucket: int) -> Tensor:
        """Run one decode step on the first ``bucket`` positions; logits ``[bucket, V]``."""
        captured = self.graphs.get(bucket)
        if captured is not None:
            captured[0].replay()
            return captured[1]
        return self._forward(bucket)

    def advance(self, bucket: int, next_tokens: Tensor) -> None:
        """Feed the sampled tokens to the next step."""
        self.tokens[:bucket] = next_tokens
        self.positions[:bucket] += 1

    def _forward(self, bucket: int) -> Tensor:
        batch = (self.tokens[:bucket], self.positions[:bucket], self.slots[:bucket])
        return decode_forward(self.weights, self.shape, self.fns, self.rope, self.caches, batch)

    def capture(self, compile_: bool) -> None:
        """Compile (optionally) and capture one CUDA graph per bucket, largest first."""
        start = time.perf_counter()
        if compile_:
            self.fns = make_step_functions(self.shape, compile_=True)
            self.compiled = True
            try:
                self._warm_up()
            except Exception:  # a compiler failure costs speed, not service
                logger.exception("fast engine: torch.compile failed, capturing the eager step")
                self.fns = make_step_functions(self.shape, compile_=False)
                self.compiled = False
        self._warm_up()
        self.timings["warmup_compile_s"] = time.perf_counter() - start
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(bucket)
            self.graphs[bucket] = (graph, logits)
        torch.cuda.synchronize()
        self.timings["capture_s"] = time.perf_counter() - start
        logger.info("fast engine: graphs for buckets %s, timings %s", self.buckets, self.timings)

    def _warm_up(self) -> None:
        """Run every bucket once on a side stream: compiles, loads kernels, settles allocations."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.clear()
            for bucket in reversed(self.buckets):
                self._forward(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
