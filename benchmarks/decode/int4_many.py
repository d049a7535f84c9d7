"""int4 products of more than a few rows: one pass over a 7B's projections (32 layers, CUDA
graph) at 32-256 rows, three ways side by side in one run:

- ``bf16``: ``F.linear`` on the dequantized weights (the dense model's pass);
- ``widen``: the engine's path above 16 rows until now, the int4 weight written out in bf16
  by one kernel, then cuBLAS (``weight_only.widen_int4``);
- ``deep``: the tiled kernel's int4 products ``block_k`` inputs deep (``int4_deep``), swept
  over tiles, then the split sum; each tile checked against the dequantized product; and the
  engine's own tiles for the row count (``config_for``).

Writes ``int4_many.json`` and ``int4_many.md`` to ``--out``.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_many.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from fp8_gemm import LAYERS, SHAPES, timed_graph
from int4_pairs import COPIES, pass_inputs

from hymt_serve.engine.kernels import weight_only as wo

ROWS = (32, 64, 128, 256)


def tiles(rows: int) -> list[wo.Config]:
    block_m = min(128, rows)
    warps = 4 if block_m <= 64 else 8
    return [
        wo.Config(block_m, n, k, warps, stages, 264)
        for n, k, stages in itertools.product((64, 128), (64, 128), (2, 3))
    ]


def engine_tiles(rows: int) -> wo.Config:
    config = wo.config_for(wo.INT4, rows)
    return config._replace(block_m=config.block_m or min(128, rows))


def deep(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, config: wo.Config) -> torch.Tensor:
    parts = wo.launch(x, q, s, wo.INT4, 128, wo.splits_for(q, config), config)  # rows > 16
    return wo.sum_splits(parts, x.dtype)


def deep_form(x: torch.Tensor, form: tuple[torch.Tensor, torch.Tensor], config: wo.Config) -> None:
    deep(x, *form, config)


def one_pass(run: Any, xs: list[torch.Tensor], weights: list[Any]) -> None:
    for layer in range(LAYERS):
        for x, weight in zip(xs, weights[layer % COPIES], strict=True):
            run(x, weight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    forms, _ = pass_inputs("cuda", 1)
    dense = [[wo.dequantize(q, s).to(torch.bfloat16) for q, s in form] for form in forms]
    rows_out: list[dict[str, Any]] = []
    sweep: list[dict[str, Any]] = []
    for rows in ROWS:
        xs = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES]
        row: dict[str, Any] = {"rows": rows}
        row["bf16_ms"] = timed_graph(partial(one_pass, F.linear, xs, dense))
        row["widen_ms"] = timed_graph(
            partial(one_pass, lambda x, f: torch.ops.hymt.int4_rows(x, *f, 128), xs, forms)
        )
        best: dict[str, Any] = {}
        for config in tiles(rows):
            q, s = forms[0][2]  # gate_up: check the tile against the dequantized product
            got = deep(xs[2], q, s, config).float()
            want = xs[2].float() @ dense[0][2].float().T
            error = ((got - want).norm() / want.norm()).item()
            run = partial(deep_form, config=config)
            ms = timed_graph(partial(one_pass, run, xs, forms))
            print(rows, list(config), round(ms, 4), f"{error:.1e}", flush=True)
            sweep.append({"rows": rows, "config": list(config), "ms": ms})
            if error < 1e-2 and (not best or ms < best["ms"]):
                best = {"config": list(config), "ms": round(ms, 4), "error": error}
        row["deep"] = best
        engine = engine_tiles(rows)
        ms = timed_graph(partial(one_pass, partial(deep_form, config=engine), xs, forms))
        row["engine"] = {"config": list(engine), "ms": round(ms, 4)}
        rows_out.append(row)
        print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "shapes": SHAPES, "rows": rows_out}
    report["sweep"] = sweep
    (args.out / "int4_many.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# int4 at 32-256 rows, one pass over a 7B's projections: {report['gpu']}",
        "",
        "| rows | bf16 ms | widen + cuBLAS ms | deep ms (best tile) | tile | engine's tile ms "
        "| engine / widen |",
        "| ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows_out:
        d, e = r["deep"], r["engine"]
        lines.append(
            f"| {r['rows']} | {r['bf16_ms']:.3f} | {r['widen_ms']:.3f} | {d['ms']:.3f} | "
            f"{d['config']} | {e['ms']:.3f} | {e['ms'] / r['widen_ms']:.2f} |"
        )
    (args.out / "int4_many.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
