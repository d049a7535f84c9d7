"""Where and how a model is loaded, decided before loading: device, dtype, attention kernel,
quantization, and the keyword arguments transformers gets for them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from hymt_serve.request.errors import ConfigurationError
from hymt_serve.request.settings import Settings

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class LoadPlan:
    """Where and how the model is loaded, decided before loading (and reported after)."""

    device: torch.device
    dtype: torch.dtype
    attention: str
    quantization: str

    def describe(self) -> dict[str, str]:
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention": self.attention,
            "quantization": self.quantization,
        }


def plan_load(settings: Settings, gpu_id: int | None = None) -> LoadPlan:
    """Resolve the ``auto`` settings against this machine. Raises ConfigurationError."""
    cuda = torch.cuda.is_available()
    if settings.device == "cuda" and not cuda:
        raise ConfigurationError("device is 'cuda' but no CUDA device is available")
    use_cuda = cuda and settings.device != "cpu"
    device = torch.device("cuda", gpu_id or 0) if use_cuda else torch.device("cpu")
    return LoadPlan(
        device,
        _dtype(settings.dtype, device),
        _attention(settings.attention, device),
        _quantization(settings.quantization, device),
    )


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


def _quantization(name: str, device: torch.device) -> str:
    if name == "none":
        return name
    if device.type != "cuda":
        raise ConfigurationError(f"quantization {name!r} needs a CUDA device (bitsandbytes)")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigurationError(
            f"quantization {name!r} needs bitsandbytes: "
            "pip install 'hunyuan-mt-torchserve[quantization]'"
        )
    return name


def load_kwargs(plan: LoadPlan) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "dtype": plan.dtype,
        "low_cpu_mem_usage": True,
        "attn_implementation": plan.attention,
    }
    if plan.quantization != "none":
        from transformers import BitsAndBytesConfig

        kwargs["device_map"] = {"": plan.device}
        kwargs["quantization_config"] = (
            BitsAndBytesConfig(load_in_8bit=True)
            if plan.quantization == "int8"
            else BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=plan.dtype,
                bnb_4bit_use_double_quant=True,
            )
        )
    return kwargs
