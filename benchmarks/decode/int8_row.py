"""int8 weights at one row: the tiled kernel's tiles, after bf16's sweep (bf16_row.py) found
shallower tiles than int8's faster on every projection.

Per projection shape: 32 layers (8 distinct weights in turn) in one CUDA graph, median of 5,
every tile checked against the fp32 product of the int8 values (the kernel applies no scale).
It prints each shape's best tile and the engine's, picks the tile with the least time over
the four projections, and writes ``configs.json`` in ``weight_only_gemm.py``'s form (the
engine's tables, int8's one-row tile replaced by that one) for ``bench_decode.py
--weight-only-configs``.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int8_row.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial
from pathlib import Path

import torch
import triton
from bf16_row import COPIES, SHAPES, error_of, launch_dot, median_ms, passes
from fp8_gemm import LAYERS
from weight_only_gemm import save_configs

from hymt_serve.engine import weight_only as wo
from hymt_serve.engine.quantized import quantize_int8_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    engine = wo.ONE_ROW_CONFIGS[wo.INT8]
    engine_tile = (engine.block_n, engine.block_k, engine.stages, engine.programs)
    tiles = [*itertools.product((16, 32, 64), (128, 256, 512), (3, 4), (264, 528)), engine_tile]
    tiles = list(dict.fromkeys(tiles))
    rows: dict[str, list[dict[str, object]]] = {}
    for name, (n, k) in SHAPES.items():
        ws = [quantize_int8_rows(torch.randn(n, k, device="cuda") * 0.02)[0] for _ in range(COPIES)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        found = []
        for tile in tiles:
            try:
                error = error_of(launch_dot, tile, x, ws[0])
            except triton.runtime.errors.OutOfResources:
                continue
            ms = median_ms(partial(passes, launch_dot, x, ws, tile))
            found.append(
                {
                    "config": list(tile),
                    "ms": round(ms, 4),
                    "tb_s": round(LAYERS * n * k / ms / 1e9, 2),
                    "error": round(error, 6),
                }
            )
            print(name, json.dumps(found[-1]), flush=True)
        rows[name] = found
        del ws
        torch.cuda.empty_cache()
    layers = [name for name in SHAPES if name != "head"]
    totals = {
        tuple(r["config"]): sum(  # type: ignore[misc]
            next(f["ms"] for f in rows[s] if f["config"] == r["config"]) for s in layers
        )
        for r in rows[layers[0]]
        if all(any(f["config"] == r["config"] for f in rows[s]) for s in layers)
    }
    best = min(totals, key=totals.__getitem__)
    lines = [
        "| shape | engine tile ms (TB/s) | best tile | ms (TB/s) |",
        "| --- | ---: | --- | ---: |",
    ]
    for name, found in rows.items():
        mine = next(f for f in found if f["config"] == list(engine_tile))
        top = min(found, key=lambda f: f["ms"])  # type: ignore[arg-type,return-value]
        lines.append(
            f"| {name} | {mine['ms']} ({mine['tb_s']}) | {top['config']} | "
            f"{top['ms']} ({top['tb_s']}) |"
        )
    lines.append(
        f"\nfour projections: engine tile {totals[engine_tile]:.4f} ms, "
        f"best single tile {list(best)} {totals[best]:.4f} ms"
    )
    print("\n".join(lines), flush=True)
    block_n, block_k, stages, programs = best
    chosen = wo.Config(16, block_n, block_k, engine.warps, stages, programs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "int8_row.json").write_text(
        json.dumps({"rows": rows, "best": list(best)}, indent=2)
    )
    (args.out / "int8_row.md").write_text("\n".join(lines) + "\n")
    save_configs(args.out / "configs.json", {"int8": chosen})


if __name__ == "__main__":
    main()
