"""int4 at one row on tensor cores without Triton's layout exchange: each lane loads exactly
the nibbles its ``mma.sync`` fragments need, straight from GPTQ's packing.

**Measured on the H200 (2026-12-03): correct, and no faster than the engine.** Its products
matched the dequantized reference (relative error 1.5-1.7e-6). A pass over a 7B's projections
took 1.577 ms at best (4 n-tiles, 2,112 or 4,224 programs) against the engine's 1.602, 1.02 x:
not wired in (quantized/int4-bf16x2/int4_mma.json). With 0.57 warp instructions a word against
0.87 it is no faster, so instructions do not bound the one-row kernel either.
``--check`` compiles it and emulates its lane arithmetic in NumPy (no GPU); ``--out`` checks
and times it on the GPU.

Why: the one-row kernel's loads alone take 1.05 ms a pass over a 7B's projections, and the
kernel 1.60 ms (quantized/int4-bf16x2/). Its arithmetic is 0.87 warp instructions a weight
word, and loads and arithmetic add up. Here the inner loop is 0.50 warp instructions a word
with 8 n-tiles (64 columns a warp), 0.57 with 4 (``loop_sass``-style count of the compiled
loop). Each lane spends 2 integer operations per pair of weights, and the products run on
``mma.m16n8k16`` (bf16, fp32 accumulation).

The layout (one warp, lane = 4 g + c):

- A k-tile's dot product does not care in which order its 16 inputs meet, as long as the input
  and weight fragments agree. So a pair of k-tiles (32 inputs, 4 word rows) gives lane (g, c)
  word row c and the columns ``n0 + 4g .. n0 + 4g + 3`` (+ 32): one 16-byte load per 32
  columns, each word loaded once.
  - Of each word, pairs (j, j + 4) for j = 0, 1 make the first k-tile's weight fragment, and
    j = 2, 3 the second's.
  - ``lop3`` of the word shifted by 4 j with 0x000F000F | 0x43004300 gives the bf16 pair
    (128 + q, 128 + q'), exact.
- The input fragment's row 0 (lanes 0-3) holds the same inputs in the same order: lane c loads
  x[8c .. 8c + 7] of the pair as four bf16 pairs, and ``prmt`` makes (x_j, x_j+4). Rows 1-15
  are zero.
- An MMA against a fragment of ones sums the inputs, so that 128 + the zero point comes off
  once per group: out += scale * (D - (128 + zero) * sum(x)), in fp32.
- n-tile i's logical column g is the physical column n0 + 4g + i. After the MMAs, lane c (of
  lanes 0-3) holds the columns n0 + 8c .. n0 + 8c + 7 (+ 32). It scales them, and finally
  stores them as 16-byte vectors.

All addressing is in the PTX, by ``%laneid``. The Triton side only carries one value per thread
between groups (a 32-element tensor on one warp) and runs the loop.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_mma.py --check
    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_mma.py --out DIR  # GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

from hymt_serve.engine.kernels import weight_only as wo

GROUP = 128  # inputs per group: 8 k-tiles of 16
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def group_asm(tiles: int) -> str:
    """PTX for one group of 128 inputs and ``tiles`` n-tiles (4 or 8: 32 or 64 columns).
    Operands: the lane's 2 * tiles sums out, the same in, then x, the packed weights, the
    scales and zero points (fp16 [2, groups, N]), the group's first input, n0, N, the number
    of groups."""
    sums = 2 * tiles
    x, w, s, kb, n0, n, groups = (f"${sums * 2 + i}" for i in range(7))
    vectors = tiles // 4  # 16-byte weight loads a lane makes per word row
    lines = [
        "{",
        ".reg .pred pg, pn<2>, ps<2>;",
        ".reg .b32 lane, g, c, row, col, col8, gi, t, zr, mask, magic, one2;",
        ".reg .b32 p, q<4>, a<4>, sv<8>, zv<8>;",
        f".reg .b32 w<{16 * vectors}>, x<16>;",
        ".reg .b64 wa, xa, sa, za, off, step;",
        f".reg .f32 d<{4 * tiles}>, e<4>, sf<{sums}>, zf<{sums}>, r<{sums}>, v;",
        ".reg .b16 h0, h1;",
        "mov.u32 lane, %laneid;",
        "shr.u32 g, lane, 2;",
        "and.b32 c, lane, 3;",
        "setp.eq.u32 pg, g, 0;",
        "mov.b32 zr, 0;",
        "mov.b32 mask, 0x000F000F;",
        "mov.b32 magic, 0x43004300;",
        "mov.b32 one2, 0x3F803F80;",
        # weights: word row kb / 8 + c (+ 4 per k-pair), columns n0 + 4g (+ 32) .. + 3
        f"shr.u32 row, {kb}, 3;",
        "add.u32 row, row, c;",
        "shl.b32 col, g, 2;",
        f"add.u32 col, col, {n0};",
        f"setp.lt.u32 pn0, col, {n};",
        "add.u32 t, col, 32;",
        f"setp.lt.u32 pn1, t, {n};",
        f"mad.lo.u32 t, row, {n}, col;",
        "mul.wide.u32 off, t, 4;",
        f"add.u64 wa, {w}, off;",
        f"mul.wide.u32 step, {n}, 16;",  # 4 word rows
        # inputs (lanes 0-3, the fragment's row 0): x[kb + 8c .. + 7] (+ 32 per k-pair)
        "shl.b32 t, c, 3;",
        f"add.u32 t, t, {kb};",
        "mul.wide.u32 off, t, 2;",
        f"add.u64 xa, {x}, off;",
    ]
    for pair in range(4):
        for v in range(vectors):
            regs = [f"w{16 * v + 4 * pair + i}" for i in range(4)]
            lines += [f"mov.b32 {r}, 0;" for r in regs]
            lines.append(f"@pn{v} ld.global.v4.u32 {{{', '.join(regs)}}}, [wa+{128 * v}];")
        if pair < 3:
            lines.append("add.u64 wa, wa, step;")
        regs = [f"x{4 * pair + i}" for i in range(4)]
        lines += [f"mov.b32 {r}, 0;" for r in regs]
        lines.append(f"@pg ld.global.v4.b32 {{{', '.join(regs)}}}, [xa+{64 * pair}];")
    lines += [f"mov.f32 d{i}, 0f00000000;" for i in range(4 * tiles)]
    lines += [f"mov.f32 e{i}, 0f00000000;" for i in range(4)]
    for pair in range(4):
        x0, x1, x2, x3 = (f"x{4 * pair + i}" for i in range(4))
        lines += [  # k-tile A: (x0, x4), (x1, x5); k-tile B: (x2, x6), (x3, x7)
            f"prmt.b32 a0, {x0}, {x2}, 0x5410;",
            f"prmt.b32 a1, {x0}, {x2}, 0x7632;",
            f"prmt.b32 a2, {x1}, {x3}, 0x5410;",
            f"prmt.b32 a3, {x1}, {x3}, 0x7632;",
        ]
        for tile in range(tiles):
            word = f"w{16 * (tile // 4) + 4 * pair + tile % 4}"
            lines.append(f"lop3.b32 q0, {word}, mask, magic, 0xEA;")
            for j in (1, 2, 3):
                lines += [f"shr.u32 p, {word}, {4 * j};", f"lop3.b32 q{j}, p, mask, magic, 0xEA;"]
            d = ", ".join(f"d{4 * tile + k}" for k in range(4))
            lines += [
                f"{MMA} {{{d}}}, {{a0, zr, a1, zr}}, {{q0, q1}}, {{{d}}};",
                f"{MMA} {{{d}}}, {{a2, zr, a3, zr}}, {{q2, q3}}, {{{d}}};",
            ]
        for a_lo, a_hi in (("a0", "a1"), ("a2", "a3")):
            lines.append(
                f"{MMA} {{e0, e1, e2, e3}}, {{{a_lo}, zr, {a_hi}, zr}}, {{one2, one2}}, "
                "{e0, e1, e2, e3};"
            )
    # lanes 0-3: scales and zero points of the columns n0 + 8c .. + 7 (and + 32) of the group
    lines += [
        f"shr.u32 gi, {kb}, 7;",
        "shl.b32 col8, c, 3;",
        f"add.u32 col8, col8, {n0};",
    ]
    for v in range(vectors):
        lines += [
            f"add.u32 t, col8, {32 * v};",
            f"setp.lt.u32 ps{v}, t, {n};",
            f"and.pred ps{v}, ps{v}, pg;",
            f"mad.lo.u32 t, gi, {n}, col8;",
            "mul.wide.u32 off, t, 2;",
            f"add.u64 sa, {s}, off;",
            f"add.u32 t, {groups}, gi;",
            f"mad.lo.u32 t, t, {n}, col8;",
            "mul.wide.u32 off, t, 2;",
            f"add.u64 za, {s}, off;",
        ]
        regs = [f"sv{4 * v + i}" for i in range(4)]
        zregs = [f"zv{4 * v + i}" for i in range(4)]
        lines += [f"mov.b32 {r}, 0;" for r in regs + zregs]
        lines += [
            f"@ps{v} ld.global.v4.b32 {{{', '.join(regs)}}}, [sa+{64 * v}];",
            f"@ps{v} ld.global.v4.b32 {{{', '.join(zregs)}}}, [za+{64 * v}];",
        ]
    for i in range(sums // 2):
        lines += [
            f"mov.b32 {{h0, h1}}, sv{i};",
            f"cvt.f32.f16 sf{2 * i}, h0;",
            f"cvt.f32.f16 sf{2 * i + 1}, h1;",
            f"mov.b32 {{h0, h1}}, zv{i};",
            f"cvt.f32.f16 zf{2 * i}, h0;",
            f"cvt.f32.f16 zf{2 * i + 1}, h1;",
        ]
    for m in range(sums):
        # column n0 + 32 (m // 8) + 8c + m % 8: n-tile 4 (m // 8) + m % 4, register 0 or 1
        tile, low = 4 * (m // 8) + m % 4, m % 8 < 4
        d = f"d{4 * tile + (0 if low else 1)}"
        lines += [
            f"add.f32 zf{m}, zf{m}, 0f43000000;",  # 128 + zero
            f"neg.f32 zf{m}, zf{m};",
            f"fma.rn.f32 v, zf{m}, e0, {d};",
            f"fma.rn.f32 r{m}, sf{m}, v, ${m + sums};",
        ]
    lines += [f"mov.f32 ${m}, r{m};" for m in range(sums)]  # outputs written last
    lines.append("}")
    return "\n".join(lines)


def store_asm(tiles: int) -> str:
    """PTX storing lanes 0-3's sums: $0 a dummy out, then the 2 * tiles sums, the parts
    [splits, N] (fp32), the split, n0, N."""
    sums = 2 * tiles
    out, split, n0, n = (f"${sums + 1 + i}" for i in range(4))
    lines = [
        "{",
        ".reg .pred ps;",
        ".reg .b32 lane, c, col8, t;",
        ".reg .b64 oa, off;",
        "mov.u32 lane, %laneid;",
        "and.b32 c, lane, 3;",
        "shl.b32 col8, c, 3;",
        f"add.u32 col8, col8, {n0};",
        f"mad.lo.u32 t, {split}, {n}, col8;",
        "mul.wide.u32 off, t, 4;",
        f"add.u64 oa, {out}, off;",
    ]
    for v in range(tiles // 4):
        sums_v = [f"${1 + 8 * v + i}" for i in range(8)]
        lines += [
            f"add.u32 t, col8, {32 * v};",
            f"setp.lt.u32 ps, t, {n};",
            "setp.lt.and.u32 ps, lane, 4, ps;",
            f"@ps st.global.v4.f32 [oa+{128 * v}], {{{', '.join(sums_v[:4])}}};",
            f"@ps st.global.v4.f32 [oa+{128 * v + 16}], {{{', '.join(sums_v[4:])}}};",
        ]
    lines += ["mov.b32 $0, 0;", "}"]
    return "\n".join(lines)


GROUP_ASM_4 = tl.constexpr(group_asm(4))
GROUP_ASM_8 = tl.constexpr(group_asm(8))
STORE_ASM_4 = tl.constexpr(store_asm(4))
STORE_ASM_8 = tl.constexpr(store_asm(8))
SUMS_4 = tl.constexpr("=f," * 8 + "f," * 8 + "l,l,l,r,r,r,r")
SUMS_8 = tl.constexpr("=f," * 16 + "f," * 16 + "l,l,l,r,r,r,r")


@triton.jit
def mma_row_kernel(x_ptr, w_ptr, s_ptr, out_ptr, N, K, SPAN, TILES: tl.constexpr):
    # One warp: 8 TILES columns from n0 on, the inputs [split * SPAN, + SPAN) in groups of 128.
    lane = tl.arange(0, 32)
    n0 = tl.program_id(0) * 8 * TILES
    split = tl.program_id(1)
    start = split * SPAN
    limit = tl.minimum(start + SPAN, K)
    f = tl.zeros((32,), dtype=tl.float32)
    xs = (x_ptr + lane * 0).to(tl.int64)  # addresses as integers for the PTX
    ws = (w_ptr + lane * 0).to(tl.int64)
    ss = (s_ptr + lane * 0).to(tl.int64)
    kn0, kn, kgroups = lane * 0 + n0, lane * 0 + N, lane * 0 + K // 128
    out = (out_ptr + lane * 0).to(tl.int64)
    if TILES == 4:
        a = (f, f, f, f, f, f, f, f)
        for kb in range(start, limit, 128):
            a = tl.inline_asm_elementwise(
                GROUP_ASM_4, SUMS_4,
                [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                 xs, ws, ss, lane * 0 + kb, kn0, kn, kgroups],
                dtype=(tl.float32,) * 8, is_pure=True, pack=1,
            )  # fmt: skip
        tl.inline_asm_elementwise(
            STORE_ASM_4, "=r," + "f," * 8 + "l,r,r,r",
            [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
             out, lane * 0 + split, kn0, kn],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    else:
        a = (f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f)
        for kb in range(start, limit, 128):
            a = tl.inline_asm_elementwise(
                GROUP_ASM_8, SUMS_8,
                [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                 a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
                 xs, ws, ss, lane * 0 + kb, kn0, kn, kgroups],
                dtype=(tl.float32,) * 16, is_pure=True, pack=1,
            )  # fmt: skip
        tl.inline_asm_elementwise(
            STORE_ASM_8, "=r," + "f," * 16 + "l,r,r,r",
            [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
             a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
             out, lane * 0 + split, kn0, kn],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip


def splits_for(weight: torch.Tensor, tiles: int, programs: int) -> int:
    """Splits of the input (whole groups) to reach ``programs`` warps."""
    column_tiles = -(-wo.out_features(weight) // (8 * tiles))
    groups = wo.in_features(weight) // GROUP
    splits = 1
    while column_tiles * splits < programs and splits * 2 <= groups:
        splits *= 2
    return splits


def launch(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, tiles: int, programs: int
) -> torch.Tensor:
    """fp32 partial products [splits, 1, N] of one bf16 row (groups of 128, N a multiple of 8)."""
    inputs, cols = wo.in_features(weight), wo.out_features(weight)
    assert x.shape[0] == 1 and x.dtype == torch.bfloat16 and inputs // scale.shape[1] == GROUP
    assert cols % 8 == 0 and x.data_ptr() % 16 == 0
    splits = splits_for(weight, tiles, programs)
    span = triton.cdiv(inputs // GROUP, splits) * GROUP
    parts = x.new_empty(splits, 1, cols, dtype=torch.float32)  # every column of every split
    grid = (triton.cdiv(cols, 8 * tiles), splits)
    mma_row_kernel[grid](
        x, weight, scale, parts, cols, inputs, span, TILES=tiles, num_warps=1, num_stages=1
    )
    return parts


def emulate(x: np.ndarray, packed: np.ndarray, scale: np.ndarray, tiles: int) -> np.ndarray:
    """The kernel's lane arithmetic in NumPy (one split): each lane's fragments as the PTX
    builds them, each MMA as the PTX ISA lays out m16n8k16's fragments, lanes 0-3's sums."""
    inputs, cols = x.shape[0], packed.shape[1]
    out = np.zeros(cols)
    nib = lambda word, j: (int(word) >> (4 * j)) & 0xF  # noqa: E731
    for n0 in range(0, cols, 8 * tiles):
        sums = np.zeros((4, 2 * tiles))  # lanes 0-3
        for gi in range(inputs // GROUP):
            d = np.zeros((tiles, 16, 8))  # D of each n-tile (row 0 real)
            ones = 0.0
            for pair in range(4):
                for half in range(2):  # k-tile A (pairs j = 0, 1), B (j = 2, 3)
                    a = np.zeros((16, 16))
                    b = np.zeros((tiles, 16, 8))
                    for lane in range(32):
                        g, c = divmod(lane, 4)
                        base = gi * GROUP + 32 * pair + 8 * c  # the lane's word: 8 inputs
                        j0, j1 = 2 * half, 2 * half + 1
                        if g == 0:
                            a[0, 2 * c : 2 * c + 2] = [x[base + j0], x[base + j0 + 4]]
                            a[0, 2 * c + 8 : 2 * c + 10] = [x[base + j1], x[base + j1 + 4]]
                        row = base // 8
                        for tile in range(tiles):
                            col = n0 + 32 * (tile // 4) + 4 * g + tile % 4
                            word = packed[row, col] if col < cols else 0
                            b[tile, 2 * c : 2 * c + 2, g] = [
                                128 + nib(word, j0),
                                128 + nib(word, j0 + 4),
                            ]
                            b[tile, 2 * c + 8 : 2 * c + 10, g] = [
                                128 + nib(word, j1),
                                128 + nib(word, j1 + 4),
                            ]
                    for tile in range(tiles):
                        d[tile] += a @ b[tile]
                    ones += a[0].sum()
            for c in range(4):
                for m in range(2 * tiles):
                    col = n0 + 32 * (m // 8) + 8 * c + m % 8
                    if col >= cols:
                        continue
                    tile = 4 * (m // 8) + m % 4
                    value = d[tile, 0, 2 * c] if m % 8 < 4 else d[tile, 0, 2 * c + 1]
                    s, z = scale[0, gi, col], scale[1, gi, col]
                    sums[c, m] += s * (value - (128 + z) * ones)
        for c in range(4):
            for m in range(2 * tiles):
                col = n0 + 32 * (m // 8) + 8 * c + m % 8
                if col < cols:
                    out[col] = sums[c, m]
    return out


def check() -> None:
    """Compile for sm_90 (no GPU needed) and emulate the lane arithmetic against the
    dequantized product."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*fp16", "out_ptr": "*fp32",
                 "N": "i32", "K": "i32", "SPAN": "i32", "TILES": "constexpr"}  # fmt: skip
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}
    torch.manual_seed(0)
    cols, inputs = 104, 256  # partial column tiles, two groups
    q, scale = wo.quantize_int4_groups(torch.randn(cols, inputs) * 0.02)
    x = torch.randn(inputs).to(torch.bfloat16).float()
    want = (x[None, :] @ wo.dequantize(q, scale).T)[0].double().numpy()
    for tiles in (4, 8):
        compiled = triton.compile(
            ASTSource(mma_row_kernel, signature, {"TILES": tiles}, attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 1, "num_stages": 1},
        )
        got = emulate(x.numpy(), q.numpy(), scale.float().numpy(), tiles)
        error = np.linalg.norm(got - want) / np.linalg.norm(want)
        print(f"{tiles} n-tiles: {len(compiled.asm['cubin'])} bytes of sm_90 cubin; the lanes")
        print(f"  emulated against the dequantized product: relative error {error:.2e}")
        assert error < 1e-6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compile and emulate, no GPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.check:
        check()
        return
    from fp8_gemm import LAYERS, SHAPES, timed_graph
    from int4_packed import engine_kernel
    from int4_pairs import one_pass, pass_inputs

    forms, xs = pass_inputs("cuda", 1)
    rows = []
    for (cols, inputs), tiles in itertools.product(
        ((6144, 4096), (4096, 14336), (200, 384)), (4, 8)
    ):
        torch.manual_seed(cols)
        q, s = wo.quantize_int4_groups(torch.randn(cols, inputs, device="cuda") * 0.02)
        x = torch.randn(1, inputs, device="cuda", dtype=torch.bfloat16)
        got = launch(x, q, s, tiles, 1056).sum(0)
        want = wo.reference(x.float(), q, s).float()
        error = ((got - want).norm() / want.norm()).item()
        rows.append({"shape": [cols, inputs], "tiles": tiles, "error": error})
        print(rows[-1], flush=True)

    def timed(run: object) -> float:
        return round(timed_graph(lambda: one_pass(run, xs, forms, None)), 4)

    result = {"engine_ms": timed(engine_kernel), "layers": LAYERS, "shapes": SHAPES}
    for tiles in (4, 8):
        for programs in (528, 1056, 2112, 4224):
            run = lambda x, q, s, _, t=tiles, p=programs: launch(x, q, s, t, p)  # noqa: E731
            result[f"mma_{tiles}_tiles_{programs}_ms"] = timed(run)
    print(result, flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "int4_mma.json").write_text(json.dumps({"errors": rows} | result, indent=2))


if __name__ == "__main__":
    main()
