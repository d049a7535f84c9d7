"""The KV cache, the decode-step input buffers and the CUDA graphs, one per batch bucket.

Rows live in cache *slots*; a batch position holds (token, position, slot). Rows that leave
the batch are dropped by compacting these three small vectors, so no KV data moves. Padding
positions of a bucket point at a scratch slot (the last one) and are never read back.

Prefills are captured too, one graph per packed-token bucket (``PREFILL_BUCKETS``): any mix of
prompts that fits N tokens replays the N graph, so admitting rows costs the host one copy and
one replay instead of hundreds of kernel launches. Longer prefills run eagerly.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from hymt_serve.engine.model import (
    ModelShape,
    ModelWeights,
    PackedPrompts,
    decode_forward,
    make_step_functions,
    packed_layout,
    pinned,
    prefill_forward,
    rope_tables,
    to_device,
)

logger = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PREFILL_BUCKETS = (32, 64, 128, 192, 256, 384, 512, 768, 1024)


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
        # Prefill graphs: inputs go to one flat buffer (laid out per bucket, see packed_layout),
        # logits of up to max_batch_size prompts come out in one buffer shared by all buckets.
        self.prefill_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.prefill_inputs = torch.zeros(
            4 * PREFILL_BUCKETS[-1] + max_batch_size, dtype=torch.int64, device=device
        )
        self.prefill_logits: Tensor | None = None
        self.compiled = False
        self.timings: dict[str, float] = {}

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for part in self.caches for t in part)

    def bucket_for(self, rows: int) -> int:
        """The smallest bucket holding ``rows`` rows."""
        return next(b for b in self.buckets if b >= rows)

    def prefill(self, prompts: Sequence[Sequence[int]], slots: Sequence[int]) -> Tensor:
        """Fill the slots' caches with the prompts; logits at each last token ``[R, V]``.

        Does not wait for the device (inputs go over with one asynchronous copy)."""
        tokens, rows = sum(len(p) for p in prompts), len(prompts)
        bucket = next((b for b in self.prefill_graphs if b >= tokens), None)
        if bucket is None:
            layout = packed_layout(
                prompts, slots, tokens=tokens, rows=rows, scratch_slot=self.scratch_slot
            )
            flat = to_device(layout, torch.int64, self.tokens.device)
            return self._prefill_forward(PackedPrompts.view(flat, tokens, rows))
        width = self._prefill_rows(bucket)
        layout = packed_layout(
            prompts, slots, tokens=bucket, rows=width, scratch_slot=self.scratch_slot
        )
        self.prefill_inputs[: len(layout)].copy_(pinned(layout, torch.int64), non_blocking=True)
        self.prefill_graphs[bucket].replay()
        assert self.prefill_logits is not None
        return self.prefill_logits[:rows]

    def _prefill_rows(self, bucket: int) -> int:
        return min(bucket, self.max_batch_size)

    def _idle_prefill_inputs(self, bucket: int) -> PackedPrompts:
        """The bucket's view of the prefill inputs, set to padding only (scratch slot)."""
        rows = self._prefill_rows(bucket)
        self.prefill_inputs.zero_()
        flat = self.prefill_inputs[: 4 * bucket + rows]
        flat[2 * bucket : 3 * bucket].fill_(self.scratch_slot)
        flat[3 * bucket : 4 * bucket].fill_(-1)
        return PackedPrompts.view(flat, bucket, rows)

    def _prefill_forward(self, batch: PackedPrompts) -> Tensor:
        return prefill_forward(self.weights, self.shape, self.fns, self.rope, self.caches, batch)

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
        start = time.perf_counter()
        try:
            self._capture_prefill()
        except Exception:  # eager prefills cost speed, not service
            logger.exception("fast engine: prefill capture failed, prefills run eagerly")
            self.prefill_graphs = {}
        self.timings["prefill_capture_s"] = time.perf_counter() - start
        logger.info(
            "fast engine: graphs for decode buckets %s and prefill buckets %s, timings %s",
            self.buckets,
            tuple(self.prefill_graphs),
            self.timings,
        )

    def _capture_prefill(self) -> None:
        """One graph per prefill bucket (largest first, sharing one memory pool); the inputs
        at warm-up and capture point every token at the scratch slot."""
        self.prefill_logits = torch.zeros(
            self.max_batch_size, self.shape.vocab, dtype=torch.float32, device=self.tokens.device
        )
        buckets = list(reversed(PREFILL_BUCKETS))
        with _side_stream():
            for bucket in buckets:
                self._prefill_forward(self._idle_prefill_inputs(bucket))
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for bucket in buckets:
            inputs = self._idle_prefill_inputs(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._prefill_forward(inputs)
                self.prefill_logits[: logits.shape[0]].copy_(logits)
            graphs[bucket] = graph
        torch.cuda.synchronize()
        self.prefill_graphs = dict(sorted(graphs.items()))

    def _warm_up(self) -> None:
        """Run every bucket once on a side stream: compiles, loads kernels, settles allocations."""
        with _side_stream():
            self.clear()
            for bucket in reversed(self.buckets):
                self._forward(bucket)


@contextlib.contextmanager
def _side_stream() -> Iterator[None]:
    """Run the block on a fresh stream (warm-up before capture, as CUDA graphs require), then
    wait for it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
