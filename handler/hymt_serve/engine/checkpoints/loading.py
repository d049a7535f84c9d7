"""Loading a model folder: where and how (device, dtype, attention kernel, quantization,
decided before loading), the transformers model itself, and its checks against the settings.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hymt_serve.core.config import Quantization
from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.engine.checkpoints.fp8 import Fp8Scales, fp8_scheme, read_config, read_scales
from hymt_serve.engine.checkpoints.fp8_moe import load_hy_v3_fp8
from hymt_serve.engine.checkpoints.gptq import gptq_config, load_gptq_weights
from hymt_serve.engine.kernels import weight_only
from hymt_serve.engine.kernels.quantized import Int4Parts

logger = logging.getLogger(__name__)
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class LoadPlan:
    """Where and how the model is loaded, decided before loading (and reported after)."""

    device: torch.device
    dtype: torch.dtype
    attention: str
    quantization: Quantization
    blas_library: str = "none"  # CUDA: the library dense products go to
    one_row_kernel: str = "none"  # CUDA: where one row of a plain product goes
    cpu_threads: int = 0  # CPU: the threads of each operation (0 on CUDA)

    def describe(self) -> dict[str, str]:
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention": self.attention,
            "quantization": self.quantization.value,
            "blas_library": self.blas_library,
            "one_row_kernel": self.one_row_kernel,
            "cpu_threads": str(self.cpu_threads) if self.cpu_threads else "none",
        }


def plan_load(settings: Settings, gpu_id: int | None = None) -> LoadPlan:
    """Resolve the ``auto`` settings against this machine. Raises ConfigurationError."""
    cuda = torch.cuda.is_available()
    if settings.loading.device == "cuda" and not cuda:
        raise ConfigurationError("device is 'cuda' but no CUDA device is available")
    use_cuda = cuda and settings.loading.device != "cpu"
    device = torch.device("cuda", gpu_id or 0) if use_cuda else torch.device("cpu")
    return LoadPlan(
        device,
        _dtype(settings.loading.dtype, device),
        _attention(settings.loading.attention, device),
        _quantization(settings.loading.quantization, device),
        settings.loading.blas_library if use_cuda else "none",
        one_row_kernel(settings.loading.one_row_kernel, device),
        0 if use_cuda else settings.loading.cpu_threads or torch.get_num_threads(),
    )


def one_row_kernel(name: str, device: torch.device) -> str:
    """``one_row_kernel`` resolved: ``auto`` is the Triton kernel on Hopper (compute capability
    9.x, where it reads one row's weights faster than cuBLAS) and cuBLAS on other GPUs; "none"
    off CUDA."""
    if device.type != "cuda":
        return "none"
    if name != "auto":
        return name
    return "triton" if torch.cuda.get_device_capability(device)[0] == 9 else "cublas"


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _attention(name: str, device: torch.device) -> str:
    has_flash = importlib.util.find_spec("flash_attn") is not None
    if name == "auto":
        return "flash_attention_2" if has_flash and device.type == "cuda" else "sdpa"
    if name == "flash_attention_2" and not (has_flash and device.type == "cuda"):
        raise ConfigurationError(
            "attention 'flash_attention_2' needs the flash_attn package and a CUDA device; "
            "use 'auto' or 'sdpa' (PyTorch SDPA runs FlashAttention kernels on recent GPUs)"
        )
    return name


def _quantization(name: Quantization, device: torch.device) -> Quantization:
    if name is Quantization.NONE:
        return name
    if name is Quantization.FP8:
        return _fp8(device)
    if name.fast:  # the fast engine's own weight-only kinds: any device
        return name
    if device.type != "cuda":
        raise ConfigurationError(f"quantization {name.value!r} needs a CUDA device (bitsandbytes)")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigurationError(
            f"quantization {name.value!r} needs bitsandbytes: "
            "pip install 'hunyuan-mt-torchserve[quantization]'"
        )
    return name


# FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards.
FP8_CAPABILITY = (8, 9)


def _fp8(device: torch.device) -> Quantization:
    """FP8 runs on the fast engine: ``torch._scaled_mm`` on GPUs of compute capability 8.9 and
    later, its dequantized reference on the CPU (slow: tests and checks). Older GPUs are
    refused with what to use instead."""
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_CAPABILITY:
            raise ConfigurationError(
                f"quantization 'fp8' needs FP8 tensor cores (compute capability 8.9 or "
                f"later); {torch.cuda.get_device_name(device)} has "
                f"{capability[0]}.{capability[1]}: use quantization 'int8' (weight-only) or 'none'"
            )
    return Quantization.FP8


def load_kwargs(plan: LoadPlan) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "dtype": plan.dtype,
        "low_cpu_mem_usage": True,
        "attn_implementation": plan.attention,
    }
    if plan.quantization.bitsandbytes:
        # A lazy attribute of transformers: its quantization configs load only for bitsandbytes.
        from transformers import BitsAndBytesConfig

        kwargs["device_map"] = {"": plan.device}
        kwargs["quantization_config"] = (
            BitsAndBytesConfig(load_in_8bit=True)
            if plan.quantization is Quantization.BNB_INT8
            else BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=plan.dtype,
                bnb_4bit_use_double_quant=True,
            )
        )
    return kwargs


@dataclass(frozen=True)
class LoadedModel:
    """A transformers causal LM, ready for inference, with how it was loaded."""

    model: Any
    plan: LoadPlan
    seconds: float
    parameters: int = 0  # counted at load (fp8 releases the model's own projection weights)
    fp8_scales: Fp8Scales | None = None  # an FP8 checkpoint's scales (Tencent's -fp8 models)
    checkpoint_format: str | None = None  # what a quantized checkpoint was, and what became of it
    int4: Int4Parts | None = None  # a GPTQ checkpoint's projections in the int4 kernel's form


def load_model(settings: Settings, gpu_id: int | None = None) -> LoadedModel:
    """Load ``settings.model_path``'s weights as the settings ask. Raises ConfigurationError."""
    plan = plan_load(settings, gpu_id)
    if plan.device.type == "cuda":  # Triton and CUDA graphs use the current device
        torch.cuda.set_device(plan.device)
        if plan.blas_library != "cublas":  # process-wide, before any graph is captured
            torch.backends.cuda.preferred_blas_library(plan.blas_library)
        weight_only.set_plain_row_kernel(plan.one_row_kernel)
    else:  # process-wide: this engine's share of the cores
        torch.set_num_threads(plan.cpu_threads)
    if not (settings.model_path / "config.json").is_file():
        raise ConfigurationError(f"model_path {str(settings.model_path)!r} has no config.json")
    started = time.perf_counter()
    kwargs = load_kwargs(plan)
    raw = read_config(settings.model_path)
    gptq = _gptq_checkpoint(settings, raw, kwargs)
    int4: Int4Parts | None = None
    model: Any
    plan, scales = (plan, None) if gptq else _fp8_checkpoint(settings, plan, raw, kwargs)
    if scales is not None and raw.get("model_type") == "hy_v3":  # its experts stay e4m3
        model, scales = load_hy_v3_fp8(
            settings.model_path, kwargs["config"], raw, plan.device, plan.dtype
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(settings.model_path, **kwargs)
    if gptq:
        count, int4 = load_gptq_weights(model, settings.model_path)
        logger.info("read %d GPTQ-Int4 projections (%d in int4 form)", count, len(int4))
    if not plan.quantization.bitsandbytes:  # fp8, int8, int4: quantized by the fast engine
        model.to(plan.device)
    model.eval()
    _check_context(model.config, settings)
    _freeze_rope(model)
    seconds = time.perf_counter() - started
    logger.info("loaded %s in %.1f s: %s", model.config.model_type, seconds, plan.describe())
    parameters = sum(p.numel() for p in model.parameters())
    described = scales.describe() if scales else "GPTQ-Int4 checkpoint" if gptq else None
    return LoadedModel(model, plan, seconds, parameters, scales, described, int4 or None)


def _gptq_checkpoint(settings: Settings, raw: dict[str, Any], kwargs: dict[str, Any]) -> bool:
    """For a GPTQ-Int4 checkpoint: a config without ``quantization_config`` in ``kwargs`` (its
    projections are dequantized after the load). Raises ConfigurationError for a GPTQ variant
    this loader cannot read, or another quantization asked on top of it."""
    if gptq_config(raw) is None:
        return False
    asked = settings.loading.quantization
    if not asked.fits_checkpoint(Quantization.GPTQ_INT4):
        raise ConfigurationError(
            f"this is a GPTQ-Int4 checkpoint: quantization {asked.value!r} cannot "
            "apply to it (leave quantization 'none')"
        )
    config = AutoConfig.from_pretrained(settings.model_path)
    del config.quantization_config
    kwargs["config"] = config
    return True


def _fp8_checkpoint(
    settings: Settings, plan: LoadPlan, raw: dict[str, Any], kwargs: dict[str, Any]
) -> tuple[LoadPlan, Fp8Scales | None]:
    """For an FP8 checkpoint: its scales, the plan's quantization "fp8", and a config without
    ``quantization_config`` in ``kwargs`` (transformers then reads each FP8 weight into the
    model's dtype, exactly; the fast engine turns it back into e4m3). Raises
    ConfigurationError for another quantization, or one the settings contradict."""
    static = fp8_scheme(raw)
    if static is None:
        return plan, None
    asked = settings.loading.quantization
    if not asked.fits_checkpoint(Quantization.FP8):
        raise ConfigurationError(
            f"this is an FP8 checkpoint: quantization {asked.value!r} cannot apply "
            "to it (leave quantization 'none')"
        )
    plan = replace(plan, quantization=_fp8(plan.device))
    config = AutoConfig.from_pretrained(settings.model_path)
    del config.quantization_config
    kwargs["config"] = config
    if raw.get("model_type") == "hy_v3":  # its scales come with its experts (load_hy_v3_fp8)
        return plan, Fp8Scales({}, {}, static)
    return plan, read_scales(settings.model_path, raw, static)


def _check_context(config: Any, settings: Settings) -> None:
    window = settings.limits.max_input_tokens + settings.limits.max_new_tokens
    limit = int(getattr(config, "max_position_embeddings", window))
    if window > limit:
        raise ConfigurationError(
            f"max_input_tokens + max_new_tokens must be at most the model's "
            f"max_position_embeddings ({limit}), got {settings.limits.max_input_tokens} + "
            f"{settings.limits.max_new_tokens} = {window}"
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
