"""int4's one row with bf16 inputs, two products per instruction (``fma.bf16x2``): the Triton
code of :mod:`hymt_serve.engine.kernels.weight_only`'s one-row int4 path on GPUs of compute
capability 8.0 and later.

- ``int4_chain_kernel``: the engine's kernel. Each thread holds a few columns and walks the
  words of a block one by one, each column's bf16 pair sum running on over ``CHAIN`` words;
  the warps of a program take word streams of their own, summed once at the end;
  ``launch_chain`` runs it;
- ``int4_bf16x2``: one block of ``weight_only_kernels.int4_row``'s ``[words, columns]`` tile
  (the alternative to the chains; ``weight_only.INT4_BF16_ROW`` picks it);
- ``bf16x2_step``, ``low_halves``, ``high_halves``: the arithmetic both share.

The arithmetic, per word and pair j: ``lop3`` makes the bf16 pair ``(128 + q_j, 128 + q_j+4)``
(nibble values under bf16's exponent of 128: exact), one ``fma.bf16x2`` takes 128 + the zero
point off (small integers: exact) and one more multiplies by ``(x[8w + j], x[8w + j + 4])`` and
adds. The inputs load as four bf16 pairs a word, ``(x[8w], x[8w + 1])``, ..., and ``prmt``
makes the ``(j, j + 4)`` pairs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hymt_serve.engine.kernels import ahead
from hymt_serve.engine.kernels.weight_forms import out_features

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU image has no Triton; the reference serves there
    triton = None
    tl = None

CHAIN_WORDS = 4  # words a bf16 pair sum runs over before it widens to fp32 (16 products a half)


def launch_chain(
    x: Tensor, weight: Tensor, scale: Tensor, group: int, splits: int, config: Any
) -> Tensor:
    """int4's rows with bf16 inputs in ``int4_chain_kernel``: fp32 partial products
    ``[splits, rows, out]`` (the caller sums them; inductor reads a sum of fewer than
    ``model.SPLIT_SUMS_READ`` splits inside the next kernel). ``config.block_k`` inputs a
    block of a program (a ``weight_only.Config``), taken by its ``config.warps`` warps as word
    streams of ``block_k / 8 / warps`` words each (a divisor of the group's 16 words or
    more)."""
    rows, inputs = x.shape
    cols = out_features(weight)
    words = config.block_k // 8 // config.warps
    assert words and group % (8 * words) == 0, (config, group)
    parts = x.new_empty(splits, rows, cols, dtype=torch.float32)
    span = triton.cdiv(inputs, splits * config.block_k) * config.block_k
    grid = (triton.cdiv(cols, config.block_n), splits, rows)
    ahead.run(
        int4_chain_kernel, grid, x, weight, scale, parts, rows, cols, inputs, x.stride(0), span,
        GROUP=group, BLOCK_N=config.block_n, WORDS=words, STREAMS=config.warps,
        CHAIN=min(CHAIN_WORDS, words), num_warps=config.warps, num_stages=1,
    )  # fmt: skip
    return parts


if triton is not None:

    @triton.jit(do_not_specialize=["M", "SPAN"])  # type: ignore[untyped-decorator]
    def int4_chain_kernel(  # type: ignore[no-untyped-def]
        x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, SPAN, GROUP: tl.constexpr,
        BLOCK_N: tl.constexpr, WORDS: tl.constexpr, STREAMS: tl.constexpr,
        CHAIN: tl.constexpr,
    ):  # fmt: skip
        # One program per (column tile, split, row); out: fp32 partial sums [splits, M, N].
        # SPAN inputs a split, a multiple of 8 * WORDS * STREAMS. Each block, stream s (a
        # warp's rows of the [STREAMS, BLOCK_N] tiles) takes the WORDS words from
        # base + s * WORDS on, inside one group (8 * WORDS divides GROUP). Each column's bf16
        # pair sum runs over CHAIN words (4 * CHAIN products a half, each sum rounded to
        # 2^-9 of its size: far under int4's own rounding of a weight, half a step of 16),
        # then widens to fp32 and takes the group's scale. No data moves between threads
        # until the streams' sums meet at the end.
        x_row = x_ptr + tl.program_id(2) * stride_xm
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        start = tl.program_id(1) * SPAN
        limit = tl.minimum(start + SPAN, K) // 8  # words from here on load as zero
        pairs = x_row.to(tl.pointer_type(tl.int32))  # (x[8w + 2i], x[8w + 2i + 1]) at 4w + i
        total = tl.zeros((STREAMS, BLOCK_N), dtype=tl.float32)
        streams = tl.arange(0, STREAMS) * WORDS
        for offset in range(0, SPAN, 8 * WORDS * STREAMS):
            first = (start + offset) // 8 + streams  # each stream's first word of the block
            packed = ()
            for d in tl.static_range(WORDS):  # every word's load before any arithmetic
                ok = (first + d < limit)[:, None] & col_ok[None, :]
                where = w_ptr + (first + d)[:, None] * N + cols[None, :]
                packed = packed + (tl.load(where, mask=ok, other=0),)  # type: ignore[assignment]  # noqa: RUF005
            g = (first * 8 // GROUP)[:, None]
            live = (first < limit)[:, None] & col_ok[None, :]
            scale = tl.load(s_ptr + g * N + cols[None, :], mask=live, other=0.0)
            zero = tl.load(s_ptr + (K // GROUP + g) * N + cols[None, :], mask=live, other=0.0)
            minus = minus_pair(zero)
            acc = tl.zeros((STREAMS, BLOCK_N), dtype=tl.int32)  # the bf16 pair (+0, +0)
            for d in tl.static_range(WORDS):
                ok = first + d < limit
                p0 = tl.load(pairs + (first + d) * 4, mask=ok, other=0)
                p1 = tl.load(pairs + (first + d) * 4 + 1, mask=ok, other=0)
                p2 = tl.load(pairs + (first + d) * 4 + 2, mask=ok, other=0)
                p3 = tl.load(pairs + (first + d) * 4 + 3, mask=ok, other=0)
                acc = word_products(packed[d], p0, p1, p2, p3, minus, acc)
                if (d + 1) % CHAIN == 0:
                    total += widened(acc) * scale.to(tl.float32)
                    acc = tl.zeros((STREAMS, BLOCK_N), dtype=tl.int32)
        out = out_ptr + tl.program_id(1) * M * N + tl.program_id(2) * N + cols
        tl.store(out, tl.sum(total, axis=0), mask=col_ok)

    @triton.jit
    def word_products(packed, p0, p1, p2, p3, minus, acc):  # type: ignore[no-untyped-def]
        # acc [rows, columns] plus the eight products of each row's word, the row's inputs
        # given as four bf16 pairs [rows]: (x[8w], x[8w + 1]), ..., (x[8w + 6], x[8w + 7]).
        acc = bf16x2_step(packed, low_halves(p0, p2)[:, None], minus, acc)
        acc = bf16x2_step(packed >> 4, high_halves(p0, p2)[:, None], minus, acc)
        acc = bf16x2_step(packed >> 8, low_halves(p1, p3)[:, None], minus, acc)
        return bf16x2_step(packed >> 12, high_halves(p1, p3)[:, None], minus, acc)

    @triton.jit
    def minus_pair(zero):  # type: ignore[no-untyped-def]
        # -(128 + zero) as a bf16 pair (int32), for bf16x2_step.
        minus = (-(zero.to(tl.float32) + 128.0)).to(tl.bfloat16).to(tl.int16, bitcast=True)
        minus = minus.to(tl.int32) & 0xFFFF
        return minus | (minus << 16)

    @triton.jit
    def widened(acc):  # type: ignore[no-untyped-def]
        # The two bf16 halves of each pair in acc, added in fp32.
        return (acc << 16).to(tl.float32, bitcast=True) + (acc & -65536).to(
            tl.float32, bitcast=True
        )

    @triton.jit  # type: ignore[untyped-decorator]
    def int4_bf16x2(  # type: ignore[no-untyped-def]
        x_row, words, word_ok, packed, scale, zero, DEPTH: tl.constexpr, BLOCK_N: tl.constexpr
    ):
        # One block's [words, columns] products for int4_row with bf16 inputs: a word's four
        # products a half round in bf16, the block's sums widen to fp32 word by word. About
        # 28 instructions a word (int4_pairs' fp32: 48; int4_chain_kernel's: 21-25).
        pairs = x_row.to(tl.pointer_type(tl.int32)) + words * 4  # (x[8w + 2i], x[8w + 2i + 1])
        p0 = tl.load(pairs, mask=word_ok, other=0)
        p1 = tl.load(pairs + 1, mask=word_ok, other=0)
        p2 = tl.load(pairs + 2, mask=word_ok, other=0)
        p3 = tl.load(pairs + 3, mask=word_ok, other=0)
        minus = tl.broadcast_to(minus_pair(zero)[None, :], (DEPTH, BLOCK_N))
        acc = tl.zeros((DEPTH, BLOCK_N), dtype=tl.int32)  # the bf16 pair (+0, +0)
        acc = word_products(packed, p0, p1, p2, p3, minus, acc)
        return widened(acc) * scale[None, :]

    @triton.jit
    def bf16x2_step(shifted, x_pair, minus, acc):  # type: ignore[no-untyped-def]
        # acc + (the pair in the low nibbles of each half of ``shifted``, less 128 + the zero
        # point) * x_pair (broadcast to acc's shape), in bf16 pairs.
        return tl.inline_asm_elementwise(
            "{ .reg .b32 p, w, mask, magic, one;"
            " mov.b32 mask, 0x000F000F; mov.b32 magic, 0x43004300; mov.b32 one, 0x3F803F80;"
            " lop3.b32 p, $1, mask, magic, 0xEA;"  # (a & mask) | magic: 128 + q, 128 + q'
            " fma.rn.bf16x2 w, p, one, $3;"  # q - zero, q' - zero
            " fma.rn.bf16x2 $0, w, $2, $4; }",
            "=r,r,r,r,r",
            [shifted, tl.broadcast_to(x_pair, acc.shape), minus, acc],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )

    @triton.jit
    def low_halves(a, b):  # type: ignore[no-untyped-def]
        # The low halves of a and b as one pair (prmt).
        return tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1
        )

    @triton.jit
    def high_halves(a, b):  # type: ignore[no-untyped-def]
        # The high halves of a and b as one pair (prmt).
        return tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1
        )
