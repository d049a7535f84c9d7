"""The model engine: loading a model folder and generating with transformers (or the fast engine).

:class:`HFEngine` loads a Hugging Face model folder (config, safetensors, tokenizer with chat
template), renders prompts with the chat template and generates with transformers' ``generate``.
Decoder-only details of generation live here: left padding, the prompt cut from the output,
inference mode. Where and how to load is :mod:`.load_plan`; the tokenizer side (chat template,
stop tokens, decoding) is :mod:`.tokenization`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.streamers import BaseStreamer

from hymt_serve.engine.codec import encode_user_turn, load_tokenizer, make_result, pad_id, stop_ids
from hymt_serve.engine.loading import LoadPlan, load_kwargs, plan_load
from hymt_serve.engine.types import FinishReason, GenerationResult, GenerationRow, SamplingParams
from hymt_serve.ops.tiny_model import TINY_MODEL_MARKER
from hymt_serve.request.errors import (
    ConfigurationError,
    GenerationFailed,
    OutOfMemory,
    ServiceError,
)
from hymt_serve.request.settings import Settings

logger = logging.getLogger(__name__)

HANG_SECONDS = 3600.0  # test_hang_max_new_tokens: far past any response timeout


class HFEngine:
    """A Hugging Face causal LM with its tokenizer, generating with ``model.generate``."""

    def __init__(self, model: Any, tokenizer: Any, plan: LoadPlan, settings: Settings) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.plan = plan
        self.settings = settings
        self.stop_ids = stop_ids(tokenizer, model)
        self.pad_id = pad_id(tokenizer, self.stop_ids)
        self.load_seconds = 0.0
        self.fast: Any = None  # a FastGenerator when the fast engine is in use
        self.fallback_reason: str | None = None
        self.scheduler: Any = None  # a continuous.Scheduler once start_scheduler ran

    @classmethod
    def load(cls, settings: Settings, gpu_id: int | None = None) -> HFEngine:
        """Load the model folder of ``settings.model_path``. Raises ConfigurationError."""
        plan = plan_load(settings, gpu_id)
        if plan.device.type == "cuda":  # Triton and CUDA graphs use the current device
            torch.cuda.set_device(plan.device)
        if not (settings.model_path / "config.json").is_file():
            raise ConfigurationError(f"model_path {str(settings.model_path)!r} has no config.json")
        started = time.perf_counter()
        tokenizer = load_tokenizer(settings)
        model: Any = AutoModelForCausalLM.from_pretrained(settings.model_path, **load_kwargs(plan))
        if plan.quantization == "none":
            model.to(plan.device)
        model.eval()
        _check_context(model.config, settings)
        _freeze_rope(model)
        engine = cls(model, tokenizer, plan, settings)
        engine.load_seconds = time.perf_counter() - started
        logger.info(
            "loaded %s in %.1f s: %s", model.config.model_type, engine.load_seconds, plan.describe()
        )
        return engine

    def encode_prompt(self, user_turn: str) -> list[int]:
        return encode_user_turn(self.tokenizer, user_turn)

    def generate(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        """One result per row; raises OutOfMemory (507) when the device runs out of memory."""
        try:
            self._inject_fault(rows)
            if self.fast is not None:
                return self._generate_fast(rows)
            return self._generate_hf(rows)
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            raise _oom(len(rows)) from exc

    def stream(self, row: GenerationRow, emit: Callable[[list[int]], None]) -> GenerationResult:
        """Generate one row, calling ``emit`` with each step's new token ids.

        Streams go through transformers' ``generate`` (one row at a time), whichever engine
        serves batches. Raises OutOfMemory like :meth:`generate`.
        """
        try:
            self._inject_fault([row])
            return self._generate_group([row], row.sampling, _TokenStreamer(emit))[0]
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            raise _oom(1) from exc

    def start_scheduler(self, max_waiting: int, *, decode: bool = True) -> None:
        """Serve :meth:`submit` from a thread of its own (TorchServe's async mode):
        continuous batching on the fast engine, batches of ``generate`` otherwise.
        ``decode=False`` leaves the results' text empty (the caller decodes the token ids)."""
        from hymt_serve.engine.continuous import ContinuousBatcher
        from hymt_serve.engine.scheduler import GenerateBatcher

        if self.fast is not None:
            self.scheduler = ContinuousBatcher(
                self.fast,
                self.stop_ids,
                self._fast_result if decode else _ids_only,
                max_waiting=max_waiting,
                on_error=map_error,
                before_prefill=self._inject_fault,
            )
        else:
            self.scheduler = GenerateBatcher(
                self.generate,
                self.stream,
                max_rows=self.settings.max_batch_rows,
                max_waiting=max_waiting,
                on_error=map_error,
            )
        self.scheduler.start()

    def submit(
        self, row: GenerationRow, emit: Callable[[list[int]], None] | None = None
    ) -> Future[GenerationResult]:
        """Queue one row for the scheduler; ``emit`` gets new token ids as they come.

        Raises Overloaded (503) when too many rows wait already.
        """
        if self.scheduler is None:
            raise RuntimeError("submit() needs start_scheduler() first")
        future: Future[GenerationResult] = self.scheduler.submit(row, emit)
        return future

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def _inject_fault(self, rows: Sequence[GenerationRow]) -> None:
        """Test-only: a row with ``test_oom_max_new_tokens`` makes its batch run out of memory;
        one with ``test_hang_max_new_tokens`` makes it hang (a wedged worker)."""
        asked = {row.max_new_tokens for row in rows}
        marker = self.settings.test_oom_max_new_tokens
        if marker and marker in asked:
            raise torch.OutOfMemoryError(f"injected by test_oom_max_new_tokens={marker}")
        hang = self.settings.test_hang_max_new_tokens
        if hang and hang in asked:
            logger.warning("hanging: test_hang_max_new_tokens is set (tests only)")
            time.sleep(HANG_SECONDS)

    def _generate_hf(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        by_sampling: dict[SamplingParams | None, list[int]] = defaultdict(list)
        for index, row in enumerate(rows):
            by_sampling[row.sampling].append(index)
        results: list[GenerationResult | None] = [None] * len(rows)
        for sampling, indices in by_sampling.items():
            group = self._generate_group([rows[i] for i in indices], sampling)
            for index, result in zip(indices, group, strict=True):
                results[index] = result
        return [r for r in results if r is not None]

    def _generate_group(
        self,
        rows: Sequence[GenerationRow],
        sampling: SamplingParams | None,
        streamer: BaseStreamer | None = None,
    ) -> list[GenerationResult]:
        input_ids, attention_mask = self._left_pad([row.prompt_ids for row in rows])
        config = self._generation_config(max(row.max_new_tokens for row in rows), sampling)
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                streamer=streamer,
            )
        new_tokens = output[:, input_ids.shape[1] :].tolist()
        return [
            self._result(tokens, row.max_new_tokens)
            for tokens, row in zip(new_tokens, rows, strict=True)
        ]

    def _generate_fast(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        generated = self.fast.generate(rows, self.stop_ids)
        return [self._fast_result(tokens, finish) for tokens, finish in generated]

    def _fast_result(self, tokens: list[int], finish: FinishReason) -> GenerationResult:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return GenerationResult(text, tuple(tokens), finish)

    def _left_pad(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        return ids.to(self.plan.device), mask.to(self.plan.device)

    def _generation_config(self, max_new_tokens: int, sampling: SamplingParams | None) -> Any:
        common = {
            "max_new_tokens": max_new_tokens,
            "eos_token_id": sorted(self.stop_ids),
            "pad_token_id": self.pad_id,
            "bos_token_id": self.tokenizer.bos_token_id,
        }
        if sampling is None:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            repetition_penalty=sampling.repetition_penalty,
            **common,
        )

    def _result(self, tokens: list[int], max_new_tokens: int) -> GenerationResult:
        return make_result(self.tokenizer, tokens[:max_new_tokens], self.stop_ids)

    def describe(self) -> dict[str, Any]:
        config = self.model.config
        if self.fast is not None:
            generation: dict[str, Any] = {"engine": "fast", "fast": self.fast.describe()}
        else:
            generation = {"engine": "hf", "fallback_reason": self.fallback_reason}
        if self.scheduler is not None:
            generation["scheduler"] = self.scheduler.describe()
        return {
            **generation,
            "model_type": config.model_type,
            "model_path": str(self.settings.model_path),
            # The built-in demo model (hymt tiny-model): its output is meaningless text.
            "random_weights": (self.settings.model_path / TINY_MODEL_MARKER).is_file(),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "max_position_embeddings": config.max_position_embeddings,
            "stop_token_ids": sorted(self.stop_ids),
            "load_seconds": round(self.load_seconds, 2),
            **self.plan.describe(),
        }


class _TokenStreamer(BaseStreamer):
    """transformers' streamer hook: the first call carries the prompt, then one step each."""

    def __init__(self, emit: Callable[[list[int]], None]) -> None:
        self._emit = emit
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self._emit(value.reshape(-1).tolist())

    def end(self) -> None:
        pass


def _oom(rows: int) -> OutOfMemory:
    return OutOfMemory(
        f"the device ran out of memory for a batch of {rows} texts",
        allowed="fewer or shorter texts per request, or retry",
    )


def _ids_only(tokens: list[int], finish: FinishReason) -> GenerationResult:
    return GenerationResult("", tuple(tokens), finish)


def map_error(error: BaseException, rows: int) -> BaseException:
    """A scheduler's failure as the ServiceError its requests get."""
    if isinstance(error, ServiceError):
        return error
    if isinstance(error, torch.OutOfMemoryError):
        torch.cuda.empty_cache()
        return _oom(rows)
    return GenerationFailed(
        f"generation failed: {type(error).__name__}", allowed="retry the request"
    )


def _check_context(config: Any, settings: Settings) -> None:
    window = settings.max_input_tokens + settings.max_new_tokens
    limit = int(getattr(config, "max_position_embeddings", window))
    if window > limit:
        raise ConfigurationError(
            f"max_input_tokens + max_new_tokens must be at most the model's "
            f"max_position_embeddings ({limit}), got {settings.max_input_tokens} + "
            f"{settings.max_new_tokens} = {window}"
        )


def _freeze_rope(model: Any) -> None:
    """Treat Hunyuan's alpha-scaled "dynamic" RoPE as the fixed base it is.

    transformers computes the right frequencies at load (base = theta * alpha^(d/(d-2))), but
    its dynamic update branches on the sequence length every step and, past
    max_position_embeddings, recomputes them without alpha. The stored frequencies are right.
    """
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is not None and "dynamic" in str(getattr(rotary, "rope_type", "")):
        rotary.rope_type = "default"


def load_engine(settings: Settings, gpu_id: int | None = None) -> HFEngine:
    """The engine the settings ask for, loaded and ready to generate.

    ``engine: auto`` uses the fast engine (static cache, CUDA-graph decode) on CUDA and
    transformers' ``generate`` elsewhere; ``fast`` asks for it everywhere (on the CPU it runs
    the same code without graphs). When it cannot be used, generation falls back to ``hf``
    and the reason is logged and shown in the describe output.
    """
    engine = HFEngine.load(settings, gpu_id)
    wanted = settings.engine
    if wanted == "hf" or (wanted == "auto" and engine.plan.device.type != "cuda"):
        engine.fallback_reason = None if wanted == "hf" else "auto: no CUDA device"
        return engine
    reason = attach_fast_generator(engine)
    if reason:
        engine.fallback_reason = reason
        logger.warning("fast engine not used (%s): generating with transformers", reason)
    return engine


def attach_fast_generator(engine: HFEngine) -> str | None:
    """Give ``engine`` a FastGenerator; returns why not, or None when attached."""
    if engine.plan.quantization != "none":
        return f"quantization {engine.plan.quantization!r} (bitsandbytes weights)"
    from hymt_serve.engine.fast import FastGenerator, UnsupportedModelError

    settings = engine.settings
    max_seq_len = settings.max_input_tokens + settings.max_new_tokens
    rows = _cache_rows(engine.model, max_seq_len, settings.max_batch_rows, engine.plan.device)
    if rows < 1:
        return "not enough free device memory for a KV cache of one row"
    try:
        engine.fast = FastGenerator.from_model(
            engine.model, max_batch_size=rows, max_seq_len=max_seq_len
        )
    except UnsupportedModelError as error:
        return error.reason
    logger.info("fast engine ready: %s", engine.fast.describe())
    return None


KV_CACHE_SHARE = 0.8  # of the device memory left after the weights


def _cache_rows(model: Any, max_seq_len: int, wanted: int, device: torch.device) -> int:
    """Rows of ``max_seq_len`` tokens whose KV cache fits the free device memory."""
    if device.type != "cuda":
        return wanted
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = (
        config.num_hidden_layers
        * config.num_key_value_heads
        * head_dim
        * 2
        * next(model.parameters()).element_size()
    )
    from hymt_serve.engine.fast import STEP_HEADROOM

    free, _ = torch.cuda.mem_get_info(device)
    cache_len = max_seq_len + STEP_HEADROOM  # as FastGenerator sizes it
    return min(wanted, int(free * KV_CACHE_SHARE) // int(per_token * cache_len))
