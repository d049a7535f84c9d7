"""How int8 weights are widened for the tensor cores at one row: the engine's conversion
against byte-permute conversions written in PTX.

The engine's tiled kernel widened each int8 weight with ``w.to(x.dtype)`` (bf16 inputs
still do): to bf16, about 3 instructions an element (``row_tiles.py --sass``: 4.1 a weight
element in the loop, against 2.25 for a bf16 weight, and int8 reads at 3.2 TB/s against
bf16's 3.9). The modes here differ only in that widening (and in the inputs' dtype on the
tensor cores):

- ``engine``: ``w.to(bf16)``, bf16 inputs (the engine's kernel as it is);
- ``fp16``: ``w.to(fp16)``, the inputs cast to fp16 in the kernel;
- ``fp16_prmt``: fp16 inputs; one ``prmt`` puts two bytes (their sign bit flipped: q + 128)
  under fp16's exponent of 1,024, so the halves read 1,024 + 128 + q exactly, and one
  ``sub.f16x2`` takes 1,152 off: 1 instruction an element, exact;
- ``fp16_fold``: as ``fp16_prmt`` without the subtraction: the products are of q + 1,152,
  and 1,152 x (the block's sum of inputs) comes off the accumulator once a block (0.5
  instructions an element; the cancellation costs fp32 bits, not bf16 ones);
- ``bf16_magic``: bf16 inputs; each byte under fp32's exponent of 2^23 (``prmt``), 2^23 + 128
  subtracted in fp32, and the high halves of two such floats paired as bf16x2 (``prmt``):
  the small integers are exact in bf16 (2.5 instructions an element);
- ``fp16_bits``: ``fp16_prmt``'s arithmetic written in Triton's integer operations.

fp16 inputs hold bf16 inputs exactly from 6.1e-5 to 65,504 in magnitude; beyond that they
overflow, and below it they lose bits (fp16's subnormals): the error column says what that
cost on these inputs, which are N(0, 1) like a norm's output.

Measured on an H200 (benchmarks/decode/quantized/int8-fp16/): with fp16 inputs ``fp16_prmt``
took 0.68 x the time of ``fp16`` (the engine widens fp16 inputs this way now); with bf16
inputs no mode beat ``engine``, and ``fp16_prmt`` with fp16 inputs only reached 0.957 x its
time for 22 % fewer instructions.

For each mode and projection shape: 32 layers of it (8 distinct weights in turn, none in L2)
in one CUDA graph, median of 5, on the engine's one-row tile (``fp16_prmt`` with fp16
inputs on six other tiles too), every mode checked against the fp32 product of the int8
values. ``--sass`` needs no GPU: the inner loop's instructions per
weight element for each mode, compiled for sm_90 (one stage).

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int8_widen.py --out DIR [--sass]
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

from hymt_serve.engine.kernels import weight_only as wo

MODES = ("engine", "fp16", "fp16_prmt", "fp16_fold", "bf16_magic", "fp16_bits")
PROJECTIONS = ("qkv", "o", "gate_up", "down")
# (mode, the inputs' dtype in memory): fp16 inputs as a producer kernel would hand them over
VARIANTS = [(m, "bf16") for m in MODES] + [(m, "fp16") for m in (*MODES[1:4], MODES[5])]


@triton.jit  # type: ignore[untyped-decorator]
def _fp16_prmt(w):  # type: ignore[no-untyped-def]
    # four int8 -> four fp16: (q ^ 0x80) under 0x64 bytes is 1024 + 128 + q; minus 1152
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 u, c;
        xor.b32 u, $2, 0x80808080;
        mov.b32 c, 0x64806480;
        prmt.b32 $0, u, 0x64646464, 0x4140;
        prmt.b32 $1, u, 0x64646464, 0x4342;
        sub.f16x2 $0, $0, c;
        sub.f16x2 $1, $1, c;
        }""",
        constraints="=r,=r,r",
        args=[w],
        dtype=tl.float16,
        is_pure=True,
        pack=4,
    )


