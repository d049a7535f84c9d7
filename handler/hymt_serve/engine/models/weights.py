"""The fast engine's weights, whatever the architecture: a decoder layer's tensors in the
order the step functions take them, the model's shape, and the helpers that fuse projections
and pad the LM head in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hymt_serve.engine.kernels import weight_only
from hymt_serve.engine.kernels.quantized import (
    FP8,
)


class LayerWeights(NamedTuple):
    """One decoder layer's tensors, in the order the step functions take them as arguments.

    A projection is a bf16/fp16/fp32 weight ``[out, in]`` (its two scales empty); an FP8
    (e4m3) weight with its fp32 scale ``[1]`` and the input's scale: one fp32 value (static,
    from calibration) or empty (dynamic: from each input row at run time); an int8 weight with
    fp32 scales ``[out]``; or int4 (int32 ``[in / 8, out]``) with fp16 scales and zero
    points ``[2, groups, out]``. See :func:`linear`."""

    input_norm: Tensor
    qkv: Tensor  # q, k and v projections fused
    q_norm: Tensor
    k_norm: Tensor
    o: Tensor
    post_norm: Tensor
    gate_up: Tensor  # gate and up projections fused
    down: Tensor
    qkv_scale: Tensor
    o_scale: Tensor
    gate_up_scale: Tensor
    down_scale: Tensor
    qkv_input: Tensor
    o_input: Tensor
    gate_up_input: Tensor
    down_input: Tensor


LAYER_TENSORS = len(LayerWeights._fields)


@dataclass(frozen=True)
class ModelShape:
    """The dimensions the forward needs."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    vocab: int
    # Whether a norm's output fits fp16: |rms_norm(x) * g| <= sqrt(hidden) * max |g| for every
    # norm that feeds a projection (hunyuan_v1_dense_weights.norms_fit_fp16). Then int8
    # weight-only products take those inputs as fp16, the same values, and widen their weights
    # in fewer instructions.
    norms_fit_fp16: bool = False

    @property
    def scale(self) -> float:
        return float(self.head_dim**-0.5)


@dataclass(frozen=True)
class ModelWeights:
    """The model's own tensors (q/k/v and gate/up fused, see :func:`fuse_linears`).

    The LM head is a projection like the others (its scale and input scale empty when it is
    plain); ``embed_scale`` is empty for a plain embedding table and otherwise the scale of a
    quantized one (the LM head's own table when the two are tied, see :func:`embed_tokens`)."""

    embed: Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor
    lm_head: Tensor
    inv_freq: Tensor
    embed_scale: Tensor
    lm_head_scale: Tensor
    lm_head_input: Tensor

    @property
    def head(self) -> tuple[Tensor, Tensor, Tensor]:
        """The LM head as a projection: weight, scale, input scale."""
        return self.lm_head, self.lm_head_scale, self.lm_head_input

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the model's)."""
        return self.final_norm.dtype

    def describe(self) -> dict[str, object]:
        """Which weights and kernels the projections use, and the weights' size."""
        projection = self.layers[0].qkv
        tensors = [self.embed, self.final_norm, *(t for lw in self.layers for t in lw)]
        if self.lm_head.data_ptr() != self.embed.data_ptr():
            tensors.append(self.lm_head)
        tensors += [self.embed_scale, self.lm_head_scale]
        facts: dict[str, object] = {
            "weight_bytes": sum(t.numel() * t.element_size() for t in tensors)
        }
        on_gpu = projection.is_cuda and weight_only.has_triton()
        kernel = "Triton weight-only kernel" if on_gpu else "dequantized reference"
        if projection.dtype == torch.int8:
            facts["projections"] = "int8 weight-only, a scale per output row"
            facts["projection_kernel"] = kernel
        if projection.dtype == torch.int32:
            group = weight_only.in_features(projection) // self.layers[0].qkv_scale.shape[1]
            facts["projections"] = f"int4 weight-only, a scale and zero point per {group} inputs"
            facts["projection_kernel"] = (
                f"{kernel}; more than {weight_only.DEEP_ROWS} rows: widened for cuBLAS"
                if on_gpu
                else kernel
            )
        if projection.dtype == FP8:
            static = self.layers[0].qkv_input.numel() > 0
            inputs = "static input scales" if static else "dynamic input scales per token"
            facts["projections"] = f"fp8 e4m3, tensor-wise scales, {inputs}"
            facts["projection_kernel"] = (
                "torch._scaled_mm (tensor-wise)" if projection.is_cuda else "dequantized reference"
            )
        if projection.dtype in (torch.bfloat16, torch.float16) and projection.is_cuda:
            one_row = weight_only.plain_row_kernel() == "triton" and weight_only.has_triton()
            facts["projection_kernel"] = (
                "one row: Triton tiled kernel; more rows: cuBLAS" if one_row else "cuBLAS"
            )
        head = {FP8: "fp8 e4m3, tensor-wise scale", torch.int8: "int8, a scale per row"}
        facts["lm_head"] = head.get(self.lm_head.dtype, str(self.lm_head.dtype).split(".")[-1])
        if self.embed_scale.numel():
            facts["lm_head"] = f"{facts['lm_head']}, its table shared with the embedding"
        return facts


def embed_tokens(ids: Tensor, weights: ModelWeights) -> Tensor:
    """The embedding rows of ``ids`` in the model's dtype; a quantized table's rows are
    dequantized (e4m3 with one scale, or int8 with a scale per row)."""
    if not weights.embed_scale.numel():
        return F.embedding(ids, weights.embed)
    rows = weights.embed[ids].float()
    scale = weights.embed_scale if weights.embed.dtype == FP8 else weights.embed_scale[ids, None]
    return (rows * scale).to(weights.dtype)


def fuse_linears(linears: list[nn.Linear]) -> Tensor:
    """Concatenate the weights and rebind each module's weight to a view of the result.

    One matrix product instead of several, with no second copy of the weights: the HF model
    keeps working on the same memory.
    """
    fused = torch.cat([module.weight.detach() for module in linears])
    start = 0
    for module in linears:
        rows = module.weight.shape[0]
        module.weight.data = fused[start : start + rows]
        start += rows
    return fused


def pad_rows(param: nn.Parameter, multiple: int) -> Tensor:
    """Pad a ``[vocab, hidden]`` weight with zero rows to a multiple of ``multiple``.

    An odd vocabulary (128167) makes cuBLAS fall back to an unaligned GEMM for the LM head,
    several times slower. The parameter is rebound to a view of the padded tensor, so tied
    embeddings stay tied and no second copy remains.
    """
    weight = param.detach()
    pad = -weight.shape[0] % multiple
    if pad == 0:
        return weight
    padded = torch.cat([weight, weight.new_zeros(pad, weight.shape[1])])
    param.data = padded[: weight.shape[0]]
    return padded
