"""The engine: a loaded model behind one scheduler, entered through :meth:`Engine.submit`.

:func:`load_engine` loads the model folder and its token codec and picks the runner: the fast
engine (:mod:`hymt_serve.engine.runners.build`: static KV cache, CUDA graphs, continuous
batching) where the model supports it, transformers' forward
(:mod:`hymt_serve.engine.runners.hf_forward`) otherwise. Either way the same
:class:`~hymt_serve.engine.scheduler.loop.Scheduler` admits rows, steps, samples, stops and
streams.

Use: ``submit(row, on_tokens) -> future`` for each row, then :meth:`Engine.run` (step on this
thread until those futures are done) or :meth:`Engine.start` once (a serving thread steps:
TorchServe's async mode). :meth:`Engine.generate` is "submit all, run until done".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from hymt_serve.core.config import Quantization
from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import (
    TINY_MODEL_MARKER,
    ChatTurn,
    FinishReason,
    GenerationResult,
    GenerationRow,
    OnTokens,
)
from hymt_serve.engine.checkpoints.loading import (
    LoadedModel,
    load_model,
)
from hymt_serve.engine.codec import TokenCodec
from hymt_serve.engine.compile_cache import CompileCache, engine_inputs, open_cache, resolve_root
from hymt_serve.engine.runners.hf_forward import HFRunner
from hymt_serve.engine.runners.protocol import Runner
from hymt_serve.engine.scheduler.loop import Scheduler

logger = logging.getLogger(__name__)

GPTQ = Quantization.GPTQ_INT4.value  # a GPTQ checkpoint's, whatever the setting says


class Engine:
    """A model, its token codec, a runner and the scheduler that drives it."""

    def __init__(
        self,
        loaded: LoadedModel,
        codec: TokenCodec,
        runner: Runner,
        settings: Settings,
        *,
        fallback_reason: str | None = None,
        max_waiting: int | None = None,
        decode: bool = True,
    ) -> None:
        self.loaded, self.codec, self.runner, self.settings = loaded, codec, runner, settings
        self.fallback_reason = fallback_reason
        self.scheduler = Scheduler(
            runner,
            codec.stop_ids,
            codec.result if decode else _ids_only,
            max_seq_len=settings.limits.max_input_tokens + settings.limits.max_new_tokens,
            max_waiting=max_waiting,
            before_prefill=settings.before_prefill,
            decode=codec.decode,  # rows' stop strings end them (results' text or not)
        )

    @property
    def fast(self) -> bool:
        return not isinstance(self.runner, HFRunner)

    def encode_prompt(self, user_turn: str) -> list[int]:
        return self.codec.encode(user_turn)

    def encode_chat(self, turns: Sequence[ChatTurn]) -> list[int]:
        return self.codec.encode_chat(turns)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.codec.decode(token_ids)

    def submit(
        self, row: GenerationRow, on_tokens: OnTokens | None = None
    ) -> Future[GenerationResult]:
        """Queue one row; ``on_tokens`` gets its new token ids as they come (on the thread that
        steps). Raises ContextTooLong for a row that does not fit, QueueFull when too many rows
        wait; failures while generating come as the future's EngineError."""
        return self.scheduler.submit(row, on_tokens)

    def run(self, futures: Sequence[Future[Any]]) -> None:
        """Return once every future is done (stepping on this thread unless started)."""
        self.scheduler.run(futures)

    def generate(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        """Offline generation: submit every row, run until done; raises the first failure."""
        futures = [self.submit(row) for row in rows]
        self.run(futures)
        return [future.result() for future in futures]

    def start(self) -> None:
        """Step on a serving thread from now on (TorchServe's async mode)."""
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.close()

    def describe(self) -> dict[str, Any]:
        config = self.loaded.model.config
        continuous = self.runner.can_admit(1)  # rows join a running batch
        generation: dict[str, Any] = (
            {"engine": "fast", "fast": self.runner.describe()}
            if self.fast
            else {"engine": "hf", "fallback_reason": self.fallback_reason}
        )
        scheduler = {"scheduler": "continuous" if continuous else "batch"}
        return {
            **generation,
            "scheduler": {**scheduler, **self.scheduler.describe()},
            "model_type": config.model_type,
            "model_path": str(self.settings.model_path),
            # The built-in demo model (hymt tiny-model): its output is meaningless text.
            "random_weights": (self.settings.model_path / TINY_MODEL_MARKER).is_file(),
            "parameters": self.loaded.parameters,
            "max_position_embeddings": config.max_position_embeddings,
            "stop_token_ids": sorted(self.codec.stop_ids),
            "load_seconds": round(self.loaded.seconds, 2),
            "weights_format": _weights_format_of(self.loaded, self.fast),
            **self.loaded.plan.describe(),
            # a GPTQ checkpoint is quantized whatever the setting says (hymt_engine_info too)
            **({"quantization": GPTQ} if self.loaded.int4 is not None else {}),
        }


def _weights_format_of(loaded: LoadedModel, fast: bool) -> str:
    """How the weights came (dtype, or the quantized checkpoint's format) and what became of
    them at load."""
    if loaded.fp8_scales is not None:
        return loaded.fp8_scales.describe()
    parts = [loaded.checkpoint_format or str(loaded.model.dtype).removeprefix("torch.")]
    if loaded.int4 is not None:
        parts.append("int4 weight-only in the fast engine" if fast else "dequantized at load")
    elif loaded.plan.quantization.fast:
        parts.append(f"quantized to {loaded.plan.quantization.value} at load")
    return ", then ".join(parts)


def load_engine(
    settings: Settings,
    gpu_id: int | None = None,
    *,
    max_waiting: int | None = None,
    decode: bool = True,
) -> Engine:
    """The engine the settings ask for, loaded and ready to generate.

    ``engine: auto`` uses the fast engine on CUDA and transformers' forward elsewhere; ``fast``
    asks for the fast engine everywhere (on the CPU it runs the same code without graphs).
    When it cannot be used, generation falls back to transformers and the reason is logged
    and shown in the describe output. ``max_waiting`` bounds the rows that may wait (None: no
    bound); ``decode=False`` leaves results' text empty (the caller decodes the token ids).
    """
    codec = TokenCodec.load(settings)
    loaded = load_model(settings, gpu_id)
    runner, reason = _pick_runner(loaded, codec, settings)
    if reason:
        logger.warning("fast engine not used (%s): generating with transformers", reason)
    return Engine(
        loaded,
        codec,
        runner,
        settings,
        fallback_reason=reason,
        max_waiting=max_waiting,
        decode=decode,
    )


def _pick_runner(
    loaded: LoadedModel, codec: TokenCodec, settings: Settings
) -> tuple[Runner, str | None]:
    """The fast runner, or the transformers runner and why not the fast one."""
    wanted, plan = settings.loading.engine, loaded.plan
    own = plan.quantization.fast  # the fast engine's own: no fallback
    head_follows = plan.quantization.head_may_follow or loaded.int4 is not None
    if settings.loading.quantize_lm_head and not head_follows:
        raise ConfigurationError(
            "quantize_lm_head quantizes the LM head beside fp8, int8 or int4 projections; this "
            f"model's are {plan.quantization.value}: set quantization 'fp8', 'int8' or 'int4', or "
            "leave quantize_lm_head false"
        )
    if own and wanted == "hf":
        raise ConfigurationError(
            f"quantization {plan.quantization.value!r} runs on the fast engine: set engine auto"
        )
    rows = settings.scheduler.max_batch_rows
    hf = HFRunner(loaded.model, pad_id=codec.pad_id, max_batch_size=rows)
    if wanted == "hf":
        return hf, None
    if wanted == "auto" and plan.device.type != "cuda" and not own:
        return hf, "auto: no CUDA device"
    if plan.quantization.bitsandbytes:
        return hf, f"quantization {plan.quantization.value!r} (bitsandbytes weights)"
    # The fast engine's modules import Triton and define its kernels: loaded only when tried.
    from hymt_serve.engine.runners.build import UnsupportedModelError, build_fast_runner

    try:
        runner: Runner = build_fast_runner(
            loaded.model,
            max_batch_size=settings.scheduler.max_batch_rows,
            max_seq_len=settings.limits.max_input_tokens + settings.limits.max_new_tokens,
            quantize=plan.quantization if own else Quantization.NONE,
            fp8_scales=loaded.fp8_scales,
            int4=loaded.int4,
            quantize_head=settings.loading.quantize_lm_head,
            prefix_entries=settings.scheduler.prefix_cache_entries,
            mixed_tokens=settings.scheduler.mixed_step_tokens,
            open_compile_cache=lambda: _open_compile_cache(loaded, settings, own),
        )
    except UnsupportedModelError as error:
        if own:
            name = plan.quantization.value
            reason = f"quantization {name!r} needs the fast engine: {error.reason}"
            raise ConfigurationError(reason) from None
        return hf, error.reason
    return runner, None


def _open_compile_cache(loaded: LoadedModel, settings: Settings, own: bool) -> CompileCache | None:
    """The compile cache of this model, card, precision and code (None when off)."""
    root = resolve_root(settings.loading.compile_cache_dir)
    if root is None:
        return None
    quantization = loaded.plan.quantization.value if own else Quantization.NONE.value
    if loaded.int4 is not None:
        quantization = GPTQ
    return open_cache(root, engine_inputs(settings, loaded, quantization))


def _ids_only(tokens: list[int], finish: FinishReason) -> GenerationResult:
    return GenerationResult("", tuple(tokens), finish)
