"""bf16 products of one row: cuBLAS against two Triton kernels, per projection of a 7B.

At batch 1 a decode step is a read of the weights. cuBLAS reads gate_up and down at about
4.0-4.2 TB/s, but qkv (6,144 x 4,096: 96 column tiles of 64, fewer than the H200's 132 SMs,
no split) and o (split-K, then a reduction kernel) at about 3.1-3.2 TB/s, and each split-K
product adds a reduction kernel (benchmarks/decode/blas/default-2/results.md). Both Triton
kernels here write fp32 partial sums ``[splits, N]`` that the engine's next (inductor) kernel
would sum, so no reduction kernel is counted for them:

- ``rows``: CUDA cores, a ``[BLOCK_N, BLOCK_K]`` tile of weight rows per iteration, the next
  tile loaded before this one's arithmetic (Triton pipelines only loads that feed tl.dot);
- ``dot``: the engine's tiled weight-only kernel with a bf16 weight (a 16-row tile of which
  one row is live, on tensor cores, its loads pipelined by Triton).

For each projection shape: 32 layers of it (8 distinct weights in turn, so nothing sits in
L2) in one CUDA graph, median of 5 timings, every config checked against the fp32 product.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/bf16_row.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from fp8_gemm import LAYERS, timed_graph

from hymt_serve.engine.kernels import weight_only as wo

SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "head": (128256, 4096),
}
COPIES = 8


@triton.jit(do_not_specialize=["SPAN"])
def rows_kernel(
    x_ptr, w_ptr, out_ptr, N, K, SPAN, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):  # fmt: skip
    # One program per (tile of BLOCK_N weight rows, split of the inputs).
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    limit = tl.minimum(start + SPAN, K)
    ks = start + tl.arange(0, BLOCK_K)
    rows = w_ptr + cols[:, None].to(tl.int64) * K
    w = tl.load(rows + ks[None, :], mask=col_ok[:, None] & (ks < limit)[None, :], other=0.0)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for _ in range(0, SPAN, BLOCK_K):
        nxt = ks + BLOCK_K
        ok = col_ok[:, None] & (nxt < limit)[None, :]
        ahead = tl.load(rows + nxt[None, :], mask=ok, other=0.0)
        x = tl.load(x_ptr + ks, mask=ks < limit, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        w, ks = ahead, nxt
    tl.store(out_ptr + tl.program_id(1) * N + cols, tl.sum(acc, axis=1), mask=col_ok)


def launch_rows(x: torch.Tensor, w: torch.Tensor, config: tuple[int, ...]) -> torch.Tensor:
    block_n, block_k, warps, programs = config
    n, k = w.shape
    splits = wo.splits_for(w, wo.Config(1, block_n, block_k, warps, 1, programs))
    parts = torch.empty(splits, n, device=x.device, dtype=torch.float32)
    span = triton.cdiv(k, splits * block_k) * block_k
    rows_kernel[(triton.cdiv(n, block_n), splits)](
        x, w, parts, n, k, span, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps
    )
    return parts


def launch_dot(x: torch.Tensor, w: torch.Tensor, config: tuple[int, ...]) -> torch.Tensor:
    """The engine's tiled kernel (``weight_only.launch``): a plain weight as the engine's
    batch-1 step runs it, or an int8 one (its scale not applied)."""
    block_n, block_k, stages, programs = config
    tiles = wo.Config(16, block_n, block_k, 4, stages, programs)
    kind = wo.INT8 if w.dtype == torch.int8 else wo.PLAIN
    return wo.launch(x, w, w, kind, 0, wo.splits_for(w, tiles), tiles).flatten(0, 1)


def launch_cublas(x: torch.Tensor, w: torch.Tensor, config: tuple[int, ...]) -> torch.Tensor:
    return F.linear(x, w)


def error_of(launch: object, config: tuple[int, ...], x: torch.Tensor, w: torch.Tensor) -> float:
    got = launch(x, w, config).float()  # type: ignore[operator]
    got = got.sum(0) if got.dim() == 2 and got.shape[0] > 1 else got.reshape(-1)
    want = F.linear(x.float(), w.float()).reshape(-1)
    return ((got - want).norm() / want.norm()).item()


def passes(
    launch: object, x: torch.Tensor, ws: list[torch.Tensor], config: tuple[int, ...]
) -> None:
    for layer in range(LAYERS):
        launch(x, ws[layer % COPIES], config)  # type: ignore[operator]


def median_ms(run: object) -> float:
    return statistics.median(timed_graph(run) for _ in range(5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    torch.manual_seed(0)
    variants = [("cublas", launch_cublas, (0,))]
    variants += [
        ("rows", launch_rows, c)
        for c in itertools.product((8, 16, 32), (256, 512), (4, 8), (264, 528, 1056))
    ]
    variants += [
        ("dot", launch_dot, c)
        for c in itertools.product((32, 64, 128), (128, 256), (3, 5), (264, 528))
    ]
    results: dict[str, list[dict[str, object]]] = {}
    for name in args.shapes:
        n, k = SHAPES[name]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        read = LAYERS * n * k * 2
        rows = []
        for kernel, launch, config in variants:
            if kernel == "dot" and name == "head" and config[0] < 64:
                continue
            try:
                error = error_of(launch, config, x, ws[0])
            except triton.runtime.errors.OutOfResources:
                continue  # the tile does not fit the SM's shared memory
            ms = median_ms(partial(passes, launch, x, ws, config))
            row = {
                "kernel": kernel,
                "config": list(config),
                "ms": round(ms, 4),
                "tb_s": round(read / ms / 1e9, 2),
                "error": round(error, 5),
            }
            rows.append(row)
            print(name, json.dumps(row), flush=True)
        results[name] = rows
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bf16_row.json").write_text(json.dumps({"rows": results}, indent=2))
        del ws
        torch.cuda.empty_cache()
    summary = []
    for name, rows in results.items():
        base = next(r for r in rows if r["kernel"] == "cublas")
        for kernel in ("rows", "dot"):
            ok = [r for r in rows if r["kernel"] == kernel and r["error"] < 1e-2]
            best = min(ok, key=lambda r: r["ms"])  # type: ignore[arg-type,return-value]
            summary.append(
                {
                    "shape": name,
                    "kernel": kernel,
                    "config": best["config"],
                    "ms": best["ms"],
                    "tb_s": best["tb_s"],
                    "cublas_ms": base["ms"],
                    "cublas_tb_s": base["tb_s"],
                    "vs_cublas": round(best["ms"] / base["ms"], 3),  # type: ignore[operator]
                }
            )
    head = (
        "| shape | kernel | config | ms / 32 layers | TB/s | cuBLAS ms | cuBLAS TB/s | x cuBLAS |"
    )
    lines = [head]
    lines.append("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for s in summary:
        lines.append(
            f"| {s['shape']} | {s['kernel']} | {s['config']} | {s['ms']} | {s['tb_s']} | "
            f"{s['cublas_ms']} | {s['cublas_tb_s']} | {s['vs_cublas']} |"
        )
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "rows": results, "best": summary}
    (args.out / "bf16_row.json").write_text(json.dumps(report, indent=2))
    (args.out / "bf16_row.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