@triton.jit  # type: ignore[untyped-decorator]
def _fp16_fold(w):  # type: ignore[no-untyped-def]
    # four int8 -> four fp16 values of q + 1152 (exact)
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 u;
        xor.b32 u, $2, 0x80808080;
        prmt.b32 $0, u, 0x64646464, 0x4140;
        prmt.b32 $1, u, 0x64646464, 0x4342;
        }""",
        constraints="=r,=r,r",
        args=[w],
        dtype=tl.float16,
        is_pure=True,
        pack=4,
    )


@triton.jit  # type: ignore[untyped-decorator]
def _bf16_magic(w):  # type: ignore[no-untyped-def]
    # four int8 -> four bf16: 2^23 + (q ^ 0x80) as fp32, minus 2^23 + 128, high halves paired
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 u, f0, f1, f2, f3;
        xor.b32 u, $2, 0x80808080;
        prmt.b32 f0, u, 0x4B000000, 0x7650;
        prmt.b32 f1, u, 0x4B000000, 0x7651;
        prmt.b32 f2, u, 0x4B000000, 0x7652;
        prmt.b32 f3, u, 0x4B000000, 0x7653;
        sub.f32 f0, f0, 0f4B000080;
        sub.f32 f1, f1, 0f4B000080;
        sub.f32 f2, f2, 0f4B000080;
        sub.f32 f3, f3, 0f4B000080;
        prmt.b32 $0, f0, f1, 0x7632;
        prmt.b32 $1, f2, f3, 0x7632;
        }""",
        constraints="=r,=r,r",
        args=[w],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit(do_not_specialize=["M"])  # type: ignore[untyped-decorator]
def widen_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, SPAN,
    MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # The engine's int8 branch of weight_only_kernel, the widening by MODE (the index into
    # MODES); fp32 partial products per split, no scale.
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    x_rows = x_ptr + rows[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for offset in range(0, SPAN, BLOCK_K):
        ks = start + offset + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(
            w_ptr + cols[None, :] * K + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0
        )
        if MODE == 0:
            acc += tl.dot(x, w.to(x.dtype))
        elif MODE == 1:
            acc += tl.dot(x.to(tl.float16), w.to(tl.float16))
        elif MODE == 2:
            acc += tl.dot(x.to(tl.float16), _fp16_prmt(w))
        elif MODE == 3:
            xh = x.to(tl.float16)
            acc += tl.dot(xh, _fp16_fold(w))
            acc -= 1152.0 * tl.sum(xh.to(tl.float32), axis=1)[:, None]
        elif MODE == 4:
            acc += tl.dot(x, _bf16_magic(w))
        else:
            u = (w.to(tl.int16) + 128) | 0x6400
            acc += tl.dot(x.to(tl.float16), u.to(tl.float16, bitcast=True) - 1152.0)
    out = out_ptr + tl.program_id(1) * M * N + rows[:, None] * N + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])


ENGINE_TILE = wo.ONE_ROW_CONFIGS[wo.INT8]
# (block_n, block_k, warps, stages, programs) tried for fp16_prmt with fp16 inputs beside the
# engine's: fewer instructions an element may want other tiles
TILES = [(64, 128, 4, 3, 528), (128, 256, 4, 3, 264), (64, 256, 8, 3, 264),
         (128, 128, 4, 3, 264), (64, 512, 4, 3, 264), (32, 256, 4, 3, 264)]  # fmt: skip


