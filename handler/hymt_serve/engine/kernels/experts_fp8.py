"""FP8 experts: the e4m3 form of a mixture's expert stacks and their grouped products.

An FP8 stack is ``[E, rows, inputs]`` in ``float8_e4m3fn`` with one fp32 scale per expert and
output row, ``[E, rows]``: ``weight ~= q.float() * scale[..., None]``. A published checkpoint's
tensor-wise scales (one per expert and projection, gate and up apart) become those rows
exactly, by repetition; quantizing a bf16 stack at load gives each row its own scale (its
absolute maximum over 448), which is finer than one per tensor at no cost to the kernels.

The products: up to :data:`~hymt_serve.engine.kernels.experts_triton.MAX_PAIRS` pairs the
pair kernels read the e4m3 rows (weight-only: the activations stay bf16, the weights are the
bytes a small batch waits on); past it :func:`grouped_fp8_experts` runs
``torch._scaled_grouped_mm`` on CUDA (FP8 tensor cores, each token's input quantized by its
own absolute maximum, each weight row by its scale: rowwise scaling, which torch supports on
Hopper), and elsewhere the dequantized stacks through the plain grouped path (the CPU's
reference: the same numbers up to rounding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value


def quantize_rows(stack: Tensor, chunk: int = 8) -> tuple[Tensor, Tensor]:
    """``stack [E, rows, inputs]`` as e4m3 with one fp32 scale per expert and row (its
    absolute maximum over 448), ``chunk`` experts at a time (the fp32 copy of a whole
    stack would be four times its bf16 size)."""
    q = torch.empty(stack.shape, dtype=FP8, device=stack.device)
    scale = torch.empty(stack.shape[:2], dtype=torch.float32, device=stack.device)
    for start in range(0, stack.shape[0], chunk):
        part = stack[start : start + chunk].float()
        s = (part.abs().amax(dim=-1) / FP8_MAX).clamp(min=1e-12)
        q[start : start + chunk] = (part / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        scale[start : start + chunk] = s
    return q, scale


def tensor_scales_to_rows(scales: Tensor, rows: int) -> Tensor:
    """Tensor-wise scales ``[E, parts]`` (one per expert and stored projection, e.g. gate
    and up) as row scales ``[E, parts x rows]``: each part's scale repeated over its rows."""
    return scales.float().repeat_interleave(rows, dim=1).contiguous()


def dequantize(stack: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """An e4m3 stack times its row scales, in ``dtype``."""
    return (stack.float() * scale[..., None]).to(dtype)


def quantize_tokens(x: Tensor) -> tuple[Tensor, Tensor]:
    """Rows ``[N, in]`` as e4m3 and their fp32 scales ``[N]`` (each row's absolute maximum
    over 448)."""
    scale = (x.abs().amax(dim=-1).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def scaled_grouped_applies(x: Tensor) -> bool:
    """Whether ``torch._scaled_grouped_mm`` serves these rows: CUDA, bf16 (its output), and a
    torch that has it."""
    return x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_scaled_grouped_mm")


def grouped_product(rows: Tensor, stack: Tensor, scale: Tensor, ends: Tensor) -> Tensor:
    """``rows`` (sorted by expert, ``ends`` each expert's end) times their expert's e4m3
    rows, in ``rows``' dtype."""
    if scaled_grouped_applies(rows):
        xq, x_scale = quantize_tokens(rows)
        return torch._scaled_grouped_mm(
            xq, stack.transpose(1, 2), x_scale, scale, offs=ends, out_dtype=rows.dtype
        )
    weights = dequantize(stack, scale, rows.dtype)
    return torch._grouped_mm(rows, weights.transpose(1, 2), offs=ends)


def grouped_fp8_experts(
    x: Tensor,
    chosen: Tensor,
    weights: Tensor,
    stacks: tuple[Tensor, Tensor],
    scales: tuple[Tensor, Tensor],
) -> Tensor:
    """:func:`~hymt_serve.engine.kernels.experts.grouped_experts` for e4m3 ``stacks``
    (gate/up, down) with their row ``scales``: fp32 ``[T, hidden]``."""
    tokens, k = chosen.shape
    gate_up, down = stacks
    flat = chosen.flatten()
    order = torch.argsort(flat, stable=True)  # the pairs, by expert
    counts = torch.zeros(gate_up.shape[0], dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    hidden = grouped_product(x[order // k], gate_up, scales[0], ends)
    gate, up = hidden.chunk(2, dim=-1)
    out = grouped_product((F.silu(gate) * up).contiguous(), down, scales[1], ends)
    weighted = out.float() * weights.flatten()[order, None]
    by_pair = torch.empty_like(weighted)
    by_pair[order] = weighted
    return by_pair.view(tokens, k, -1).sum(dim=1)
