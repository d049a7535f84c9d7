"""Weight-only products for the fast engine: ``x @ W.T`` where ``W`` is stored in fewer bits
and widened inside the product's inner loop, so each weight byte is read once.

Two weight forms, two Triton kernels:

- ``int8``: ``[out, in]`` int8 with one fp32 scale per output row (``quantization: int8``,
  for GPUs without FP8 tensor cores);
- ``int4``: GPTQ's own packing, int32 ``[in / 8, out]`` (eight 4-bit values along the input,
  lowest bits first) with fp16 ``[2, groups, out]``: each group's scales, then its zero
  points; ``w = scale * (q - zero)`` for the group ``in // group_size`` (GPTQ-Int4
  checkpoints with static groups, and ``quantization: int4``).

(The forms' packing, quantizing and reference arithmetic:
:mod:`hymt_serve.engine.kernels.weight_forms`.)

The kernel tiles the output columns and splits the input dimension so that even a 4,096-column
product fills the GPU, widens each weight tile to the input's dtype, multiplies on tensor cores
with fp32 accumulation and writes fp32 partial sums ``[splits, rows, out]``; the caller sums the
splits and applies int8's row scale, which inductor fuses into the next kernel. int4 words are
not unpacked into a tile: nibble ``j`` of every word meets the inputs ``j, j + 8, j + 16, ...``
of the block in a product of its own, so no data moves between threads. One row runs on CUDA
cores where that is faster (int4: ``one_row_kernel``, and with bf16 inputs
``weight_only_pairs.int4_chain_kernel``, two products per ``fma.bf16x2`` instruction). One row
of a plain bf16/fp16 product runs in the tiled kernel too (:func:`plain_row`): it reads the
weights faster than cuBLAS does at one row. The kernels' code is in
:mod:`hymt_serve.engine.kernels.weight_only_triton`.

int4 products take :mod:`hymt_serve.engine.kernels.int4_gemm` (a tensor-core GEMM that widens
the packed words in registers) at every row count unless ``HYMT_INT4_KERNEL`` says
``gemm-rows`` (the one-row paths below at one row) or ``legacy`` (the paths below at every
row count), kept to compare.

They run as custom ops, so that compiled step functions carry them: ``hymt::weight_only`` for
int8 and for int4's one row (partial sums out, summed and scaled inside the next kernel by
inductor); ``hymt::int4_rows`` for int4's larger batches, which picks its path inside: up to 256
rows the tiled kernel (above 16 rows with products 64-128 inputs deep) and a sum over its
splits, more rows the weight widened for cuBLAS. Dynamo then sees no branch on the row count
above one, so an int4 step function compiles the two graphs bf16's does (batch 1, every other),
not three: a third would put seconds of compiling on an int4 engine's start. Off CUDA (or
without Triton) :func:`reference` computes the same numbers from the dequantized weight.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from hymt_serve.engine.kernels import ahead, int4_gemm
from hymt_serve.engine.kernels import weight_only_triton as kernels
from hymt_serve.engine.kernels.int4_gemm import sum_splits as sum_splits
from hymt_serve.engine.kernels.int4_gemm import widen_int4 as widen_int4

# The weight forms and their reference arithmetic live in weight_forms; named here too, where
# the kernels' callers and tests look for them.
from hymt_serve.engine.kernels.weight_forms import INT4 as INT4
from hymt_serve.engine.kernels.weight_forms import INT8 as INT8
from hymt_serve.engine.kernels.weight_forms import PLAIN as PLAIN
from hymt_serve.engine.kernels.weight_forms import dequantize as dequantize
from hymt_serve.engine.kernels.weight_forms import in_features as in_features
from hymt_serve.engine.kernels.weight_forms import kind_of as kind_of
from hymt_serve.engine.kernels.weight_forms import out_features as out_features
from hymt_serve.engine.kernels.weight_forms import pack_int4 as pack_int4
from hymt_serve.engine.kernels.weight_forms import quantize_int4_groups as quantize_int4_groups
from hymt_serve.engine.kernels.weight_forms import reference as reference
from hymt_serve.engine.kernels.weight_forms import shape_of as shape_of
from hymt_serve.engine.kernels.weight_forms import unpack_int4 as unpack_int4
from hymt_serve.engine.kernels.weight_only_pairs import launch_chain as launch_chain

try:
    import triton
except ImportError:  # the CPU image has no Triton; the reference serves there
    triton = None

FEW_ROWS = 16  # up to this many rows a product is a read of the weights


class Config(NamedTuple):
    """The kernel's tiles (``block_m`` 0: the rows rounded up to a power of two, 16 to 128;
    1: the one-row kernel), and how many programs the input dimension is split to reach."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    programs: int


