"""The Triton code of :mod:`hymt_serve.engine.kernels.int4_gemm`: int4 weight-only products on
tensor cores at every row count.

``int4_gemm_kernel`` keeps the weight in GPTQ's packing in memory (int32 ``[in / 8, out]``,
eight 4-bit values along the input, lowest bits first; fp16 scales and zero points
``[2, groups, out]``). Each block it loads ``BLOCK_K / 8`` packed words by ``BLOCK_N``
columns, widens them in registers to a ``[BLOCK_K, BLOCK_N]`` tile of ``scale * (q - zero)``
in the inputs' dtype (:func:`dequantized`) and feeds ``tl.dot`` against the inputs' tile,
accumulating in fp32. One program per (row tile, column tile, split of the input
dimension): the row tiles of a column tile run side by side, so a weight tile that more than
one row tile reads comes from L2 the second time.

The widening, compiled (``PTX``): GPTQ's word holds nibbles j and j + 4 sixteen bits apart,
so one ``lop3`` puts both under bf16's exponent of 128 (fp16's of 1,024), ``128 + q`` in each
half of a register, exactly; one ``fma`` pair-instruction takes ``128 + zero`` off (small
integers: exact) and one more multiplies by the group's scale: three instructions for two
weights and no int-to-float conversion (the same magic-number trick as Marlin's, written
here for Triton's ``inline_asm_elementwise``). Triton's interpreter runs no PTX; there
(``PTX`` false) the same values come from shifts, masks and float arithmetic, and the tiles
multiply in fp32: Triton 3.5.1's interpreter multiplies bf16 tiles wrongly in ``tl.dot``
(values of order 1e9 from tiles of ones: their bit patterns, it seems).
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU image has no Triton; the reference serves there
    triton = None
    tl = None

# The inline PTX runs where the kernel is compiled, not in Triton's interpreter (CPU tests).
COMPILED = os.environ.get("TRITON_INTERPRET", "0") != "1"

# Pair arithmetic per input dtype: the magic exponent that a nibble ORed into a half's low
# bits sits under (bf16 128 = 0x4300, fp16 1,024 = 0x6400), and the fma's suffix.
MAGIC = {"bf16": 0x4300, "fp16": 0x6400}

if triton is not None:

    @triton.jit(do_not_specialize=["M", "SPAN"])  # type: ignore[untyped-decorator]
    def int4_gemm_kernel(  # type: ignore[no-untyped-def]
        x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, SPAN,
        GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, PTX: tl.constexpr, EVEN_N: tl.constexpr,
        PARTS: tl.constexpr,
    ):  # fmt: skip
        # out: PARTS, fp32 partial products [splits, M, N]; else the product [M, N] in out's
        # dtype. SPAN: the blocks of a split (counted in blocks, so that Triton knows every
        # block's start aligned and copies the inputs' tiles ahead); BLOCK_K divides GROUP and
        # K, so a block lies in one group and no input needs a mask (a split stops at K).
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        if EVEN_N:
            col_ok = tl.full((BLOCK_N,), True, tl.int1)
        start = tl.program_id(2) * SPAN * BLOCK_K
        end = tl.minimum(start + SPAN * BLOCK_K, K)
        words = tl.arange(0, BLOCK_K // 8)
        ks = tl.arange(0, BLOCK_K)
        x_rows = x_ptr + rows[:, None] * stride_xm + ks[None, :]
        w_cols = w_ptr + words[:, None] * N + cols[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(start, end, BLOCK_K):
            x = tl.load(x_rows + k0, mask=row_ok[:, None], other=0.0)
            # the weights are read once a step: first out of L2, so the inputs stay
            packed = tl.load(
                w_cols + (k0 // 8) * N, mask=col_ok[None, :], other=0,
                eviction_policy="evict_first",
            )  # fmt: skip
            g = k0 // GROUP
            scale = tl.load(s_ptr + g * N + cols, mask=col_ok, other=0.0)
            zero = tl.load(s_ptr + (K // GROUP + g) * N + cols, mask=col_ok, other=0.0)
            w = dequantized(packed, scale, zero, x.dtype, BLOCK_K, BLOCK_N, PTX)
            if PTX:  # noqa: SIM108 (Triton code)
                acc = tl.dot(x, w, acc)
            else:  # (the interpreter: see the module's docstring)
                acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc)
        out = out_ptr + rows[:, None] * N + cols[None, :]
        if PARTS:
            out += tl.program_id(2) * M * N
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit  # type: ignore[untyped-decorator]
    def dequantized(  # type: ignore[no-untyped-def]
        packed, scale, zero, dtype: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_N: tl.constexpr, PTX: tl.constexpr,
    ):  # fmt: skip
        # packed [BLOCK_K / 8, BLOCK_N] words -> [BLOCK_K, BLOCK_N] of scale * (q - zero) in
        # dtype, row 8w + j from nibble j of word w. scale, zero: fp16 [BLOCK_N].
        if PTX:
            s = scale.to(dtype)
            minus = (-(zero.to(tl.float32) + magic_of(dtype))).to(dtype)
            n0, n4, n1, n5, n2, n6, n3, n7 = tl.inline_asm_elementwise(
                pair_asm(dtype),
                "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h",
                [packed, tl.broadcast_to(s[None, :], packed.shape),
                 tl.broadcast_to(minus[None, :], packed.shape)],
                dtype=(s.dtype, s.dtype, s.dtype, s.dtype, s.dtype, s.dtype, s.dtype, s.dtype),
                is_pure=True,
                pack=1,
            )  # fmt: skip
        else:
            s = scale.to(tl.float32)[None, :]
            z = zero.to(tl.float32)[None, :]
            n0 = (((packed >> 0) & 0xF).to(tl.float32) - z) * s
            n1 = (((packed >> 4) & 0xF).to(tl.float32) - z) * s
            n2 = (((packed >> 8) & 0xF).to(tl.float32) - z) * s
            n3 = (((packed >> 12) & 0xF).to(tl.float32) - z) * s
            n4 = (((packed >> 16) & 0xF).to(tl.float32) - z) * s
            n5 = (((packed >> 20) & 0xF).to(tl.float32) - z) * s
            n6 = (((packed >> 24) & 0xF).to(tl.float32) - z) * s
            n7 = (((packed >> 28) & 0xF).to(tl.float32) - z) * s
        return along_inputs(n0, n1, n2, n3, n4, n5, n6, n7, BLOCK_K, BLOCK_N).to(dtype)

    @triton.jit  # type: ignore[untyped-decorator]
    def along_inputs(  # type: ignore[no-untyped-def]
        n0, n1, n2, n3, n4, n5, n6, n7, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr
    ):
        # Eight [W, N] tiles (nibble j of each word) -> [8W, N], row 8w + j from n_j[w]. Each
        # join adds a minor dimension held by the same thread: j = e + 2f + 4g.
        e = tl.join(tl.join(n0, n1), tl.join(n2, n3))  # [W, N, e, f]
        f = tl.join(tl.join(n4, n5), tl.join(n6, n7))
        both = tl.join(e, f)  # [W, N, e, f, g]
        return tl.reshape(tl.permute(both, (0, 4, 3, 2, 1)), (BLOCK_K, BLOCK_N))

    @triton.jit  # type: ignore[untyped-decorator]
    def magic_of(dtype: tl.constexpr):  # type: ignore[no-untyped-def]
        # The value of the magic exponent's bit pattern: 128 in bf16, 1,024 in fp16.
        if dtype == tl.bfloat16:
            return 128.0
        else:
            return 1024.0

    @triton.constexpr_function
    def pair_asm(dtype):  # type: ignore[no-untyped-def]
        # The PTX of one word: outputs $0..$7 the weights of nibbles 0, 4, 1, 5, 2, 6, 3, 7;
        # $8 the word, $9 the scale, $10 -(magic + zero). For each pair i: lop3 makes
        # (magic + q_i, magic + q_i+4) (a & 0x000F000F | magic), one fma adds -(magic +
        # zero) (exact), one more multiplies by the scale (adding -0: a product rounded once).
        name = "bf16" if dtype == tl.bfloat16 else "f16"
        magic = MAGIC["bf16" if dtype == tl.bfloat16 else "fp16"]
        one = 0x3F80 if dtype == tl.bfloat16 else 0x3C00
        lines = [
            "{ .reg .b32 w, p, t, s2, m2, one, nz, mask, mg;",
            "mov.b32 s2, {$9, $9}; mov.b32 m2, {$10, $10};",
            f"mov.b32 one, {hex(one << 16 | one)}; mov.b32 nz, 0x80008000;",
            f"mov.b32 mask, 0x000F000F; mov.b32 mg, {hex(magic << 16 | magic)};",
            "mov.b32 w, $8;",
        ]
        for i in range(4):
            if i:
                lines.append("shr.u32 w, w, 4;")
            lines += [
                "lop3.b32 p, w, mask, mg, 0xEA;",
                f"fma.rn.{name}x2 t, p, one, m2;",
                f"fma.rn.{name}x2 t, t, s2, nz;",
                f"mov.b32 {{${2 * i}, ${2 * i + 1}}}, t;",
            ]
        return " ".join([*lines, "}"])
