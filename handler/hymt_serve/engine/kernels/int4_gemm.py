"""int4 weight-only products on tensor cores at every row count: ``x @ W.T`` with ``W`` in
GPTQ's packing (:mod:`hymt_serve.engine.kernels.weight_forms`' ``INT4``), the packed words read
once and widened in registers inside the product (:mod:`.int4_gemm_triton`).

Why: the earlier int4 paths (:mod:`.weight_only`) ran one row on CUDA cores and more rows in a
tiled kernel whose widening (shift, mask, int-to-float conversion, subtract, convert) cost
more than the product, 1.4-3 x bf16's time above 16 rows, and widened the whole weight for
cuBLAS above 256. Here a ``lop3`` and two pair-``fma``s widen two weights (19 instructions a
word of eight with its shifts and Triton's repacking; no conversion instruction), the
weight tiles are copied ahead like the inputs' (``num_stages``), and the tiles grow with the
rows: mma.sync tiles of 16 rows up to 16, Hopper's warpgroup products (wgmma) from 64.

The input dimension splits into parts where the tiles alone would not fill the GPU (at few
rows a product is a read of the weights and wants a few programs an SM). One row (the
batch-1 step, compiled apart) returns fp32 partial products ``[splits, rows, out]`` that
:func:`linear` sums, which inside a compiled step inductor reads inside the next kernel
(``decoder.SPLIT_SUMS_READ``). More rows go through one op, ``hymt::int4_gemm_rows``, that
picks its tiles and splits with the rows known and sums the splits itself (a step compiled
with a symbolic batch sees no branch on the row count); above :data:`LARGEST_ROWS` rows (long
prompts) it widens the weight for cuBLAS.

Which int4 path runs is :func:`set_int4_kernel`'s (``HYMT_INT4_KERNEL``, read at import):
``gemm`` (this kernel at every row count), ``gemm-rows`` (this kernel above one row, the
CUDA-core chain kernel at one) or ``legacy`` (the earlier paths), to compare them.
``legacy`` is the default: this kernel still gives wrong products on weights of uneven shape
(``tests/gpu/test_int4_gemm_gpu.py``) and runs one row slower than the legacy chain
(docs/performance.md), so it is opt-in until both are fixed.
"""

from __future__ import annotations

import os
from functools import cache
from typing import NamedTuple

import torch
from torch import Tensor

from hymt_serve.engine.kernels import ahead
from hymt_serve.engine.kernels import int4_gemm_triton as kernels
from hymt_serve.engine.kernels import weight_only_triton as row_kernels
from hymt_serve.engine.kernels.weight_forms import in_features, out_features

try:
    import triton
except ImportError:  # the CPU image has no Triton; the reference serves there
    triton = None

INT4_KERNELS = ("gemm", "gemm-rows", "legacy")
_int4_kernel: str | None = None  # None: HYMT_INT4_KERNEL's, else legacy
LARGEST_ROWS = 256  # more rows (long prompts) widen the weight for cuBLAS


def set_int4_kernel(name: str) -> None:
    """Which path int4 products take, for the whole process (read when a step is traced):
    ``gemm``, ``gemm-rows`` or ``legacy`` (see the module's docstring)."""
    if name not in INT4_KERNELS:
        raise ValueError(f"HYMT_INT4_KERNEL must be one of {INT4_KERNELS}, got {name!r}")
    global _int4_kernel
    _int4_kernel = name


def int4_kernel() -> str:
    """The path set by :func:`set_int4_kernel`, else ``HYMT_INT4_KERNEL``'s (default
    ``legacy``); ValueError naming the variable for another value."""
    if _int4_kernel is not None:
        return _int4_kernel
    name = os.environ.get("HYMT_INT4_KERNEL", "legacy")
    if name not in INT4_KERNELS:
        raise ValueError(f"HYMT_INT4_KERNEL must be one of {INT4_KERNELS}, got {name!r}")
    return name


def applies(rows: int) -> bool:
    """Whether ``rows`` rows of an int4 product go to this kernel (the caller checks CUDA,
    the dtype and the group). ``rows`` may be symbolic (2 or more) in a compiled step."""
    name = int4_kernel()
    if name == "legacy":
        return False
    return name == "gemm" if rows == 1 else True