# The fastest tiles of a sweep over one pass of a 7B's projections: for one row, 2-16 rows, and
# more. int4's one row with bf16 inputs: the chain kernel on one warp, 128 columns by 64 inputs
# a block, faster over the four projections than the [words, columns] tile (words, below) and
# than programs of 4 or 8 warps, each a stream of words with fewer splits.
ONE_ROW_CONFIGS = {
    INT8: Config(16, 64, 256, 4, 3, 264),
    INT4: Config(1, 128, 64, 1, 1, 2112),
}
# int4's one row with bf16 inputs: ``chain`` (weight_only_pairs.int4_chain_kernel: block_k
# inputs a program's block, its warps taking word streams of block_k / 8 / warps words) or
# ``words`` (one_row_kernel's [words, columns] tile, int4_bf16x2), on its own tile: a block of
# 32 inputs by 128 columns on one warp loads the scales in the products' own layout, no
# exchange through shared memory.
INT4_BF16_ROWS = ("chain", "words")
INT4_BF16_ROW = "chain"
INT4_WORDS_ROW_CONFIG = Config(1, 128, 32, 1, 1, 1056)
# int8's one row on two projection shapes of the 7B models (hidden 4,096, intermediate
# 14,336; out, in): tiles of 128 inputs read them faster than the tile above (the attention
# output and gate_up). Neither tile is faster over all four projections.
INT8_ROW_SHAPE_CONFIGS = {
    (4096, 4096): Config(16, 64, 128, 4, 3, 264),
    (28672, 4096): Config(16, 64, 128, 4, 3, 528),
}
INT4_ROW_SHAPE_CONFIGS: dict[tuple[int, int], Config] = {}  # int4's, with bf16 inputs (chain)
ROW_SHAPE_CONFIGS = {INT8: INT8_ROW_SHAPE_CONFIGS, INT4: INT4_ROW_SHAPE_CONFIGS}
# fp16 inputs take int4's fp32 arithmetic (int4_pairs), which reads fastest on its own tile.
FP16_ONE_ROW_CONFIGS = {INT4: Config(1, 64, 128, 2, 1, 2112)}
FEW_ROWS_CONFIGS = {
    INT8: Config(16, 64, 256, 4, 3, 264),
    INT4: Config(16, 128, 128, 4, 3, 528),
}
MANY_ROWS_CONFIGS = {
    INT8: Config(0, 128, 128, 4, 3, 132),
    INT4: Config(0, 64, 128, 4, 3, 264),  # up to INT4_TALL_ROWS rows
}
# int4 above FEW_ROWS rows: the tiled kernel's products BLOCK_K inputs deep (int4_deep), up to
# DEEP_ROWS rows; more rows widen the weight for cuBLAS. On these tiles one pass over a 7B's
# projections is faster than widening at every row count up to DEEP_ROWS.
INT4_TALL_ROWS = 64
INT4_TALL_CONFIG = Config(128, 64, 64, 8, 3, 264)  # more than INT4_TALL_ROWS rows
DEEP_ROWS = 256
# A row count of each class the kernels' configs tell apart (one, few, the many-rows tiles of
# 32, 64 and 128 rows, int4's tall tiles, widened above DEEP_ROWS; int4_gemm's tiles of 16,
# 64 and 128 rows, whose splits may change at two tiles of 128): the rows with which the
# engine compiles its kernels ahead (hymt_serve.engine.kernels.ahead).
ROW_CLASSES = (1, 2, 32, 64, 128, DEEP_ROWS, 2 * DEEP_ROWS)


