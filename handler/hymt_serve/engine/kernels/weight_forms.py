"""The weight forms of the fast engine's weight-only products, and their reference arithmetic:

- ``INT8``: ``[out, in]`` int8 with one fp32 scale per output row;
- ``INT4``: GPTQ's packing, int32 ``[in / 8, out]`` (eight 4-bit values along the input,
  lowest bits first) with fp16 ``[2, groups, out]``: each group's scales, then its zero
  points;
- ``PLAIN``: a weight in the activations' dtype.

Packing, quantizing to int4, dequantizing, and the product from the dequantized weight that the
kernels (:mod:`hymt_serve.engine.kernels.weight_only`) are held to and that serves off CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

INT8, PLAIN, INT4 = 0, 1, 2  # PLAIN: a weight in the activations' dtype (plain_row)


def kind_of(weight: Tensor) -> int | None:
    """The form of a projection's weight (None for a plain float weight)."""
    return {torch.int8: INT8, torch.int32: INT4}.get(weight.dtype)


def out_features(weight: Tensor) -> int:
    return weight.shape[1] if weight.dtype == torch.int32 else weight.shape[0]


def in_features(weight: Tensor) -> int:
    return weight.shape[0] * 8 if weight.dtype == torch.int32 else weight.shape[1]


def shape_of(weight: Tensor) -> tuple[int, int]:
    """The product's (out, in), whatever the weight's packing."""
    return out_features(weight), in_features(weight)


def unpack_int4(packed: Tensor) -> Tensor:
    """int32 ``[rows, cols]`` of eight 4-bit values each (lowest bits first, along the rows)
    -> int32 ``[rows * 8, cols]`` of values 0-15."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(-1, packed.shape[1])


def pack_int4(values: Tensor) -> Tensor:
    """The inverse of :func:`unpack_int4`: ``[rows * 8, cols]`` of 0-15 -> int32
    ``[rows, cols]``."""
    grouped = values.to(torch.int32).reshape(-1, 8, values.shape[1])
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=values.device)
    packed = torch.zeros(
        grouped.shape[0], grouped.shape[2], dtype=torch.int64, device=values.device
    )
    for j in range(8):  # bit 31 set makes the int32 negative: assemble in int64, then wrap
        packed |= (grouped[:, j, :].long() & 0xF) << int(shifts[j])
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def quantize_int4_groups(weight: Tensor, group: int = 128) -> tuple[Tensor, Tensor]:
    """``weight [out, in]`` as symmetric 4-bit with a scale per ``group`` inputs and output,
    as GPTQ's symmetric quantizer grids it (scale ``2 * max|w| / 15`` in fp16, zero point 8,
    round to nearest): the packed int32 ``[in / 8, out]`` and fp16 ``[2, groups, out]``
    scales and zero points. An input dimension that is not a whole number of groups makes
    one group (GPTQ's ``group_size: -1``)."""
    out, inputs = weight.shape
    if inputs % 8:
        raise ValueError(f"int4 needs an input dimension divisible by 8, got {inputs}")
    group = group if inputs % group == 0 else inputs
    w = weight.float().T.reshape(inputs // group, group, out)  # [groups, group, out]
    scale = (2 * w.abs().amax(dim=1) / 15).clamp(min=1e-8).half()  # [groups, out]
    q = (w / scale.float()[:, None, :]).round().add(8).clamp(0, 15)
    zeros = torch.full_like(scale, 8.0)
    return pack_int4(q.reshape(inputs, out)), torch.stack([scale, zeros])


def dequantize(weight: Tensor, scale: Tensor) -> Tensor:
    """Any weight form as float32 ``[out, in]``."""
    kind = kind_of(weight)
    if kind == INT4:
        return _int4_inputs_first(weight, scale).T.contiguous()
    if kind == INT8:
        return weight.float() * scale.float()[:, None]
    return weight.float()


def _int4_inputs_first(weight: Tensor, scale: Tensor) -> Tensor:
    """An int4 weight as float32 ``[in, out]`` (its packed layout's order)."""
    inputs, cols = in_features(weight), weight.shape[1]
    groups = scale.shape[1]
    q = unpack_int4(weight).view(groups, inputs // groups, cols).float()
    return ((q - scale[1].float()[:, None, :]) * scale[0].float()[:, None, :]).view(inputs, cols)


def reference(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """The product from the dequantized weight (fp32), in ``x``'s dtype."""
    return F.linear(x.float(), dequantize(weight, scale)).to(x.dtype)