class Tile(NamedTuple):
    """A launch's tiles (rows, columns and inputs a block; warps; pipeline stages) and the
    programs its splits reach at least, in waves of the GPU's SMs."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    waves: float


# Tiles by the most rows they serve. Up to 16 rows a product is a read of the weights:
# mma.sync tiles of 16 rows, 64 columns and 128 inputs a block (a 4 KB read of packed words,
# three in flight a program), at least two programs an SM. From 17 rows Hopper's wgmma (64
# rows a warpgroup) widens each weight once for all the rows, about one wave of programs
# (each split's partial sums cost a write and a read). Chosen from the compiled code, not yet
# from timings (docs/performance.md, int4 on tensor cores).
TILES: tuple[tuple[int, Tile], ...] = (
    (16, Tile(16, 64, 128, 4, 3, 2.0)),
    (64, Tile(64, 128, 64, 4, 3, 0.9)),
    (LARGEST_ROWS, Tile(128, 128, 64, 8, 3, 0.9)),
)
DEFAULT_SMS = 132  # (where no CUDA device is asked, as in the CPU tests)
MAX_SPLITS = 16


def tile_for(rows: int) -> Tile:
    for most, tile in TILES:
        if rows <= most:
            return tile
    return TILES[-1][1]


def splits_for(weight: Tensor, rows: int, tile: Tile) -> int:
    """How many parts the input dimension splits into: the least power of two that gives
    ``tile.waves`` waves of programs, each part at least one block."""
    sms = _sms(weight.device) if weight.device.type == "cuda" else DEFAULT_SMS
    tiles = -(-rows // tile.block_m) * -(-out_features(weight) // tile.block_n)
    blocks = in_features(weight) // tile.block_k
    splits = 1
    while tiles * splits < tile.waves * sms and splits * 2 <= min(blocks, MAX_SPLITS):
        splits *= 2
    return splits


@cache
def _sms(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def linear(x: Tensor, weight: Tensor, scale: Tensor, group: int) -> Tensor:
    """``x @ dequantize(weight, scale).T`` in ``x``'s dtype (``x``: 2-D, on CUDA or in a
    plan's recording; ``group``: inputs a group, a multiple of 128)."""
    x = x.contiguous()
    if x.shape[0] > 1:  # (batch 1 is specialised, a dynamic batch is 2 or more: no guard)
        out: Tensor = torch.ops.hymt.int4_gemm_rows(x, weight, scale, group)
        return out
    splits = splits_for(weight, 1, tile_for(1))
    parts: Tensor = torch.ops.hymt.int4_gemm_parts(x, weight, scale, group, splits)
    return parts.sum(0).to(x.dtype) if splits > 1 else parts[0].to(x.dtype)


@torch.library.custom_op("hymt::int4_gemm_parts", mutates_args=())
def int4_gemm_parts(x: Tensor, weight: Tensor, scale: Tensor, group: int, splits: int) -> Tensor:
    """fp32 partial products ``[splits, rows, out]`` on the tiles of ``x``'s rows."""
    return launch(x, weight, scale, group, splits, tile_for(x.shape[0]), parts=True)


@int4_gemm_parts.register_fake
def _(x: Tensor, weight: Tensor, scale: Tensor, group: int, splits: int) -> Tensor:
    return x.new_empty(splits, x.shape[0], out_features(weight), dtype=torch.float32)


@torch.library.custom_op("hymt::int4_gemm_rows", mutates_args=())
def int4_gemm_rows(x: Tensor, weight: Tensor, scale: Tensor, group: int) -> Tensor:
    """The product in ``x``'s dtype, its tiles and splits picked by the rows."""
    rows = x.shape[0]
    if rows > LARGEST_ROWS:
        return x @ widen_int4(weight, scale, group, x.dtype)
    tile = tile_for(rows)
    splits = splits_for(weight, rows, tile)
    if splits == 1:
        return launch(x, weight, scale, group, 1, tile, parts=False)
    return sum_splits(launch(x, weight, scale, group, splits, tile, parts=True), x.dtype)


@int4_gemm_rows.register_fake
def _(x: Tensor, weight: Tensor, scale: Tensor, group: int) -> Tensor:
    return x.new_empty(x.shape[0], out_features(weight))


def launch(
    x: Tensor, weight: Tensor, scale: Tensor, group: int, splits: int, tile: Tile, parts: bool
) -> Tensor:
    """Run :func:`~.int4_gemm_triton.int4_gemm_kernel` on ``tile``: fp32 partial products
    ``[splits, rows, out]`` (``parts``) or, with one split, the product in ``x``'s dtype."""
    rows, inputs = x.shape
    cols = out_features(weight)
    block_k = min(tile.block_k, group)
    assert group % block_k == 0 and inputs % block_k == 0, (group, inputs, tile)
    shape, dtype = ((splits, rows, cols), torch.float32) if parts else ((rows, cols), x.dtype)
    out = x.new_empty(shape, dtype=dtype)
    span = -(-inputs // block_k // splits)  # blocks a split (the last may have fewer, or none)
    grid = (-(-rows // tile.block_m), -(-cols // tile.block_n), splits)
    ahead.run(
        kernels.int4_gemm_kernel, grid, x, weight, scale, out, rows, cols, inputs, x.stride(0),
        span, GROUP=group, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=block_k,
        PTX=kernels.COMPILED, EVEN_N=cols % tile.block_n == 0, PARTS=parts,
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


WIDEN_WORDS, WIDEN_COLUMNS = 16, 128  # the widening kernel's tile: 128 inputs by 128 columns


def widen_int4(weight: Tensor, scale: Tensor, group: int, dtype: torch.dtype) -> Tensor:
    """An int4 weight as ``[in, out]`` in ``dtype``, in one kernel, for cuBLAS (``group``: a
    multiple of 128). Used above :data:`LARGEST_ROWS` rows."""
    inputs, cols = in_features(weight), out_features(weight)
    out = torch.empty(inputs, cols, dtype=dtype, device=weight.device)
    grid = (triton.cdiv(inputs // 8, WIDEN_WORDS), triton.cdiv(cols, WIDEN_COLUMNS))
    ahead.run(
        row_kernels.widen_int4_kernel, grid, weight, scale, out, cols, inputs, GROUP=group,
        WORDS=WIDEN_WORDS, BLOCK_N=WIDEN_COLUMNS,
    )  # fmt: skip
    return out


def sum_splits(parts: Tensor, dtype: torch.dtype) -> Tensor:
    """``parts [splits, rows, out]`` (fp32) summed over the splits, in ``dtype``."""
    out = parts.new_empty(parts.shape[1:], dtype=dtype)
    size, block = out.numel(), 1024
    grid = (triton.cdiv(size, block),)
    ahead.run(row_kernels.sum_splits_kernel, grid, parts, out, size, parts.shape[0], BLOCK=block)
    return out
