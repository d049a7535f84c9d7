"""One pass over a 7B-shaped model's decoder projections (32 layers of fused qkv, o, gate_up,
down; CUDA graph) per token count: bf16, FP8 on ``torch._scaled_mm``, the weight-only kernel
(``hymt_serve.engine.kernels.weight_only``) for int8 and int4 weights, and torch's int4 tinygemm;
first a sweep of the kernels' tiles at 1, 8 and 64 rows (one count per row class).

``--dense`` asks whether the kernel would beat cuBLAS on plain bf16 weights at one row (a decode
step at batch 1): its int8 path, which applies no scale, swept over tiles on the bf16
projections, then the best against ``F.linear`` on the projections and on the LM head.

A program, not a test: it chooses ``ONE_ROW_CONFIGS``, ``FEW_ROWS_CONFIGS`` and
``MANY_ROWS_CONFIGS``, and uses the winners for its table. Writes ``weight_only_gemm.json``
to ``--out`` (``bench_decode.py --weight-only-configs`` takes its tiles).

    PYTHONPATH=handler python benchmarks/decode/weight_only_gemm.py --out DIR
    cd benchmarks/decode && PYTHONPATH=../../handler python weight_only_gemm.py --out DIR --dense
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from fp8_gemm import LAYERS, SHAPES, timed_graph

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.quantized import FP8, quantize_int8_rows, quantize_tensor

Forms = list[tuple[torch.Tensor, torch.Tensor]]
KINDS = {"int8": wo.INT8, "int4": wo.INT4}
HEAD = (128256, 4096)  # the LM head, read once a step too
COPIES = 4  # distinct weights per pass, so that even int4's (4 x 109 MB) cannot sit in L2


def kernel_pass(xs: list[torch.Tensor], forms: list[Forms], kind: int, config: wo.Config) -> None:
    """The kernel alone (fp32 partial products), as the compiled engine runs it."""
    for layer in range(LAYERS):
        for x, (q, s) in zip(xs, forms[layer % COPIES], strict=True):
            group = wo.in_features(q) // s.shape[1] if kind == wo.INT4 else 0
            wo.launch(x, q, s, kind, group, wo.splits_for(q, config), config)


def eager_pass(xs: list[torch.Tensor], forms: list[Forms]) -> None:
    """``weight_only.linear`` eagerly: the kernel plus the split sum, scale and cast as kernels
    of their own (inductor fuses those into neighbours in the engine)."""
    for layer in range(LAYERS):
        for x, (q, s) in zip(xs, forms[layer % COPIES], strict=True):
            wo.linear(x, q, s)


def bf16_pass(xs: list[torch.Tensor], weights: list[list[torch.Tensor]]) -> None:
    for layer in range(LAYERS):
        for x, w in zip(xs, weights[layer % COPIES], strict=True):
            F.linear(x, w)


def scaled_mm_pass(xs: list[torch.Tensor], forms: list[Forms]) -> None:
    """FP8 tensor cores with the input already in e4m3 (the engine fuses its quantization)."""
    one = torch.ones((), device="cuda")
    for layer in range(LAYERS):
        for x, (q, s) in zip(xs, forms[layer % COPIES], strict=True):
            torch._scaled_mm(x, q.t(), scale_a=one, scale_b=s.reshape(()), out_dtype=torch.bfloat16)


def tinygemm_forms(dense: list[torch.Tensor]) -> Forms | None:
    """torch's int4 layout (``_convert_weight_to_int4pack``, group 128), if this build has it."""
    try:
        forms = []
        for w in dense:
            q = torch.randint(0, 16, w.shape, dtype=torch.int32, device="cuda")
            packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            weight = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
            scales = torch.rand(w.shape[1] // 128, w.shape[0], 2, device="cuda").bfloat16()
            forms.append((weight, scales))
        return forms
    except (RuntimeError, AttributeError) as exc:
        print(f"tinygemm not available: {exc!r:.200}", flush=True)
        return None


def tinygemm_pass(xs: list[torch.Tensor], forms: list[Forms]) -> None:
    for layer in range(LAYERS):
        for x, (q, s) in zip(xs, forms[layer % COPIES], strict=True):
            torch.ops.aten._weight_int4pack_mm(x, q, 128, s)


def candidates(kind: int, rows: int) -> list[wo.Config]:
    if rows == 1:  # the one-row kernel, and the tiled kernel's best for a few rows
        block_ks = (128,) if kind == wo.INT4 else (64, 128, 256)
        grid = itertools.product((32, 64, 128, 256), block_ks, (2, 4, 8), (3,), (264, 528, 1056))
        ours = [wo.Config(1, n, k, warps, stages, p) for n, k, warps, stages, p in grid]
        return [*ours, wo.FEW_ROWS_CONFIGS[kind]]
    if rows <= wo.FEW_ROWS:
        block_ks = (128,) if kind == wo.INT4 else (256, 512)
        grid = itertools.product((32, 64, 128), block_ks, (4, 8), (3, 5), (264, 528))
        return [wo.Config(16, n, k, warps, stages, p) for n, k, warps, stages, p in grid]
    block_ks = (128,) if kind == wo.INT4 else (64, 128)
    grid = itertools.product((64, 128), block_ks, (4, 8), (3,), (132, 264))
    return [wo.Config(0, n, k, warps, stages, p) for n, k, warps, stages, p in grid]


def dense_candidates() -> list[wo.Config]:
    """Tiles for bf16 weights at one row: twice int8's bytes per tile, so deeper ones too."""
    tiled = itertools.product((32, 64, 128), (256, 512), (4, 8), (3, 4), (264, 528))
    one_row = itertools.product((64, 128), (64, 128), (4, 8), (3,), (528, 1056))
    return [wo.Config(16, *c) for c in tiled] + [wo.Config(1, *c) for c in one_row]


def dense(out: Path, dense_weights: list[list[torch.Tensor]]) -> None:
    """``--dense``: the kernel's int8 path over bf16 weights at one row against cuBLAS."""
    xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES]
    forms = [[(w, w.new_empty(0)) for w in copy] for copy in dense_weights]
    found = []
    for config in dense_candidates():
        try:
            ms = timed_graph(partial(kernel_pass, xs, forms, wo.INT8, config))
        except Exception as exc:  # a tile the compiler refuses is reported, not fatal
            print(f"{config}: {exc!r:.200}", flush=True)
            continue
        found.append({"config": list(config), "ms": round(ms, 3)})
    found.sort(key=lambda r: r["ms"])
    best = wo.Config(*found[0]["config"])
    head = torch.randn(HEAD, device="cuda", dtype=torch.bfloat16) * 0.02
    splits = wo.splits_for(head, best)
    none = head.new_empty(0)
    row = {
        "projections_cublas_ms": timed_graph(partial(bf16_pass, xs, dense_weights)),
        "projections_kernel_ms": found[0]["ms"],
        "head_cublas_ms": timed_graph(partial(F.linear, xs[0], head)),
        "head_kernel_ms": timed_graph(
            partial(wo.launch, xs[0], head, none, wo.INT8, 0, splits, best)
        ),
    }
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    report |= {"best": found[0]["config"], **{k: round(v, 3) for k, v in row.items()}}
    print(json.dumps(report), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dense_one_row.json").write_text(json.dumps({**report, "sweep": found}, indent=2))


def tables() -> dict[str, dict[int, wo.Config]]:
    return {
        "one_row": wo.ONE_ROW_CONFIGS,
        "few_rows": wo.FEW_ROWS_CONFIGS,
        "many_rows": wo.MANY_ROWS_CONFIGS,
    }


def current_configs() -> dict[str, dict[str, list[int]]]:
    """The engine's tile tables, by table and form name."""
    return {
        table_name: {name: list(table[kind]) for name, kind in KINDS.items()}
        for table_name, table in tables().items()
    }


def save_configs(path: Path, one_row: dict[str, wo.Config]) -> None:
    """Write the engine's tile tables, ``one_row`` (by form name) replacing some of its one-row
    entries, in the form :func:`load_configs` and ``bench_decode.py --weight-only-configs``
    read."""
    configs = current_configs()
    configs["one_row"] |= {name: list(config) for name, config in one_row.items()}
    path.write_text(json.dumps({"configs": configs}, indent=2))


def load_configs(path: Path) -> None:
    """Take the tiles a sweep wrote (``weight_only_gemm.json``) for this process."""
    saved = json.loads(path.read_text())["configs"]
    for table_name, table in tables().items():
        for name, kind in KINDS.items():
            table[kind] = wo.Config(*saved[table_name][name])


def sweep(kind: int, forms: list[Forms], rows: int) -> list[dict[str, Any]]:
    """Every candidate tile for ``rows`` rows, fastest first."""
    xs = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES]
    results = []
    for candidate in candidates(kind, rows):
        block_m = candidate.block_m or min(128, max(16, 1 << (rows - 1).bit_length()))
        config = candidate._replace(block_m=block_m)
        try:
            ms = timed_graph(partial(kernel_pass, xs, forms, kind, config))
        except Exception as exc:  # a tile the compiler refuses is reported, not fatal
            print(f"{config}: {exc!r:.200}", flush=True)
            continue
        results.append({"config": list(candidate), "ms": round(ms, 3)})
    return sorted(results, key=lambda r: r["ms"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128, 512])
    parser.add_argument(
        "--sweep-rows",
        type=int,
        nargs="*",
        default=[1, 8, 64],
        help="sweep the tiles at these row counts (one per class: 1, 2-16, more)",
    )
    parser.add_argument("--dense", action="store_true", help="bf16 weights at one row only")
    args = parser.parse_args()
    torch.manual_seed(0)
    dense_weights = [
        [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in SHAPES]
        for _ in range(COPIES)
    ]
    if args.dense:
        dense(args.out, dense_weights)
        return
    quantizers = {
        "fp8": quantize_tensor,
        "int8": quantize_int8_rows,
        "int4": wo.quantize_int4_groups,
    }
    forms = {
        name: [[q(w) for w in copy] for copy in dense_weights] for name, q in quantizers.items()
    }
    swept: dict[str, list[dict[str, Any]]] = {}
    for (name, kind), rows in itertools.product(KINDS.items(), args.sweep_rows):
        table = tables()["one_row" if rows == 1 else "few_rows" if rows <= 16 else "many_rows"]
        found = swept[f"{name}_{rows}"] = sweep(kind, forms[name], rows)
        print(name, rows, json.dumps(found[:5]), flush=True)
        if found:
            table[kind] = wo.Config(*found[0]["config"])
    tiny_copies = [tinygemm_forms(copy) for copy in dense_weights]
    tiny = None if None in tiny_copies else tiny_copies
    rows = []
    for m in args.tokens:
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES]
        runs: dict[str, Callable[[], None]] = {
            "bf16": partial(bf16_pass, xs, dense_weights),
            "fp8_scaled_mm": partial(scaled_mm_pass, [x.to(FP8) for x in xs], forms["fp8"]),
        }
        for name, kind in KINDS.items():
            config = wo.config_for(kind, m)
            runs[f"{name}_kernel"] = partial(kernel_pass, xs, forms[name], kind, config)
            runs[f"{name}_eager"] = partial(eager_pass, xs, forms[name])
        if tiny is not None:
            runs["int4_tinygemm"] = partial(tinygemm_pass, xs, tiny)
        result: dict[str, Any] = {"tokens": m}
        for name, run in runs.items():
            try:
                result[f"{name}_ms"] = round(timed_graph(run), 3)
            except Exception as exc:  # reported, not fatal
                result[f"{name}_error"] = f"{exc!r:.200}"
        print(json.dumps(result), flush=True)
        rows.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "configs": current_configs(),
        "sweeps": swept,
        "rows": rows,
    }
    (args.out / "weight_only_gemm.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