# One row of a plain (bf16/fp16) product: the tiled kernel with one live row of its 16 is
# faster than cuBLAS on each projection of a 7B and its LM head (cuBLAS runs qkv in too few
# column tiles to fill the card, o and down split-K with a reduction kernel after). 64-column
# tiles for an LM head's many columns.
PLAIN_ROW_CONFIG = Config(16, 32, 128, 4, 3, 264)
WIDE_PLAIN_ROW_CONFIG = Config(16, 64, 128, 4, 3, 264)
WIDE = 65_536  # output columns from which a plain row takes the wide tiles
PLAIN_ROW_KERNELS = ("triton", "cublas")
_plain_row_kernel = "triton"  # load_model sets it from one_row_kernel (auto: by the GPU)


def set_plain_row_kernel(name: str) -> None:
    """Where one row of a plain product goes, for the whole process (``one_row_kernel``):
    ``triton`` (:func:`plain_row`) or ``cublas`` (``F.linear``). Read when a step is traced."""
    if name not in PLAIN_ROW_KERNELS:
        raise ValueError(f"one_row_kernel must be one of {PLAIN_ROW_KERNELS}, got {name!r}")
    global _plain_row_kernel
    _plain_row_kernel = name


def plain_row_kernel() -> str:
    return _plain_row_kernel


def plain_row_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether ``x @ weight.T`` goes to :func:`plain_row`: one row, on CUDA with Triton, the
    weight a contiguous ``[out, in]`` of ``x``'s dtype."""
    return (
        _plain_row_kernel == "triton"
        and x.dim() == 2
        and x.shape[0] == 1  # a dynamic batch is 2 or more: no guard in a compiled step
        and kernel_available(x)
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.is_contiguous()
    )


def plain_row(x: Tensor, weight: Tensor) -> Tensor:
    """One row of ``x @ weight.T`` (a plain weight) in the tiled kernel. Its fp32 partial sums
    are summed and cast here, which inside a compiled step inductor fuses into the kernel that
    follows (a norm, the SiLU product), so no reduction kernel runs of its own."""
    config = plain_row_config(weight)
    splits = splits_for(weight, config)
    parts: Tensor = torch.ops.hymt.weight_only(x.contiguous(), weight, weight, PLAIN, 0, splits)
    return _summed(parts).to(x.dtype)


def _summed(parts: Tensor) -> Tensor:
    """fp32 partial products ``[splits, rows, out]`` summed over the splits (inside a compiled
    step, a sum inductor fuses into the kernel that reads it)."""
    return parts.sum(0) if parts.shape[0] > 1 else parts[0]


def plain_row_config(weight: Tensor) -> Config:
    return WIDE_PLAIN_ROW_CONFIG if weight.shape[0] >= WIDE else PLAIN_ROW_CONFIG


def config_for(
    kind: int, rows: int, dtype: torch.dtype = torch.bfloat16, shape: tuple[int, int] = (0, 0)
) -> Config:
    """The tiles for ``rows`` rows of input in ``dtype`` (and the one row of a weight of
    ``shape``, out by in: ``ROW_SHAPE_CONFIGS``). The split of the input dimension depends on
    the class (one, few or many rows), the dtype and the shape only, so a compiled step traced
    with a symbolic batch (always more than one row) knows it. (int4's many rows take taller
    tiles above 64 rows: their op picks them with the rows known.)"""
    if rows == 1:
        if dtype == torch.float16 and kind in FP16_ONE_ROW_CONFIGS:
            return FP16_ONE_ROW_CONFIGS[kind]
        if kind == INT4 and INT4_BF16_ROW == "words":
            return INT4_WORDS_ROW_CONFIG
        return ROW_SHAPE_CONFIGS[kind].get(shape, ONE_ROW_CONFIGS[kind])
    if rows <= FEW_ROWS:
        return FEW_ROWS_CONFIGS[kind]
    if kind == INT4 and isinstance(rows, int) and rows > INT4_TALL_ROWS:
        return INT4_TALL_CONFIG
    config = MANY_ROWS_CONFIGS[kind]
    if config.block_m == 0 and isinstance(rows, int):
        return config._replace(block_m=min(128, triton.next_power_of_2(rows)))
    return config


