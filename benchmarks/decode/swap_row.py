"""One row of an int8 or bf16 product with the weight as the product's left operand.

The engine's tiled kernel computes ``x [16, K] @ w.T [K, BLOCK_N]``: a 16-row left operand, so
Triton runs it on the warp-level MMA of Ampere. With the operands swapped,
``w [BLOCK_N, K] @ x.T [K, 16]``, the left operand has 64 or more rows and Triton can issue
Hopper's warpgroup MMA, its weight tile widened in registers (int8) or read from shared memory
(bf16). This script times both, per projection of a 7B and its LM head (32 layers, 8 distinct
weights in turn, CUDA graph, median of 5), every config checked against the fp32 product:

- ``dot``: the engine's tiled kernel (``weight_only.launch``) at the engine's tiles;
- ``swap``: the swapped product, over a few tiles.

Result (H200, benchmarks/decode/quantized/against-bf16-row/): the swapped product took 1.6-3.6
x the engine's time on every projection, int8 and bf16, so the engine keeps its tiles.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/swap_row.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from bf16_row import COPIES, SHAPES, error_of, launch_dot, median_ms, passes
from fp8_gemm import LAYERS

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.quantized import quantize_int8_rows


@triton.jit(do_not_specialize=["M", "SPAN"])
def swap_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, SPAN,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # One program per (column tile, split): acc [BLOCK_N, BLOCK_M] = w [cols, ks] @ x.T.
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for offset in range(0, SPAN, BLOCK_K):
        ks = start + offset + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w = tl.load(
            w_ptr + cols[:, None].to(tl.int64) * K + ks[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0,
        )
        xt = tl.load(
            x_ptr + rows[None, :] * stride_xm + ks[:, None],
            mask=k_ok[:, None] & row_ok[None, :],
            other=0.0,
        )
        acc += tl.dot(w.to(xt.dtype), xt)
    out = out_ptr + tl.program_id(1) * M * N + rows[None, :] * N + cols[:, None]
    tl.store(out, acc, mask=col_ok[:, None] & row_ok[None, :])


def launch_swap(x: torch.Tensor, w: torch.Tensor, config: tuple[int, ...]) -> torch.Tensor:
    block_n, block_k, warps, stages, programs = config
    n, k = w.shape
    splits = wo.splits_for(w, wo.Config(16, block_n, block_k, warps, stages, programs))
    parts = torch.empty(splits, x.shape[0], n, device=x.device, dtype=torch.float32)
    span = triton.cdiv(k, splits * block_k) * block_k
    swap_kernel[(triton.cdiv(n, block_n), splits)](
        x, w, parts, x.shape[0], n, k, x.stride(0), span, BLOCK_M=16, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return parts.flatten(0, 1)


def engine_tile(form: str, n: int) -> tuple[int, ...]:
    if form == "int8":
        c = wo.ONE_ROW_CONFIGS[wo.INT8]
    else:
        c = wo.WIDE_PLAIN_ROW_CONFIG if n >= wo.WIDE else wo.PLAIN_ROW_CONFIG
    return (c.block_n, c.block_k, c.stages, c.programs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--forms", nargs="+", default=["int8", "bf16"])
    args = parser.parse_args()
    torch.manual_seed(0)
    tiles = list(itertools.product((64, 128), (128, 256), (4, 8), (3, 4), (264, 528)))
    results: dict[str, list[dict[str, object]]] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for form, (name, (n, k)) in itertools.product(args.forms, SHAPES.items()):
        if form == "int8":
            ws = [quantize_int8_rows(torch.randn(n, k, device="cuda") * 0.02)[0]]
        else:
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02]
        ws += [w[torch.randperm(n, device="cuda")] for w in ws * (COPIES - 1)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        read = LAYERS * n * k * ws[0].element_size()
        rows = []
        for kernel, launch, config in [("dot", launch_dot, engine_tile(form, n))] + [
            ("swap", launch_swap, t) for t in tiles
        ]:
            try:
                error = error_of(launch, config, x, ws[0])
                ms = median_ms(partial(passes, launch, x, ws, config))
            except Exception as exc:  # a tile the compiler refuses is reported, not fatal
                print(form, name, kernel, config, f"{exc!r:.200}", flush=True)
                continue
            row = {
                "kernel": kernel,
                "config": list(config),
                "ms": round(ms, 4),
                "tb_s": round(read / ms / 1e9, 2),
                "error": round(error, 6),
            }
            rows.append(row)
            print(form, name, json.dumps(row), flush=True)
        results[f"{form} {name}"] = rows
        (args.out / "swap_row.json").write_text(json.dumps({"rows": results}, indent=2))
        del ws
        torch.cuda.empty_cache()
    lines = ["| form, shape | engine ms (TB/s) | best swap tile | ms (TB/s) | x engine |"]
    lines.append("| --- | ---: | --- | ---: | ---: |")
    for key, rows in results.items():
        engine = next((r for r in rows if r["kernel"] == "dot"), None)
        swaps = [r for r in rows if r["kernel"] == "swap" and r["error"] < 1e-2]  # type: ignore[operator]
        if engine is None or not swaps:
            continue
        best = min(swaps, key=lambda r: r["ms"])  # type: ignore[arg-type,return-value]
        ratio = best["ms"] / engine["ms"]  # type: ignore[operator]
        lines.append(
            f"| {key} | {engine['ms']} ({engine['tb_s']}) | {best['config']} | "
            f"{best['ms']} ({best['tb_s']}) | {ratio:.3f} |"
        )
    print("\n".join(lines), flush=True)
    (args.out / "swap_row.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
