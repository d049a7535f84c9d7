"""FP8 (e4m3) products of one to a few rows: ``torch._scaled_mm`` (what the engine runs for
an FP8 weight at every row count) against the tiled weight-only kernel multiplying the e4m3
row and weight on FP8 tensor cores (``tl.dot`` of two e4m3 tiles, fp32 partial sums per split
of the input dimension), on a sweep of tiles.

Both take the same inputs: the row quantized to e4m3 with one scale (as a checkpoint's static
``input_scale`` does, fused into the kernel that makes the row inside a compiled step), the
weight e4m3 with one scale. For each of a 7B's projections, 32 layers in one CUDA graph (8
distinct weights in turn, none left in L2), median of 5; each tile's result checked against
``_scaled_mm``'s (relative error of the sums, both in fp32).

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/fp8_row.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial
from pathlib import Path

import torch
from bf16_row import COPIES, median_ms
from bf16_row import SHAPES as ROW_SHAPES
from fp8_gemm import LAYERS

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.quantized import FP8

SHAPES = {name: ROW_SHAPES[name] for name in ("qkv", "o", "gate_up", "down")}  # no LM head


def scaled_mm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, *_: object) -> torch.Tensor:
    return torch._scaled_mm(x, w.t(), scale_a=scale, scale_b=scale, out_dtype=torch.float32)


def tiled(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, config: wo.Config) -> torch.Tensor:
    parts = wo.launch(x, w, w, wo.PLAIN, 0, wo.splits_for(w, config), config)
    return parts.sum(0) * (scale * scale)


def layers(run: object, xs: torch.Tensor, weights: list[torch.Tensor], scale: torch.Tensor) -> None:
    for layer in range(LAYERS):
        run(xs, weights[layer % COPIES], scale)  # type: ignore[operator]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    configs = [
        wo.Config(16, n, k, warps, stages, programs)
        for n, k, warps, stages, programs in itertools.product(
            (32, 64, 128), (128, 256), (4,), (3, 4), (264, 528)
        )
    ]
    scale = torch.tensor(1.0, device="cuda")
    results: list[dict[str, object]] = []
    for name in args.shapes:
        n, k = SHAPES[name]
        weights = [(torch.randn(n, k, device="cuda") * 40).to(FP8) for _ in range(COPIES)]
        read = LAYERS * n * k
        for rows in args.rows:
            x = (torch.randn(rows, k, device="cuda") * 4).to(FP8)
            want = scaled_mm(x, weights[0], scale)
            base = median_ms(partial(layers, scaled_mm, x, weights, scale))
            found = [{"shape": name, "rows": rows, "kernel": "scaled_mm", "ms": round(base, 4),
                      "tb_s": round(read / base / 1e9, 2), "error": 0.0}]  # fmt: skip
            for config in configs:
                run = partial(tiled, config=config)
                got = run(x, weights[0], scale)
                error = ((got - want).norm() / want.norm()).item()
                ms = median_ms(partial(layers, run, x, weights, scale))
                found.append(
                    {"shape": name, "rows": rows, "kernel": "tiled", "config": list(config),
                     "splits": wo.splits_for(weights[0], config), "ms": round(ms, 4),
                     "tb_s": round(read / ms / 1e9, 2), "error": float(f"{error:.3g}")}
                )  # fmt: skip
            best = min(found[1:], key=lambda r: r["ms"])  # type: ignore[arg-type, return-value]
            print(json.dumps(found[0]), json.dumps(best), flush=True)
            results += found
        del weights
        torch.cuda.empty_cache()
    (args.out / "fp8_row.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        f"# FP8 products of few rows: {torch.cuda.get_device_name()}, torch {torch.__version__}",
        "",
        "32 layers of each projection in one CUDA graph, median of 5. tiled: the weight-only "
        "kernel with e4m3 tiles on FP8 tensor cores, its best tile here; error: against "
        "scaled_mm, relative.",
        "",
        "| shape | rows | scaled_mm ms | best tiled ms | scaled_mm / tiled | tile | error |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for name in args.shapes:
        for rows in args.rows:
            mine = [r for r in results if r["shape"] == name and r["rows"] == rows]
            best = min(mine[1:], key=lambda r: r["ms"])  # type: ignore[arg-type, return-value]
            lines.append(
                f"| {name} | {rows} | {mine[0]['ms']} | {best['ms']} | "
                f"{mine[0]['ms'] / best['ms']:.3f} | {best['config']} | {best['error']} |"  # type: ignore[operator]
            )
    # The tile that does best over the four projections, per row count.
    for rows in args.rows:
        totals = {}
        for config in configs:
            mine = [r for r in results if r["rows"] == rows and r.get("config") == list(config)]
            totals[config] = sum(r["ms"] for r in mine)  # type: ignore[misc]
        base = sum(r["ms"] for r in results if r["rows"] == rows and r["kernel"] == "scaled_mm")  # type: ignore[misc]
        best = min(totals, key=totals.__getitem__)
        lines.append(
            f"\n{rows} rows, four projections: scaled_mm {base:.4f} ms, best single tile "
            f"{tuple(best)} {totals[best]:.4f} ms ({base / totals[best]:.3f} x)."
        )
    (args.out / "fp8_row.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