def launch(mode: str, x: torch.Tensor, w: torch.Tensor, tile: tuple[int, ...]) -> torch.Tensor:
    """One row's partial products ``[splits, out]`` of ``mode`` on ``tile``."""
    config = wo.Config(16, *tile)
    n, k = w.shape
    splits = wo.splits_for(w, config)
    parts = torch.empty(splits, x.shape[0], n, device=x.device, dtype=torch.float32)
    span = triton.cdiv(k, splits * config.block_k) * config.block_k
    grid = (triton.cdiv(n, config.block_n), splits, 1)
    widen_kernel[grid](
        x, w, parts, x.shape[0], n, k, x.stride(0), span, MODE=MODES.index(mode),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return parts.flatten(0, 1)


def sass_counts(out: Path) -> list[dict[str, object]]:
    from loop_sass import ARGS, compiled, loop_counts

    config = wo.ONE_ROW_CONFIGS[wo.INT8]
    names = ("x_ptr", "w_ptr", "out_ptr", "M", "N", "K", "stride_xm")
    signature = {n: ARGS[n] for n in names} | {"w_ptr": "*i8", "SPAN": "i32"}
    signature |= {n: "constexpr" for n in ("MODE", "BLOCK_M", "BLOCK_N", "BLOCK_K")}
    found = []
    for mode, inputs in VARIANTS:
        constants = {"MODE": MODES.index(mode), "BLOCK_M": 16, "BLOCK_N": config.block_n}
        constants["BLOCK_K"] = config.block_k
        x_type = {"bf16": "*bf16", "fp16": "*fp16"}[inputs]
        kernel = compiled(widen_kernel, signature | {"x_ptr": x_type}, constants, config.warps)
        counts = loop_counts(kernel.asm["cubin"], out / f"{mode}-{inputs}.cubin")
        per_thread = config.block_n * config.block_k / (32 * config.warps)
        found.append(
            {"mode": mode, "inputs": inputs, "loop_instructions": counts["instructions"],
             "per_element": round(counts["instructions"] / per_thread, 2), "ops": counts["ops"]}
        )  # fmt: skip
        top = sorted(counts["ops"].items(), key=lambda item: -item[1])[:10]
        print(json.dumps({k: v for k, v in found[-1].items() if k != "ops"}), top, flush=True)
    (out / "widen_sass.json").write_text(json.dumps(found, indent=1) + "\n")
    return found


def timings(out: Path) -> None:
    from bf16_row import COPIES, SHAPES, median_ms, passes
    from fp8_gemm import LAYERS

    from hymt_serve.engine.kernels.quantized import quantize_int8_rows

    torch.manual_seed(0)
    engine = tuple(ENGINE_TILE[1:])
    cases = [(mode, inputs, engine) for mode, inputs in VARIANTS]
    cases += [("fp16_prmt", "fp16", tile) for tile in TILES]
    rows: list[dict[str, object]] = []
    for name in PROJECTIONS:
        n, k = SHAPES[name]
        ws = [quantize_int8_rows(torch.randn(n, k, device="cuda") * 0.02)[0] for _ in range(COPIES)]
        xs = {"bf16": torch.randn(1, k, device="cuda", dtype=torch.bfloat16)}
        xs["fp16"] = xs["bf16"].half()
        want = torch.nn.functional.linear(xs["bf16"].float(), ws[0].float()).reshape(-1)
        read = LAYERS * n * k
        for mode, inputs, tile in cases:
            x = xs[inputs]
            got = launch(mode, x, ws[0], tile).sum(0)
            error = ((got - want).norm() / want.norm()).item()
            ms = median_ms(partial(passes, partial(launch, mode), x, ws, tile))
            rows.append(
                {"shape": name, "mode": mode, "inputs": inputs, "tile": list(tile),
                 "ms": round(ms, 4), "tb_s": round(read / ms / 1e9, 2),
                 "error": float(f"{error:.3g}")}
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        del ws
        torch.cuda.empty_cache()
    (out / "widen.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        f"# int8 widening at one row: {torch.cuda.get_device_name()}, torch {torch.__version__}",
        "",
        "32 layers of each projection in one CUDA graph, median of 5; error: relative to the "
        "fp32 product of the int8 values and the bf16 inputs.",
        "",
        "| mode | inputs | tile (block_n, block_k, warps, stages, programs) | "
        + " | ".join(f"{p} ms (TB/s)" for p in PROJECTIONS)
        + " | four | engine / this | max error |",
        "| --- | --- | --- | " + " | ".join("---:" for _ in PROJECTIONS) + " | ---: " * 3 + "|",
    ]
    base = sum(r["ms"] for r in rows if (r["mode"], r["inputs"]) == ("engine", "bf16"))  # type: ignore[misc]
    for mode, inputs, tile in cases:
        mine = {
            r["shape"]: r for r in rows
            if (r["mode"], r["inputs"], tuple(r["tile"])) == (mode, inputs, tile)  # type: ignore[arg-type]
        }  # fmt: skip
        total = sum(r["ms"] for r in mine.values())  # type: ignore[misc]
        cells = " | ".join(f"{mine[p]['ms']} ({mine[p]['tb_s']})" for p in PROJECTIONS)
        worst = max(r["error"] for r in mine.values())  # type: ignore[type-var]
        lines.append(
            f"| {mode} | {inputs} | {tile} | {cells} | {total:.4f} | {base / total:.3f} | {worst} |"
        )
    (out / "widen.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sass", action="store_true", help="count instructions only (no GPU)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sass:
        sass_counts(args.out)
    else:
        timings(args.out)


if __name__ == "__main__":
    main()
