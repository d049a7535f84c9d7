"""What the fast runner needs of a model architecture: :class:`Architecture`.

An architecture says whether it can run a loaded Hugging Face model (and its shape), collects
the model's weights into :class:`~hymt_serve.engine.models.weights.ModelWeights`, and runs the
forward over them for decode rows and packed prompt tokens. The runner owns the cache, the
buffers and the CUDA graphs; it reaches the model only through this interface.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from hymt_serve.engine.checkpoints.fp8 import Fp8Scales
from hymt_serve.engine.kernels.quantized import Int4Parts
from hymt_serve.engine.models.weights import ModelShape, ModelWeights
from hymt_serve.engine.runners.inputs import PackedPrompts

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class UnsupportedModelError(Exception):
    """The model cannot run on the fast engine; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Architecture(Protocol):
    """One model architecture on the fast runner (one module of :mod:`hymt_serve.engine.models`
    each, registered by the Hugging Face ``model_type``)."""

    model_type: str

    def check(self, model: nn.Module) -> ModelShape:
        """The model's shape; :class:`UnsupportedModelError` naming the first obstacle."""

    def extract_weights(
        self,
        model: nn.Module,
        *,
        quantize: str,
        scales: Fp8Scales | None,
        int4: Int4Parts | None,
        quantize_head: bool,
    ) -> ModelWeights:
        """The model's tensors in the forward's order, fused and quantized as asked."""

    def rope_tables(self, weights: ModelWeights, length: int) -> tuple[Tensor, Tensor]:
        """cos and sin for positions ``0..length-1``, in the weights' dtype."""

    def step_functions(self, shape: ModelShape, compile_: bool) -> Any:
        """The per-token pieces of the forward, compiled by inductor when ``compile_``."""

    def forward(
        self,
        weights: ModelWeights,
        shape: ModelShape,
        fns: Any,
        rope: tuple[Tensor, Tensor],
        caches: tuple[list[Tensor], list[Tensor]],
        decode: tuple[Tensor, Tensor, Tensor] | None = None,
        packed: PackedPrompts | None = None,
    ) -> Tensor:
        """One pass for decode rows (tokens, positions, slots) and packed prompt tokens
        together; fp32 logits for each decode row, then after each prompt's last token."""


def check_plain(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` unless the model's weights are plain tensors of
    one float dtype on one real device, in plain ``nn.Linear`` projections."""
    if getattr(model, "hf_quantizer", None) is not None or getattr(model, "is_quantized", False):
        raise UnsupportedModelError("quantized weights (bitsandbytes etc.) are not supported")
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and type(module) is not nn.Linear:
            raise UnsupportedModelError(f"{name} is a {type(module).__name__}, not nn.Linear")
    devices = {p.device for p in model.parameters()}
    dtypes = {p.dtype for p in model.parameters()}
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        raise UnsupportedModelError(f"weights must sit on one real device, got {devices}")
    if len(dtypes) != 1 or next(iter(dtypes)) not in FLOAT_DTYPES:
        raise UnsupportedModelError(f"weights must share one float dtype, got {dtypes}")
