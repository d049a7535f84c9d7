"""The fast engine's runner: the KV cache, the step input buffers and the CUDA graphs.

Rows live in cache *slots*; a batch position holds (token, position, slot). Rows that leave
the batch are dropped by compacting these three small vectors, so no KV data moves. The batch
is padded to the smallest *bucket* that holds it (one decode graph per bucket); padding
positions point at a scratch slot (the last one) and are never read back.

Prefills are captured too, one graph per packed-token bucket (``PREFILL_BUCKETS``): any mix of
prompts that fits N tokens replays the N graph, so admitting rows costs the host one copy and
one replay instead of hundreds of kernel launches. Longer prefills run eagerly. So are mixed
steps (a decode step with prompt chunks riding in it), one graph per decode bucket and chunk
bucket (``MIXED_BUCKETS``). A batch of greedy rows has one more graph per bucket: the decode
step with the scheduler's recording of its tokens and their feeding back
(:meth:`FastRunner.recorded_step`), so such a step is one replay and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.cuda import CUDAGraph

from hymt_serve.engine.kernels import ahead, quantized, weight_only
from hymt_serve.engine.kernels.attention import kernel_name, num_splits, prompt_kernel_name
from hymt_serve.engine.models.base import Architecture
from hymt_serve.engine.models.weights import ModelShape, ModelWeights
from hymt_serve.engine.runners.prefill import (
    MIXED_KEYS,
    MIXED_ROWS,
    MIXED_TOKENS,
    PREFILL_TOKENS,
    PackedPrefill,
    side_stream,
)
from hymt_serve.engine.runners.protocol import Context, Recorder

logger = logging.getLogger(__name__)

# Above 128 rows the steps grow in quarters of a power of two up to 256 (256 users of the
# sentence mix keep about 222 rows running: padded to 224, not 256), then in halves: decode
# GEMMs cost time in the padded rows there.
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 160, 192, 224, 256, 384, 512, 768, 1024)
# Cache positions past max_seq_len: a finished row keeps stepping until the host learns that it
# finished (the scheduler's SYNC_EVERY steps, plus its LOOKAHEAD twice); checked there.
STEP_HEADROOM = 16


def bucket_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch_size`` (with 160, 192, 224, 384 and 768 above 128), and
    ``max_batch_size`` itself."""
    sizes = {b for b in DEFAULT_BUCKETS if b < max_batch_size} | {max_batch_size}
    return tuple(sorted(sizes))


