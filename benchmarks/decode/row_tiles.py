"""One row of a product in the engine's tiled kernel: its tiles swept with the warps a program
runs on, for int8 weights and for plain bf16 ones.

The earlier sweeps of these tiles (``bf16_row.py``, and ``int8_row.py``, which this script
replaces) kept 4 warps a program. At one row each program moves few bytes for the
arithmetic its warps issue (int8: about 4 instructions an element to widen it, against
bf16's 2), so how many warps an SM holds may matter as much as the tile.

For each form and projection shape: 32 layers of it (8 distinct weights in turn, so none sits
in L2) in one CUDA graph, median of 5, every tile checked against the fp32 product (int8: of
its int8 values; the kernel applies no scale). Per form it prints each shape's best tile and
the engine's, and the single tile with the least time over the four projections (the engine
takes one tile for all of them); the LM head is timed on its own (bf16 takes wider tiles
there). Writes ``row_tiles.json``, ``row_tiles.md`` and ``best.json`` (per form: the engine's
tile and the best single tile, as ``wo.Config`` fields) to ``--out``.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/row_tiles.py --out DIR \
        [--forms int8 bf16]

``--sass`` needs no GPU: it compiles the engine's tile of each form for sm_90 (with 4 and with
8 warps) and counts the instructions of the kernel's inner loop (``loop_sass.py``), per weight
element a thread handles, into ``row_sass.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial
from pathlib import Path

import torch
import triton
from bf16_row import COPIES, SHAPES, error_of, median_ms, passes
from fp8_gemm import LAYERS

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.quantized import quantize_int8_rows

PROJECTIONS = ("qkv", "o", "gate_up", "down")
# (block_n, block_k, warps, stages, programs); the engine's own tile is added to each.
CANDIDATES = {
    "int8": list(itertools.product((32, 64, 128), (128, 256, 512), (4, 8), (3, 4), (264, 528))),
    "bf16": list(itertools.product((32, 64), (128, 256), (4, 8), (3, 4), (264, 528))),
}


def engine_tile(form: str, n: int) -> wo.Config:
    if form == "int8":
        return wo.ONE_ROW_CONFIGS[wo.INT8]
    return wo.WIDE_PLAIN_ROW_CONFIG if n >= wo.WIDE else wo.PLAIN_ROW_CONFIG


def tile_of(config: wo.Config) -> tuple[int, ...]:
    return (config.block_n, config.block_k, config.warps, config.stages, config.programs)


def launch(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, ...]) -> torch.Tensor:
    """The engine's tiled kernel as its one-row products run it (``weight_only.launch``)."""
    block_n, block_k, warps, stages, programs = tile
    config = wo.Config(16, block_n, block_k, warps, stages, programs)
    kind = wo.INT8 if w.dtype == torch.int8 else wo.PLAIN
    return wo.launch(x, w, w, kind, 0, wo.splits_for(w, config), config).flatten(0, 1)


def weight(form: str, n: int, k: int) -> torch.Tensor:
    w = torch.randn(n, k, device="cuda") * 0.02
    return quantize_int8_rows(w)[0] if form == "int8" else w.to(torch.bfloat16)


