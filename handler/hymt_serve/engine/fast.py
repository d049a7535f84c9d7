"""Fast generation for ``hunyuan_v1_dense``: static KV cache, CUDA-graph decode steps.

:class:`FastGenerator` wraps an already loaded ``AutoModelForCausalLM`` and reuses its weight
tensors (q/k/v and gate/up are fused in place, see :func:`hymt_serve.engine.model.fuse_linears`).
Prefill runs eagerly; each decode step replays a CUDA graph captured for the smallest batch
bucket that holds the live rows. The host checks for finished rows every ``sync_every`` steps
only; finished rows then leave the batch, which shrinks to a smaller bucket.

Errors: :class:`UnsupportedModelError` from :meth:`FastGenerator.from_model` when the model
cannot run here; ``ValueError`` from :meth:`FastGenerator.generate` for rows that do not fit.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hymt_serve.engine.attention import TRITON_KERNEL, kernel_name, num_splits
from hymt_serve.engine.model import ModelShape, extract_weights
from hymt_serve.engine.runner import PREFILL_BUCKETS, DecodeRunner
from hymt_serve.engine.sampling import RowSampling, record_tokens, sample_next
from hymt_serve.engine.types import FinishReason, GenerationRow, cut_at_stop

SYNC_EVERY = 8
# Decode steps the host may queue past a read-back before it waits for it (continuous batching).
LOOKAHEAD = 2
# Cache positions past max_seq_len: a finished row keeps stepping until the host learns that it
# finished (at most SYNC_EVERY steps, plus LOOKAHEAD twice when read-backs are pipelined).
STEP_HEADROOM = 16
assert SYNC_EVERY + 2 * LOOKAHEAD < STEP_HEADROOM
PREFILL_TOKENS = PREFILL_BUCKETS[-1]
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class UnsupportedModelError(Exception):
    """The model cannot run on the fast engine; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_model(model: nn.Module) -> ModelShape:
    """The model's shape, or :class:`UnsupportedModelError` naming the first obstacle."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "hunyuan_v1_dense":
        raise UnsupportedModelError(f"model_type must be hunyuan_v1_dense, got {config!r:.80}")
    if getattr(model, "hf_quantizer", None) is not None or getattr(model, "is_quantized", False):
        raise UnsupportedModelError("quantized weights (bitsandbytes etc.) are not supported")
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and type(module) is not nn.Linear:
            raise UnsupportedModelError(f"{name} is a {type(module).__name__}, not nn.Linear")
    _check_tensors(model)
    if config.hidden_act != "silu" or config.attention_bias:  # type: ignore[union-attr]
        raise UnsupportedModelError("only hidden_act=silu without attention bias is supported")
    _check_rope(model)
    return ModelShape(
        layers=config.num_hidden_layers,  # type: ignore[union-attr]
        heads=config.num_attention_heads,  # type: ignore[union-attr]
        kv_heads=config.num_key_value_heads,  # type: ignore[union-attr]
        head_dim=model.model.layers[0].self_attn.head_dim,  # type: ignore[union-attr,index]
        eps=float(config.rms_norm_eps),  # type: ignore[union-attr]
        vocab=config.vocab_size,  # type: ignore[union-attr]
    )


def _check_tensors(model: nn.Module) -> None:
    devices = {p.device for p in model.parameters()}
    dtypes = {p.dtype for p in model.parameters()}
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        raise UnsupportedModelError(f"weights must sit on one real device, got {devices}")
    if len(dtypes) != 1 or next(iter(dtypes)) not in _FLOAT_DTYPES:
        raise UnsupportedModelError(f"weights must share one float dtype, got {dtypes}")


def _check_rope(model: nn.Module) -> None:
    hf: Any = model
    rotary = hf.model.rotary_emb
    params = hf.config.rope_parameters or {}
    fixed = rotary.rope_type == "default" or (rotary.rope_type == "dynamic" and params.get("alpha"))
    if not fixed or getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise UnsupportedModelError(f"RoPE {params} changes with position; only fixed bases run")


class FastGenerator:
    """Batched greedy/sampled generation over a static cache with captured decode steps."""

    def __init__(self, runner: DecodeRunner, *, max_seq_len: int, max_positions: int) -> None:
        self._runner = runner
        self._max_seq_len = max_seq_len
        self._max_positions = max_positions
        self._ready_s = 0.0

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        *,
        max_batch_size: int,
        max_seq_len: int,
        use_cuda_graphs: bool | None = None,
        compile_model: bool | None = None,
    ) -> FastGenerator:
        """Wrap ``model``; on CUDA compile and capture one decode graph per batch bucket.

        ``max_seq_len`` bounds prompt + new tokens of a row; the cache holds ``max_batch_size``
        rows of that length (``layers x kv_heads x head_dim x 2 x dtype bytes`` per token).
        ``compile_model`` (None = same as graphs) runs inductor over the step before capture.
        Raises :class:`UnsupportedModelError` if the model cannot run here.
        """
        start = time.perf_counter()
        shape = check_model(model)
        if max_batch_size < 1 or max_seq_len < 2:
            raise ValueError(
                f"need max_batch_size >= 1 and max_seq_len >= 2, got "
                f"{max_batch_size} and {max_seq_len}"
            )
        param = next(model.parameters())
        capturable = kernel_name(param.device, param.dtype) == TRITON_KERNEL
        graphs = capturable if use_cuda_graphs is None else use_cuda_graphs
        if graphs and not capturable:
            raise UnsupportedModelError("CUDA graphs need a bf16/fp16 model on CUDA with Triton")
        with torch.inference_mode():
            runner = DecodeRunner(
                extract_weights(model),
                shape,
                max_batch_size=max_batch_size,
                cache_len=max_seq_len + STEP_HEADROOM,
            )
            if graphs:
                runner.capture(compile_=graphs if compile_model is None else compile_model)
        max_positions = int(getattr(model.config, "max_position_embeddings", 0))
        generator = cls(runner, max_seq_len=max_seq_len, max_positions=max_positions)
        generator._ready_s = time.perf_counter() - start
        return generator

    @property
    def runner(self) -> DecodeRunner:
        return self._runner

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    def describe(self) -> dict[str, object]:
        """What runs: buckets, graphs, attention kernel, cache size, timings."""
        runner = self._runner
        device, dtype = runner.weights.embed.device, runner.weights.embed.dtype
        return {
            "engine": "fast",
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "buckets": list(runner.buckets),
            "cuda_graphs": bool(runner.graphs),
            "compiled": runner.compiled,
            "attention_kernel": kernel_name(device, dtype),
            "attention_splits": {
                b: num_splits(b, runner.shape.kv_heads, runner.cache_len) for b in runner.buckets
            },
            "max_batch_size": runner.max_batch_size,
            "max_seq_len": self._max_seq_len,
            "kv_cache_gb": round(runner.kv_cache_bytes / 1e9, 3),
            "sync_every": SYNC_EVERY,
            "ready_s": round(self._ready_s, 2),
            **{k: round(v, 2) for k, v in runner.timings.items()},
        }

    def generate(
        self, rows: Sequence[GenerationRow], stop_token_ids: Collection[int]
    ) -> list[tuple[list[int], FinishReason]]:
        """Generate for each row; per row (tokens without prompt and stop token, reason).

        Raises ``ValueError`` when a row is empty or does not fit ``max_seq_len`` or the
        model's ``max_position_embeddings``.
        """
        for row in rows:
            self.check_row(row)
        results: list[tuple[list[int], FinishReason]] = []
        size = self._runner.max_batch_size
        with torch.inference_mode():
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                tokens = self._generate_chunk(chunk, stop_token_ids)
                results.extend(_finish(tokens, chunk, set(stop_token_ids)))
        return results

    def teacher_forced_logits(self, prompts: Sequence[Sequence[int]], forced: Tensor) -> Tensor:
        """Logits after each prompt and after each forced token ``[B, k]`` -> ``[B, k+1, V]``.

        Runs the same prefill and decode steps (graphs included) as :meth:`generate`; for tests
        and benchmarks that compare logits with another implementation.
        """
        with torch.inference_mode():
            runner, count = self._runner, len(prompts)
            logits = [self.prefill(prompts, range(count))]
            lengths = torch.tensor([len(p) for p in prompts], device=forced.device)
            slots = torch.arange(count, device=forced.device)
            bucket = runner.load(forced[:, 0], lengths, slots)
            for k in range(forced.shape[1]):
                logits.append(runner.step(bucket)[:count].clone())
                if k + 1 < forced.shape[1]:
                    next_tokens = runner.tokens[:bucket].clone()
                    next_tokens[:count] = forced[:, k + 1]
                    runner.advance(bucket, next_tokens)
            return torch.stack(logits, dim=1)

    def check_row(self, row: GenerationRow) -> None:
        """Raise ``ValueError`` unless ``row`` fits the cache and the model's positions."""
        total = len(row.prompt_ids) + row.max_new_tokens
        if not row.prompt_ids or row.max_new_tokens < 1:
            raise ValueError("a row needs at least one prompt token and max_new_tokens >= 1")
        if total > self._max_seq_len or total >= self._max_positions:
            raise ValueError(
                f"prompt + max_new_tokens must be <= max_seq_len={self._max_seq_len} and "
                f"< max_position_embeddings={self._max_positions}, got {total}"
            )

    def prefill(self, prompts: Sequence[Sequence[int]], slots: Sequence[int]) -> Tensor:
        """Fill the cache ``slots`` with ``prompts``; logits after each prompt ``[B, V]``.

        Runs in groups of at most ``PREFILL_TOKENS`` packed tokens (a longer prompt alone).
        Call in inference mode; does not wait for the device. The logits of a single group
        may live in the runner's prefill buffer: use them before the next prefill.
        """
        groups, start, tokens = [], 0, 0
        for end, prompt in enumerate(prompts):
            if end > start and tokens + len(prompt) > PREFILL_TOKENS:
                groups.append((start, end))
                start, tokens = end, 0
            tokens += len(prompt)
        groups.append((start, len(prompts)))
        if len(groups) == 1:
            return self._runner.prefill(prompts, slots)
        return torch.cat(
            [self._runner.prefill(prompts[a:b], slots[a:b]).clone() for a, b in groups]
        )

    def _generate_chunk(self, rows: Sequence[GenerationRow], stop_ids: Collection[int]) -> Tensor:
        runner, device, count = self._runner, self._runner.tokens.device, len(rows)
        sampling = RowSampling.for_rows(rows, runner.shape.vocab, device)
        steps = max(row.max_new_tokens for row in rows)
        out = torch.zeros(count + 1, steps, dtype=torch.int64, device=device)
        loop = _DecodeLoop(runner, sampling, rows, stop_ids, out)
        logits = self.prefill([row.prompt_ids for row in rows], range(count))
        loop.start(logits)
        loop.run(steps)
        return out[:count].cpu()