class FastRunner(PackedPrefill):
    """Owns the cache and runs prefill and decode steps, replaying graphs when captured.

    ``max_seq_len`` bounds prompt + new tokens of a row and ``max_positions`` is the model's
    ``max_position_embeddings``; the cache holds ``max_batch_size`` rows (``layers x kv_heads x
    head_dim x 2 x dtype bytes`` per token).
    """

    def __init__(
        self,
        architecture: Architecture,
        weights: ModelWeights,
        shape: ModelShape,
        *,
        max_batch_size: int,
        max_seq_len: int,
        max_positions: int,
        prefix_entries: int = 0,
        mixed_tokens: int = MIXED_TOKENS,
    ) -> None:
        self.architecture, self.weights, self.shape = architecture, weights, shape
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.max_positions = max_positions
        self.cache_len = cache_len = max_seq_len + STEP_HEADROOM
        self.buckets = bucket_sizes(max_batch_size)
        self.bucket = 0  # batch positions in use (padded); 0 when idle
        device, dtype = weights.embed.device, weights.dtype
        self.device = device
        self.scratch_slot = max_batch_size
        # K and V of every layer in one tensor, so that a kept prefix moves in one copy; the
        # kernels see each layer's K or V as a view ([slots, kv_heads, len, dim], contiguous).
        self.kv = torch.zeros(
            (2, shape.layers, max_batch_size + 1, shape.kv_heads, cache_len, shape.head_dim),
            device=device,
            dtype=dtype,
        )
        self.caches = (list(self.kv[0].unbind()), list(self.kv[1].unbind()))
        self.rope = architecture.rope_tables(weights, cache_len)
        self.tokens = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        self.positions = torch.zeros_like(self.tokens)
        self.slots = torch.full_like(self.tokens, self.scratch_slot)
        self.fns = architecture.step_functions(shape, compile_=False)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.recorder: Recorder | None = None
        self.recorded_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.setup_prefill(prefix_entries)
        self.mixed_tokens, self.mixed_keys, self.mixed_rows = mixed_tokens, MIXED_KEYS, MIXED_ROWS
        self.compiled = False
        self.timings: dict[str, float] = {}
        # the compile cache this build used (engine.compile_cache): its folder, whether reused
        self.compile_cache: dict[str, Any] = {}

    @property
    def vocab(self) -> int:
        return self.shape.vocab

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for part in self.caches for t in part)

    @property
    def context(self) -> Context:
        """The cache's and the model's positions, whichever is fewer.

        The last generated token is never fed back, so a row uses positions up to
        ``prompt + max_new_tokens - 2``: ``prompt + max_new_tokens`` may equal both limits.
        """
        limit = min(self.max_seq_len, self.max_positions or self.max_seq_len)
        return Context(limit, "the engine's context for one text")

    def can_admit(self, running: int) -> bool:
        """Rows join a running batch at any step."""
        return True

    def bucket_for(self, rows: int) -> int:
        """The smallest bucket holding ``rows`` rows."""
        return next(b for b in self.buckets if b >= rows)

    def load(self, tokens: Tensor, positions: Tensor, slots: Tensor) -> None:
        """Make these rows the batch, padded to their bucket."""
        rows = tokens.shape[0]
        bucket = self.bucket_for(rows) if rows else 0
        self.tokens[:rows] = tokens
        self.positions[:rows] = positions
        self.slots[:rows] = slots
        self.tokens[rows:bucket] = 0
        self.positions[rows:bucket] = 0
        self.slots[rows:bucket] = self.scratch_slot
        self.bucket = bucket

    def add(self, tokens: Tensor, lengths: Tensor, slots: Tensor, running: int) -> None:
        """Append prefilled rows (first tokens, prompt lengths, slots) to the ``running``."""
        self.load(
            torch.cat([self.tokens[:running], tokens]),
            torch.cat([self.positions[:running], lengths]),
            torch.cat([self.slots[:running], slots]),
        )

    def keep(self, keep: Tensor) -> None:
        """Keep only the batch positions ``keep`` (in order)."""
        self.load(self.tokens[keep], self.positions[keep], self.slots[keep])

    def clear(self) -> None:
        """Empty the batch: every position points at the scratch slot."""
        self.tokens.zero_()
        self.positions.zero_()
        self.slots.fill_(self.scratch_slot)
        self.bucket = 0

    def batch_slots(self) -> Tensor:
        """The slot of each batch position, padding included (``[bucket]``, a copy)."""
        return self.slots[: self.bucket].clone()

    def step(self) -> Tensor:
        """Run one decode step on the batch; logits ``[bucket, V]``."""
        captured = self.graphs.get(self.bucket)
        if captured is not None:
            captured[0].replay()
            return captured[1]
        return self._forward(self.bucket)

    def advance(self, next_tokens: Tensor) -> None:
        """Feed the sampled tokens to the next step."""
        self._feed(next_tokens, self.bucket)

    def _feed(self, next_tokens: Tensor, bucket: int) -> None:
        self.tokens[:bucket] = next_tokens
        self.positions[:bucket] += 1

    def record_with(self, recorder: Recorder) -> None:
        """Greedy steps record with ``recorder``; with CUDA graphs, one more per bucket holds
        the step and the recording (captured now, with the batch empty)."""
        self.recorder, self.recorded_graphs = recorder, {}
        if not self.graphs:
            return
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                self._capture_recorded()
        except Exception:  # eager recording costs speed, not service
            logger.exception(
                "fast engine: recorded-step capture failed, greedy steps record eagerly"
            )
            self.recorded_graphs = {}
        self.timings["recorded_capture_s"] = time.perf_counter() - start

    def _capture_recorded(self) -> None:
        self._warm_up(self._recorded_forward)
        captured = self._capture_buckets(self._recorded_forward)
        self.recorded_graphs = {bucket: graph for bucket, (graph, _) in captured.items()}

    def recorded_step(self) -> None:
        """One decode step of greedy rows, its tokens recorded and fed to the next step."""
        graph = self.recorded_graphs.get(self.bucket)
        if graph is not None:
            graph.replay()
        else:
            self._recorded_forward(self.bucket)

    def _recorded_forward(self, bucket: int) -> None:
        assert self.recorder is not None
        self._feed(self.recorder(self._forward(bucket), self.slots[:bucket]), bucket)

    def describe(self) -> dict[str, object]:
        """What runs: buckets, graphs, attention kernel, cache size, timings."""
        device, dtype = self.weights.embed.device, self.weights.dtype
        return {
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "buckets": list(self.buckets),
            "cuda_graphs": bool(self.graphs),
            "compiled": self.compiled,
            "compile_cache": self.compile_cache,
            "attention_kernel": kernel_name(device, dtype),
            "prompt_attention_kernel": prompt_kernel_name(device, dtype),
            "attention_splits": {
                b: num_splits(b, self.shape.kv_heads, self.cache_len) for b in self.buckets
            },
            "max_batch_size": self.max_batch_size,
            "max_seq_len": self.max_seq_len,
            "kv_cache_gb": round(self.kv_cache_bytes / 1e9, 3),
            "mixed_tokens": self.mixed_tokens,
            "mixed_graphs": len(self.mixed_graphs),
            "recorded_graphs": len(self.recorded_graphs),
            # whether int8 products take the norms' outputs as fp16 (ModelShape.norms_fit_fp16)
            "norms_fit_fp16": self.shape.norms_fit_fp16,
            **self.weights.describe(),
            **(self.prefixes.describe() if self.prefixes is not None else {"prefix_entries": 0}),
            **{k: round(v, 2) for k, v in self.timings.items()},
        }

    def _forward(self, bucket: int) -> Tensor:
        batch = (self.tokens[:bucket], self.positions[:bucket], self.slots[:bucket])
        return self.architecture.forward(
            self.weights, self.shape, self.fns, self.rope, self.caches, batch
        )

    def capture(self, compile_: bool) -> None:
        """Compile (optionally) and capture one CUDA graph per bucket, largest first; our
        weight-only kernels compile ahead meanwhile, in threads (:mod:`.ahead`)."""
        start = time.perf_counter()
        with ahead.compile_ahead(self._weight_only_launches, self.device) as kernels:
            self.timings["ahead_plan_s"] = time.perf_counter() - start
            self._capture(compile_)
        self.timings["ahead_wait_s"] = ahead.waited_s  # (the threads on the critical path)
        logger.info("fast engine: %d weight-only kernels compiled ahead", kernels)

    def _weight_only_launches(self) -> None:
        """Each product of the steps once for each class of row count it takes (up to the
        most tokens a step holds; the head: the most rows of logits), on empty inputs: the
        weight-only kernels' launches, which :func:`.ahead.compile_ahead` records."""
        tokens = max(PREFILL_TOKENS, self.buckets[-1] + self.mixed_tokens)
        mixed = self._mixed_rows(self.mixed_tokens) if self.mixed_tokens else 0
        logits = max(self.buckets[-1] + mixed, self._prefill_rows(PREFILL_TOKENS))
        lw, fits = self.weights.layers[0], self.shape.norms_fit_fp16
        products = (
            (lw.qkv, lw.qkv_scale, lw.qkv_input, fits, tokens),
            (lw.o, lw.o_scale, lw.o_input, False, tokens),
            (lw.gate_up, lw.gate_up_scale, lw.gate_up_input, fits, tokens),
            (lw.down, lw.down_scale, lw.down_input, False, tokens),
            (*self.weights.head, fits, logits),
        )
        with torch.inference_mode():
            for weight, scale, input_scale, fits_fp16, most in products:
                plain = weight.dtype == self.weights.dtype
                if not plain and weight_only.kind_of(weight) is None:
                    continue  # (FP8: torch._scaled_mm)
                for rows in weight_only.ROW_CLASSES:
                    if rows > most or (plain and rows > 1):  # (more rows: cuBLAS)
                        continue
                    x = torch.empty(
                        rows, weight_only.in_features(weight), dtype=self.weights.dtype,
                        device=self.device,
                    )  # fmt: skip
                    quantized.linear(x, weight, scale, input_scale, fits_fp16)

    def _capture(self, compile_: bool) -> None:
        start = time.perf_counter()
        if compile_:
            self.fns = self.architecture.step_functions(self.shape, compile_=True)
            self.compiled = True
            try:
                self._warm_up()
            except Exception:  # a compiler failure costs speed, not service
                logger.exception("fast engine: torch.compile failed, capturing the eager step")
                self.fns = self.architecture.step_functions(self.shape, compile_=False)
                self.compiled = False
        self._warm_up()
        self.timings["warmup_compile_s"] = time.perf_counter() - start
        start = time.perf_counter()
        self.graphs = self._capture_buckets(self._forward)
        self.timings["capture_s"] = time.perf_counter() - start
        start = time.perf_counter()
        try:
            self._capture_prefill()
        except Exception:  # eager prefills cost speed, not service
            logger.exception("fast engine: prefill capture failed, prefills run eagerly")
            self.prefill_graphs = {}
        self.timings["prefill_capture_s"] = time.perf_counter() - start
        start = time.perf_counter()
        if self.mixed_tokens:
            try:
                self._capture_mixed(self.buckets)
            except Exception:  # eager mixed steps cost speed, not service
                logger.exception("fast engine: mixed-step capture failed, they run eagerly")
                self.mixed_graphs = {}
        self.timings["mixed_capture_s"] = time.perf_counter() - start
        logger.info(
            "fast engine: graphs for decode buckets %s, prefill buckets %s and %d mixed "
            "steps, timings %s",
            self.buckets,
            tuple(self.prefill_graphs),
            len(self.mixed_graphs),
            self.timings,
        )

    def _warm_up(self, forward: Callable[[int], object] | None = None) -> None:
        """Run every bucket once (``forward``, the step's by default) on a side stream, the batch
        empty: compiles, loads kernels, settles allocations."""
        with side_stream():
            self.clear()
            for bucket in reversed(self.buckets):
                (forward or self._forward)(bucket)
            self.clear()

    def _capture_buckets(self, forward: Callable[[int], Any]) -> dict[int, tuple[CUDAGraph, Any]]:
        """One CUDA graph of ``forward`` per bucket, largest first, sharing one memory pool;
        each with what ``forward`` returned (the graph's output)."""
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for bucket in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                output = forward(bucket)
            graphs[bucket] = (graph, output)
        torch.cuda.synchronize()
        return graphs