def has_triton() -> bool:
    """Whether the kernels can run at all (on CUDA tensors)."""
    return triton is not None


def kernel_available(x: Tensor) -> bool:
    return triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


def splits_for(weight: Tensor, config: Config) -> int:
    """How many parts the input dimension is split into: enough programs to reach
    ``config.programs`` (many rows: one part)."""
    tiles = -(-out_features(weight) // config.block_n)
    k_tiles = in_features(weight) // config.block_k
    splits = 1
    while tiles * splits < config.programs and splits * 2 <= k_tiles:
        splits *= 2
    return splits


def linear(x: Tensor, weight: Tensor, scale: Tensor, fits_fp16: bool = False) -> Tensor:
    """``x @ dequantize(weight, scale).T`` in ``x``'s dtype: the kernel on CUDA, else the
    reference. Inside a compiled function int8's scale and sum over splits (and int4's sum at
    one row) fuse into the kernel that follows.

    ``fits_fp16``: the caller knows that bf16 ``x`` fits fp16 (a norm's output,
    ``ModelShape.norms_fit_fp16``). int8's one row then multiplies it as fp16: the same values
    (fp16 holds every bf16 value of that size exactly, but those under 2^-14, whose part of
    the sums is below their rounding), and the kernel widens its weights by ``int8_as_fp16``.
    The cast fuses into the norm's kernel, which writes fp16 instead of bf16. That is faster
    at one row only, so more rows stay bf16."""
    kind = kind_of(weight)
    assert kind is not None, weight.dtype
    if not kernel_available(x) or (kind == INT4 and in_features(weight) // scale.shape[1] % 128):
        return reference(x, weight, scale)  # (the kernel takes int4 groups of 128 inputs or more)
    group = in_features(weight) // scale.shape[1] if kind == INT4 else 0
    if kind == INT4 and int4_gemm.applies(x.shape[0]):
        return int4_gemm.linear(x, weight, scale, group)
    if kind == INT4 and x.shape[0] > 1:
        # Batch 1 is specialised and a dynamic batch is 2 or more: no guard, no third graph.
        out: Tensor = torch.ops.hymt.int4_rows(x.contiguous(), weight, scale, group)
        return out
    # The split depends on the row class (and for int4's one row on the dtype) only: one row
    # (static in the batch-1 step; int4 comes here with one row only) or more (int8's
    # few-rows tiles: for a 7B's projections and head the same as the many-rows tiles' would
    # be), so a step compiled with a symbolic batch (2 or more) needs no guard on it; the
    # kernel's tiles are picked inside the op.
    dtype = x.dtype
    if fits_fp16 and kind == INT8 and dtype == torch.bfloat16 and x.shape[0] == 1:
        x = x.to(torch.float16)
    one_row = config_for(kind, 1, x.dtype, shape_of(weight))
    config = one_row if x.shape[0] == 1 else FEW_ROWS_CONFIGS[kind]
    splits = splits_for(weight, config)
    parts: Tensor = torch.ops.hymt.weight_only(x.contiguous(), weight, scale, kind, group, splits)
    out = _summed(parts)
    if kind == INT8:
        out = out * scale
    return out.to(dtype)


@torch.library.custom_op("hymt::weight_only", mutates_args=())
def _weight_only(
    x: Tensor, weight: Tensor, scale: Tensor, kind: int, group: int, splits: int
) -> Tensor:
    if kind == PLAIN:
        config = plain_row_config(weight)
    else:
        config = config_for(kind, x.shape[0], x.dtype, shape_of(weight))
    return launch(x, weight, scale, kind, group, splits, config)


@_weight_only.register_fake
def _(x: Tensor, weight: Tensor, scale: Tensor, kind: int, group: int, splits: int) -> Tensor:
    return x.new_empty(splits, x.shape[0], out_features(weight), dtype=torch.float32)


def launch(
    x: Tensor, weight: Tensor, scale: Tensor, kind: int, group: int, splits: int, config: Config
) -> Tensor:
    """Run the kernel: fp32 partial products ``[splits, rows, out]`` (the int4 group scales
    applied, the int8 row scales not). int4 above ``FEW_ROWS`` rows multiplies ``block_k``
    inputs deep (a divisor of the group)."""
    rows, inputs = x.shape
    cols = out_features(weight)
    if kind == INT8 and config.block_m == 1 and (inputs % 4 or weight.data_ptr() % 4):
        config = FEW_ROWS_CONFIGS[INT8]  # (int8_row loads words of 4 inputs' weights)
    one_row = config.block_m == 1
    pairs = one_row and kind == INT4 and bf16_pairs(x)
    # The one-row kernels load their inputs in words: int4's bf16 pairs as int32, int8's 4
    # inputs as int64. A row of such an input dimension starts aligned: only a view at an odd
    # offset (or rows at an odd stride) is copied.
    word = 8 if one_row and kind == INT8 else 4 if pairs else 0
    if word and (x.data_ptr() % word or (rows > 1 and x.stride(0) * x.element_size() % word)):
        x = x.clone(memory_format=torch.contiguous_format)
    if pairs and INT4_BF16_ROW == "chain":
        return launch_chain(x, weight, scale, group, splits, config)
    if kind == INT4 and group % config.block_k:
        config = config._replace(block_k=group)
    parts = x.new_empty(splits, rows, cols, dtype=torch.float32)
    span = triton.cdiv(inputs, splits * config.block_k) * config.block_k
    grid = (triton.cdiv(cols, config.block_n), splits, triton.cdiv(rows, config.block_m))
    kernel = _kernels()[1 if one_row else 0]
    extra = {"BF16_PAIRS": pairs} if one_row else {"DEEP": kind == INT4 and rows > FEW_ROWS}
    if one_row and kind == INT8:
        extra["EVEN"] = inputs % (splits * config.block_k) == 0 and cols % config.block_n == 0
    # The span is a runtime argument: one compiled kernel per tile config serves every
    # projection shape and split (as a constant it would compile once per shape, seconds on
    # an int8 or int4 engine's start).
    ahead.run(
        kernel, grid, x, weight, scale, parts, rows, cols, inputs, x.stride(0),
        KIND=kind, GROUP=max(group, 1), BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, SPAN=span, num_warps=config.warps, num_stages=config.stages,
        **extra,
    )  # fmt: skip
    return parts


def bf16_pairs(x: Tensor) -> bool:
    """Whether int4's one row multiplies ``x`` as bf16 pairs (``fma.bf16x2``: compute
    capability 8.0 and later)."""
    return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (8, 0)


@torch.library.custom_op("hymt::int4_rows", mutates_args=())
def _int4_rows(x: Tensor, weight: Tensor, scale: Tensor, group: int) -> Tensor:
    """int4 products of more than one row, in ``x``'s dtype."""
    rows = x.shape[0]
    if rows > DEEP_ROWS:
        return x @ widen_int4(weight, scale, group, x.dtype)
    config = config_for(INT4, rows)
    parts = launch(x, weight, scale, INT4, group, splits_for(weight, config), config)
    return sum_splits(parts, x.dtype)


@_int4_rows.register_fake
def _(x: Tensor, weight: Tensor, scale: Tensor, group: int) -> Tensor:
    return x.new_empty(x.shape[0], out_features(weight))


def _kernels() -> tuple[Any, Any]:
    """The tiled kernel (tensor cores) and the one-row kernel (CUDA cores)."""
    return kernels.weight_only_kernel, kernels.one_row_kernel