class _DecodeLoop:
    """The decode loop of one chunk: sample, record, check for finished rows now and then."""

    def __init__(
        self,
        runner: DecodeRunner,
        sampling: RowSampling,
        rows: Sequence[GenerationRow],
        stop_ids: Collection[int],
        out: Tensor,
    ) -> None:
        device = out.device
        self.runner, self.sampling, self.out = runner, sampling, out
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.int64, device=device)
        self.max_new = torch.tensor([r.max_new_tokens for r in rows] + [1], device=device)
        self.prompt_lens = torch.tensor([len(r.prompt_ids) for r in rows], device=device)
        self.done = torch.zeros(len(rows) + 1, dtype=torch.bool, device=device)
        self.alive = list(range(len(rows)))
        self.max_new_host = [r.max_new_tokens for r in rows]
        self.padding_row = len(rows)

    def start(self, prefill_logits: Tensor) -> None:
        rows = torch.arange(len(self.alive), device=self.out.device)
        tokens = self._sample_and_record(prefill_logits, rows, self.sampling.select(rows), 0)
        self.bucket = self.runner.load(tokens, self.prompt_lens, rows)
        self._set_rows()

    def run(self, steps: int) -> None:
        for step in range(1, steps):
            if step % SYNC_EVERY == 0 and not self._drop_finished():
                return
            if step >= max(self.max_new_host[r] for r in self.alive):
                return
            logits = self.runner.step(self.bucket)
            tokens = self._sample_and_record(logits, self.rows, self.batch, step)
            self.runner.advance(self.bucket, tokens)

    def _set_rows(self) -> None:
        padding = [self.padding_row] * (self.bucket - len(self.alive))
        self.rows = torch.tensor(self.alive + padding, device=self.out.device)
        self.batch = self.sampling.select(self.rows)

    def _sample_and_record(
        self, logits: Tensor, rows: Tensor, batch: RowSampling, step: int
    ) -> Tensor:
        tokens = sample_next(logits, batch, rows)
        record_tokens(batch, rows, tokens)
        self.out[rows, step] = tokens
        finished = torch.isin(tokens, self.stop_ids) | (self.max_new[rows] <= step + 1)
        self.done[rows] |= finished
        return tokens

    def _drop_finished(self) -> bool:
        """Compact the batch to the rows still running; False when none is left."""
        done = self.done.tolist()
        keep = [i for i, row in enumerate(self.alive) if not done[row]]
        if len(keep) == len(self.alive):
            return True
        self.alive = [self.alive[i] for i in keep]
        if not self.alive:
            return False
        self.bucket = self.runner.compact(torch.tensor(keep, device=self.out.device))
        self._set_rows()
        return True


def _finish(
    tokens: Tensor, rows: Sequence[GenerationRow], stop_ids: set[int]
) -> list[tuple[list[int], FinishReason]]:
    return [
        cut_at_stop(generated[: row.max_new_tokens], stop_ids)
        for row, generated in zip(rows, tokens.tolist(), strict=True)
    ]