def sweep_form(form: str, shapes: list[str]) -> dict[str, list[dict[str, object]]]:
    rows: dict[str, list[dict[str, object]]] = {}
    for name in shapes:
        n, k = SHAPES[name]
        tiles = list(dict.fromkeys([tile_of(engine_tile(form, n)), *CANDIDATES[form]]))
        if name == "head" and form == "bf16":
            tiles = [t for t in tiles if t[0] >= 64]  # (the engine's wide tiles, and wider)
        ws = [weight(form, n, k) for _ in range(COPIES)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        read = LAYERS * n * k * ws[0].element_size()
        found: list[dict[str, object]] = []
        for tile in tiles:
            try:
                error = error_of(launch, tile, x, ws[0])
            except triton.runtime.errors.OutOfResources:
                continue  # the tile does not fit the SM's shared memory or registers
            ms = median_ms(partial(passes, launch, x, ws, tile))
            found.append(
                {"tile": list(tile), "ms": round(ms, 4), "tb_s": round(read / ms / 1e9, 2),
                 "error": round(error, 6)}
            )  # fmt: skip
            print(form, name, json.dumps(found[-1]), flush=True)
        rows[name] = found
        del ws
        torch.cuda.empty_cache()
    return rows


def summary(form: str, rows: dict[str, list[dict[str, object]]]) -> tuple[list[str], dict]:
    """Markdown lines and the form's entry of ``best.json``."""
    ok = {s: [r for r in found if r["error"] < 1e-2] for s, found in rows.items()}  # type: ignore[operator]
    layers = [s for s in PROJECTIONS if s in ok]
    ms_of = {s: {tuple(r["tile"]): r["ms"] for r in ok[s]} for s in ok}  # type: ignore[arg-type]
    common = set.intersection(*(set(ms_of[s]) for s in layers)) if layers else set()
    totals = {t: sum(ms_of[s][t] for s in layers) for t in common}  # type: ignore[misc]
    mine = tile_of(engine_tile(form, 4096))
    lines = [
        f"### {form}",
        "",
        "| shape | engine tile ms (TB/s) | best tile (block_n, block_k, warps, stages, programs) "
        "| ms (TB/s) |",
        "| --- | ---: | --- | ---: |",
    ]
    for name, found in ok.items():
        n = SHAPES[name][0]
        own = next(r for r in found if tuple(r["tile"]) == tile_of(engine_tile(form, n)))  # type: ignore[arg-type]
        top = min(found, key=lambda r: r["ms"])  # type: ignore[arg-type,return-value]
        lines.append(
            f"| {name} | {own['ms']} ({own['tb_s']}) | {tuple(top['tile'])} | "  # type: ignore[arg-type]
            f"{top['ms']} ({top['tb_s']}) |"
        )
    entry: dict[str, object] = {"engine": list(mine)}
    if totals:
        best = min(totals, key=totals.__getitem__)
        by_warps = {
            w: min((t for t in totals if t[2] == w), key=totals.__getitem__)
            for w in sorted({t[2] for t in totals})
        }
        lines.append("")
        lines.append(
            f"Four projections: the engine's tile {totals[mine]:.4f} ms, the best single tile "
            f"{best} {totals[best]:.4f} ms ({totals[mine] / totals[best]:.3f} x faster); best "
            "by warps: " + ", ".join(f"{w}: {t} {totals[t]:.4f} ms" for w, t in by_warps.items())
        )
        entry |= {"best": list(best), "engine_ms": totals[mine], "best_ms": totals[best]}
    if "head" in ok:
        head = min(ok["head"], key=lambda r: r["ms"])  # type: ignore[arg-type,return-value]
        entry["head_best"] = head["tile"]
    lines.append("")
    return lines, entry


def sass_counts(out: Path) -> list[dict[str, object]]:
    """The inner loop's instructions for each form's engine tile at 4 and 8 warps (sm_90)."""
    from loop_sass import ARGS, compiled, loop_counts

    from hymt_serve.engine.kernels import weight_only_triton as kernels

    # (in the kernel's order of arguments: loop_sass marks them divisible by position)
    signature = {**ARGS, "s_ptr": "*fp32"}
    signature |= {n: "constexpr" for n in ("KIND", "GROUP", "BLOCK_M", "BLOCK_N", "BLOCK_K")}
    signature |= {"SPAN": "i32", "DEEP": "constexpr"}
    found = []
    for form, kind, weight_type in (("int8", wo.INT8, "*i8"), ("bf16", wo.PLAIN, "*bf16")):
        config = engine_tile(form, 4096)
        for warps in (config.warps, 2 * config.warps):
            constants = {"KIND": kind, "GROUP": 1, "BLOCK_M": 16, "BLOCK_N": config.block_n}
            constants |= {"BLOCK_K": config.block_k, "DEEP": False}
            kernel = compiled(
                kernels.weight_only_kernel, signature | {"w_ptr": weight_type}, constants, warps
            )
            counts = loop_counts(kernel.asm["cubin"], out / f"{form}-{warps}.cubin")
            per_thread = config.block_n * config.block_k / (32 * warps)
            found.append(
                {"form": form, "tile": list(tile_of(config._replace(warps=warps))),
                 "loop_instructions": counts["instructions"],
                 "per_element": round(counts["instructions"] / per_thread, 2),
                 "ops": counts["ops"]}
            )  # fmt: skip
            top = sorted(counts["ops"].items(), key=lambda item: -item[1])[:8]
            print(json.dumps({k: v for k, v in found[-1].items() if k != "ops"}), top)
    (out / "row_sass.json").write_text(json.dumps(found, indent=1) + "\n")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--forms", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--sass", action="store_true", help="count instructions only (no GPU)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sass:
        sass_counts(args.out)
        return
    torch.manual_seed(0)
    results: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    lines: list[str] = []
    best: dict[str, object] = {}
    for form in args.forms:
        rows = sweep_form(form, args.shapes)
        results[form] = rows
        form_lines, best[form] = summary(form, rows)
        lines += form_lines
        (args.out / "row_tiles.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "row_tiles.md").write_text("\n".join(lines) + "\n")
        (args.out / "best.json").write_text(json.dumps(best, indent=1) + "\n")
        print("\n".join(form_lines), flush=True)


if __name__ == "__main__":
    main()
