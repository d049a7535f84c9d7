"""Quantized projections for the fast engine: FP8 (e4m3, tensor-wise scales, on FP8 tensor
cores), int8 weight-only (a scale per output row) and int4 weight-only (GPTQ's packing, a scale
per 128 inputs), the product that runs each, and taking an FP8 checkpoint's weights with their
own scales (:mod:`hymt_serve.engine.fp8_checkpoint`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hymt_serve.engine import weight_forms, weight_only
from hymt_serve.engine.fp8_checkpoint import Fp8Scales

Int4Parts = dict[str, tuple[Tensor, Tensor]]  # module name -> packed weight, scales and zeros

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value


def quantize_tensor(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``weight`` as e4m3 with one fp32 scale (its absolute maximum over 448, shape ``[1]``):
    ``weight ~= q.float() * scale``."""
    w = weight.float()
    scale = (w.abs().amax() / FP8_MAX).clamp(min=1e-12).reshape(1)
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def linear(x: Tensor, weight: Tensor, weight_scale: Tensor, input_scale: Tensor) -> Tensor:
    """``x @ weight.T`` for a plain weight (one row of it on CUDA in the tiled weight-only
    kernel, :func:`~hymt_serve.engine.weight_only.plain_row`), on FP8 tensor cores for an e4m3
    one, and in the weight-only kernel (:mod:`hymt_serve.engine.weight_only`) for int8 and int4
    ones.

    FP8 (tensor-wise, as the published FP8 checkpoints are): ``weight_scale`` is one value,
    and ``x`` is quantized to e4m3 with ``input_scale`` (static, one value) or, when that is
    empty, with its own absolute maximum over 448 (dynamic). The product runs in
    ``torch._scaled_mm`` and comes out in ``x``'s dtype; inside the compiled step functions
    inductor fuses the quantization into the kernel that makes ``x`` (a norm, the SiLU
    product). Tensor-wise, not row-wise: on an H200 a pass over the 7B's projections takes
    2.1 ms at 1 token tensor-wise, 3.8 ms row-wise and 3.6 ms in bf16
    (benchmarks/decode/fp8_gemm.py); widening e4m3 weights to bf16 in the weight-only kernel
    instead took 2.7 ms (benchmarks/decode/weight_only_gemm.py). Off CUDA the same numbers
    go through a dequantized fp32 product (the reference the tests hold the kernels to).
    """
    if weight.dtype in (torch.int8, torch.int32):
        return weight_only.linear(x, weight, weight_scale)
    if weight.dtype != FP8:
        if weight_only.plain_row_applies(x, weight):
            return weight_only.plain_row(x, weight)
        return F.linear(x, weight)
    if input_scale.numel():
        x_scale = input_scale.float().reshape(())
    else:
        # per row first, then over the rows: a one-step reduction over all of x runs as one
        # slow program in inductor (0.4-0.6 ms per projection at 64 rows)
        x_scale = (x.abs().amax(dim=-1).amax().float() / FP8_MAX).clamp(min=1e-12)
    xq = (x.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    w_scale = weight_scale.float().reshape(())
    if x.is_cuda:
        return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype)
    return F.linear(xq.float() * x_scale, weight.float() * w_scale).to(x.dtype)


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
