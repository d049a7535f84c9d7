"""Quantized projections for the fast engine: FP8 (e4m3, tensor-wise weight scales, inputs
scaled by a checkpoint's static scale or per token, on FP8 tensor cores), int8 weight-only (a
scale per output row) and int4 weight-only (GPTQ's packing, a scale per 128 inputs, on tensor
cores at every batch: :mod:`hymt_serve.engine.kernels.int4_gemm`), the product that runs each,
and taking an FP8 checkpoint's weights with their own scales
(:mod:`hymt_serve.engine.checkpoints.fp8`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hymt_serve.engine.checkpoints.fp8 import Fp8Scales
from hymt_serve.engine.kernels import weight_forms, weight_only

Int4Parts = dict[str, tuple[Tensor, Tensor]]  # module name -> packed weight, scales and zeros

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value


def quantize_tensor(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``weight`` as e4m3 with one fp32 scale (its absolute maximum over 448, shape ``[1]``):
    ``weight ~= q.float() * scale``."""
    w = weight.float()
    scale = (w.abs().amax() / FP8_MAX).clamp(min=1e-12).reshape(1)
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


_UNIT: dict[torch.device, Tensor] = {}


def unit_scale(device: torch.device) -> Tensor:
    """A scale of 1 on ``device`` for ``torch._scaled_mm`` (made once, before any step is
    compiled: a tensor made inside a compiled step would cost a kernel of its own)."""
    if device not in _UNIT:
        _UNIT[device] = torch.ones((), dtype=torch.float32, device=device)
    return _UNIT[device]


def linear(
    x: Tensor, weight: Tensor, weight_scale: Tensor, input_scale: Tensor, fits_fp16: bool = False
) -> Tensor:
    """``x @ weight.T`` for a plain weight (one row of it on CUDA in the tiled weight-only
    kernel, :func:`~hymt_serve.engine.kernels.weight_only.plain_row`), on FP8 tensor cores for an
    e4m3 one, and in the weight-only kernel (:mod:`hymt_serve.engine.kernels.weight_only`) for
    int8 and int4 ones.

    FP8 (tensor-wise weights, as the published checkpoints are; faster at one row than
    row-wise scales or e4m3 in the weight-only kernel): ``x`` is quantized to e4m3 with
    ``input_scale`` (static) or, when that is empty, each row by its own absolute maximum
    (per token), and ``torch._scaled_mm`` returns ``x``'s dtype. Inside the compiled steps
    inductor fuses that quantization into the kernel that makes ``x`` and the rows' scales into
    the kernels that read the result. Off CUDA a dequantized fp32 product gives the same
    numbers (the tests' reference). ``fits_fp16``: ``x`` is a norm's output that fits fp16
    (``ModelShape.norms_fit_fp16``), which int8 weight-only products then take as fp16.
    """
    if weight.dtype in (torch.int8, torch.int32):
        return weight_only.linear(x, weight, weight_scale, fits_fp16)
    if weight.dtype != FP8:
        if weight_only.plain_row_applies(x, weight):
            return weight_only.plain_row(x, weight)
        return F.linear(x, weight)
    xq, x_scale = quantize_input(x, input_scale)
    w_scale = weight_scale.float().reshape(())
    if not x.is_cuda:
        return (F.linear(xq.float(), weight.float()) * (x_scale * w_scale)).to(x.dtype)
    if input_scale.numel() or x.shape[0] == 1:  # (a dynamic batch is 2 or more: no guard)
        scale_a = x_scale.reshape(())
        return torch._scaled_mm(xq, weight.t(), scale_a=scale_a, scale_b=w_scale, out_dtype=x.dtype)
    unit = unit_scale(x.device)
    product = torch._scaled_mm(xq, weight.t(), scale_a=unit, scale_b=w_scale, out_dtype=x.dtype)
    return (product.float() * x_scale).to(x.dtype)


def quantize_input(x: Tensor, input_scale: Tensor) -> tuple[Tensor, Tensor]:
    """``x [rows, in]`` as e4m3 and its fp32 scale ``[1, 1]`` (``input_scale``, static) or
    ``[rows, 1]`` (empty ``input_scale``: each row's absolute maximum over 448)."""
    if input_scale.numel():
        x_scale = input_scale.float().reshape(1, 1)
    else:
        x_scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), x_scale


def quantize_int8_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``weight [out, in]`` as int8 with one fp32 scale per output row (its absolute maximum
    over 127): ``weight ~= q.float() * scale[:, None]``."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


QUANTIZERS = {
    "fp8": quantize_tensor,
    "int8": quantize_int8_rows,
    "int4": weight_forms.quantize_int4_groups,
}


def checkpoint_group(
    name: str, linears: list[nn.Linear], modules: list[str], scales: Fp8Scales
) -> dict[str, Tensor]:
    """One fused group of an FP8 checkpoint: e4m3 weight, its scale, its input's scale."""
    own = [scales.weight[module] for module in modules]
    common = torch.stack(own).amax()
    parts = [
        (linear.weight.detach().float() * (scale.to(linear.weight.device) / common)).to(FP8)
        for linear, scale in zip(linears, own, strict=True)
    ]
    device = linears[0].weight.device
    for linear in linears:  # the model's copy (FP8 values in its dtype) goes
        linear.weight.data = linear.weight.new_empty(0)
    inputs = [scales.input[module] for module in modules if module in scales.input]
    static = torch.stack(inputs).amax().reshape(1) if inputs else torch.empty(0)
    return {
        name: torch.cat(parts) if len(parts) > 1 else parts[0],
        f"{name}_scale": common.reshape(1).to(device),
        f"{name}_input": static.to(device),
    }


def int4_group(
    name: str, linears: list[nn.Linear], parts: list[tuple[Tensor, Tensor]]
) -> dict[str, Tensor]:
    """One fused group of a GPTQ checkpoint in the weight-only kernel's form: the packed
    weights and their scales and zero points side by side along the outputs."""
    device = linears[0].weight.device
    for linear in linears:  # the model's dequantized copy goes
        linear.weight.data = linear.weight.new_empty(0)
    return {
        name: torch.cat([weight for weight, _ in parts], dim=1).to(device),
        f"{name}_scale": torch.cat([scale for _, scale in parts], dim=2).to(device),
        f"{name}_input": torch.empty(0, device=device),
    }
