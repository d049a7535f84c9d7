"""int8's one row on CUDA cores (``one_row_kernel``'s ``int8_row``, widening by
``int8_as_fp32``) against the engine's tiled kernel on tensor cores, per projection shape of a
7B and its LM head.

The tiled kernel multiplies a tile of 16 rows, one of them live, on tensor cores: about 3
instructions an element widen the weight to the inputs' dtype and it reads the weight back from
shared memory (``row_tiles.py --sass``: 4.1 instructions a weight byte against bf16's 1.1).
``int8_row`` keeps a ``[inputs, columns]`` tile of fp32 sums on CUDA cores: ``prmt`` puts each
byte under fp32's exponent of 2^23 and one subtraction makes it exact (no conversion
instruction, which runs at a quarter of the arithmetic rate), then one ``fma``. The next
block's weights load before this block's arithmetic.

For each shape: 32 layers of it (8 distinct weights in turn, so none sits in L2) in one CUDA
graph, median of 5, every variant checked against the fp32 product of the int8 values (the
kernels apply no scale). The tiled kernel runs on the engine's tile for the shape and on the
inputs' dtype the engine gives it (fp16 where a norm feeds the product, as
``ModelShape.norms_fit_fp16`` allows; bf16 for the attention output and down); the CUDA-core
kernel takes bf16. Writes ``int8_cores.json`` and ``int8_cores.md`` to ``--out``.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int8_cores.py --out DIR
    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int8_cores.py --sass

``--sass`` compiles the CUDA-core kernel for sm_90 without a GPU and counts its inner loop's
instructions (``loop_sass.py``) per weight element a thread handles.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton
from bf16_row import SHAPES

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels import weight_only_triton as kernels

NORM_FED = ("qkv", "gate_up", "head")  # the engine gives these fp16 inputs on its tiled kernel
# Config(1, block_n, block_k, warps, 1, programs): a program's [block_k, block_n] tile
CONFIGS = [
    wo.Config(1, 64, 128, 4, 1, 1056),
    wo.Config(1, 64, 128, 4, 1, 2112),
    wo.Config(1, 128, 128, 4, 1, 528),
    wo.Config(1, 128, 128, 4, 1, 1056),
    wo.Config(1, 64, 256, 4, 1, 528),
    wo.Config(1, 64, 256, 4, 1, 1056),
    wo.Config(1, 256, 64, 4, 1, 528),
    wo.Config(1, 128, 256, 8, 1, 264),
    wo.Config(1, 128, 256, 8, 1, 528),
    wo.Config(1, 32, 128, 2, 1, 2112),
]


def run(x: torch.Tensor, weight: torch.Tensor, config: wo.Config) -> torch.Tensor:
    """fp32 partial sums ``[splits, 1, out]`` of one row, no scale applied."""
    splits = wo.splits_for(weight, config)
    return wo.launch(x, weight, weight, wo.INT8, 0, splits, config)


def layers(x: torch.Tensor, weights: list[torch.Tensor], config: wo.Config) -> None:
    from bf16_row import COPIES
    from fp8_gemm import LAYERS

    for layer in range(LAYERS):
        run(x, weights[layer % COPIES], config)


def timings(out: Path, configs: list[wo.Config]) -> list[dict[str, Any]]:
    from bf16_row import COPIES, median_ms
    from fp8_gemm import LAYERS

    from hymt_serve.engine.kernels.quantized import quantize_int8_rows

    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    for name, (n, k) in SHAPES.items():
        weights = [
            quantize_int8_rows(torch.randn(n, k, device="cuda") * 0.02)[0] for _ in range(COPIES)
        ]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        want = (x.float() @ weights[0].float().T).reshape(-1)
        tiled = wo.config_for(wo.INT8, 1, torch.bfloat16, (n, k))
        variants = [("tiled", tiled)] + [("cores", c) for c in configs]
        for variant, config in variants:
            xin = x.half() if variant == "tiled" and name in NORM_FED else x
            parts = run(xin, weights[0], config)
            error = ((parts.sum(0).reshape(-1) - want).norm() / want.norm()).item()
            ms = median_ms(partial(layers, xin, weights, config))
            rows.append(
                {"shape": name, "variant": variant, "config": list(config),
                 "inputs": str(xin.dtype).removeprefix("torch."), "splits": parts.shape[0],
                 "ms": round(ms, 4), "tb_s": round(LAYERS * n * k / ms / 1e9, 2),
                 "error": float(f"{error:.3g}")}
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        del weights
        torch.cuda.empty_cache()
    (out / "int8_cores.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def report(out: Path, rows: list[dict[str, Any]]) -> None:
    tiled = {r["shape"]: r for r in rows if r["variant"] == "tiled"}
    cores = [r for r in rows if r["variant"] == "cores"]
    lines = [
        f"# int8's one row on CUDA cores against the tiled kernel: "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}",
        "",
        "32 layers of each shape in one CUDA graph (8 weights in turn), median of 5; the "
        "kernels alone (fp32 partial sums per split, not summed). tiled: the engine's tile for "
        "the shape, on the engine's inputs; cores: int8_row on Config(block_m, block_n, "
        "block_k, warps, stages, programs), bf16 inputs. error: relative, against the fp32 "
        "product of the int8 values.",
        "",
        "| shape | tiled ms (TB/s) | error | fastest cores config | ms (TB/s) | splits | error "
        "| tiled / cores |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, t in tiled.items():
        best = min((r for r in cores if r["shape"] == name), key=lambda r: r["ms"])
        lines.append(
            f"| {name} | {t['ms']} ({t['tb_s']}) | {t['error']} | {tuple(best['config'])} | "
            f"{best['ms']} ({best['tb_s']}) | {best['splits']} | {best['error']} | "
            f"{t['ms'] / best['ms']:.3f} |"
        )
    projections = [s for s in tiled if s != "head"]
    tiled_total = sum(tiled[s]["ms"] for s in projections)
    totals: dict[tuple[int, ...], float] = {}
    for r in cores:
        if r["shape"] in projections:
            totals[tuple(r["config"])] = totals.get(tuple(r["config"]), 0.0) + r["ms"]
    lines += [
        "",
        f"Four projections: tiled {tiled_total:.4f} ms. Cores configs by their total:",
        "",
        "| config | ms | tiled / this | splits (qkv, o, gate_up, down) |",
        "| --- | ---: | ---: | --- |",
    ]
    for config, ms in sorted(totals.items(), key=lambda item: item[1]):
        splits = [r["splits"] for r in cores if tuple(r["config"]) == config]
        lines.append(f"| {config} | {ms:.4f} | {tiled_total / ms:.3f} | {splits[:4]} |")
    (out / "int8_cores.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def sass(out: Path) -> None:
    from loop_sass import ARGS, compiled, loop_counts

    out.mkdir(parents=True, exist_ok=True)
    signature = {**ARGS, "w_ptr": "*i8", "s_ptr": "*fp32"}
    signature |= {n: "constexpr" for n in ("KIND", "GROUP", "BLOCK_M", "BLOCK_N", "BLOCK_K")}
    signature |= {"SPAN": "i32", "BF16_PAIRS": "constexpr", "EVEN": "constexpr"}
    found = []
    for config in sorted({c._replace(programs=0) for c in CONFIGS}):
        constants = {"KIND": wo.INT8, "GROUP": 1, "BLOCK_M": 1, "BLOCK_N": config.block_n}
        constants |= {"BLOCK_K": config.block_k, "BF16_PAIRS": False, "EVEN": True}
        kernel = compiled(kernels.one_row_kernel, signature, constants, config.warps)
        counts = loop_counts(kernel.asm["cubin"], out / "int8_row.cubin")
        per_thread = config.block_k * config.block_n / (32 * config.warps)
        top = sorted(counts["ops"].items(), key=lambda item: -item[1])[:8]
        found.append(
            {"config": list(config), "loop_instructions": counts["instructions"],
             "per_element": round(counts["instructions"] / per_thread, 2), "ops": counts["ops"]}
        )  # fmt: skip
        print(
            f"{tuple(config)}: {counts['instructions']} a block "
            f"({counts['instructions'] / per_thread:.2f} an element); {top}"
        )
    (out / "int8_cores_sass.json").write_text(json.dumps(found, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/int8_cores"))
    parser.add_argument("--sass", action="store_true", help="count the loop's SASS, no GPU")
    args = parser.parse_args()
    if args.sass:
        sass(args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    report(args.out, timings(args.out, CONFIGS))


if __name__ == "__main__":
    main()
