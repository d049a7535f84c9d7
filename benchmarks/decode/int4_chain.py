"""int4's one row in the engine's chain kernel (``weight_only_pairs.int4_chain_kernel``) on
several tiles, against the [words, columns] tile it replaced (``one_row_kernel`` with
``int4_bf16x2``).

The words tile keeps a ``[words, columns]`` tile of bf16 pair sums: each word's four
``fma.bf16x2`` products are widened to fp32, scaled and added a word at a time, and every
block makes the zero points' bf16 pairs again for every word of the tile. Its inner loop is
447 instructions a block of 16 words a thread in an sm_90 compile, 28 a word, where the
products need 15 (3 shifts, 4 ``lop3``, 8 ``fma.bf16x2``). On the GPU the same loads alone
took 1.05 ms a pass over a 7B's projections, the kernel 1.58 (H200).

The chain kernel's threads hold a few columns each and walk a block's words one by one: each
column's bf16 pair sum runs on through 4 words (16 products a half) before it widens to fp32
and takes the scale once, and the zero points' pairs are made once a block: 21-25
instructions a word (``--sass``). Programs of several warps take a stream of words each and
need fewer splits of the input dimension (their sums meet once, at the end).

Rounding: a chain of 16 bf16 products a half rounds each partial sum to 2^-9 of its size; int4's
own rounding of a weight is half a step of 16. The error against the dequantized weight's
product is printed for both kernels.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_chain.py --out DIR
    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_chain.py --sass

``--sass`` compiles for sm_90 without a GPU and counts the inner loop's instructions
(``loop_sass.py``).
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels import weight_only_pairs as pair_kernels

PROJECTIONS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096)}
PROJECTIONS["down"] = (4096, 14336)


def chain(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: wo.Config) -> Any:
    """fp32 partial sums [splits, 1, out] of one row in the engine's chain kernel."""
    group = x.shape[1] // scale.shape[1]
    return wo.launch_chain(x, weight, scale, group, wo.splits_for(weight, config), config)


def words(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: wo.Config) -> Any:
    """The same in one_row_kernel's [words, columns] tile (int4_bf16x2)."""
    group = x.shape[1] // scale.shape[1]
    saved, wo.INT4_BF16_ROW = wo.INT4_BF16_ROW, "words"
    try:
        splits = wo.splits_for(weight, config)
        return wo.launch(x, weight, scale, wo.INT4, group, splits, config)
    finally:
        wo.INT4_BF16_ROW = saved


# Config(1, block_n, block_k, warps, 1, programs): block_k inputs a program's block, each warp
# a stream of block_k / 8 / warps words
CONFIGS = [
    wo.Config(1, 128, 64, 1, 1, 2112),  # one warp: the fastest of the first sweep (call-1/)
    wo.Config(1, 128, 32, 1, 1, 2112),
    wo.Config(1, 128, 512, 8, 1, 256),
    wo.Config(1, 128, 256, 8, 1, 528),
    wo.Config(1, 128, 256, 4, 1, 264),
    wo.Config(1, 128, 128, 4, 1, 528),
    wo.Config(1, 256, 512, 8, 1, 132),
    wo.Config(1, 256, 256, 8, 1, 264),
    wo.Config(1, 256, 256, 4, 1, 264),
]


def layers(run: Any, x: torch.Tensor, weights: list[Any], config: wo.Config) -> None:
    from bf16_row import COPIES
    from fp8_gemm import LAYERS

    for layer in range(LAYERS):
        run(x, *weights[layer % COPIES], config)


def timings(out: Path, configs: list[wo.Config]) -> None:
    from bf16_row import COPIES, median_ms
    from fp8_gemm import LAYERS

    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []  # (LAYERS: the tb_s column)
    for name, (n, k) in PROJECTIONS.items():
        weights = [
            wo.quantize_int4_groups(torch.randn(n, k, device="cuda") * 0.02) for _ in range(COPIES)
        ]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        want = wo.reference(x.float(), *weights[0]).float().reshape(-1)
        variants = [("words", wo.INT4_WORDS_ROW_CONFIG)] + [("chain", c) for c in configs]
        for variant, config in variants:
            run = words if variant == "words" else chain
            parts = run(x, *weights[0], config)
            error = ((parts.sum(0).reshape(-1) - want).norm() / want.norm()).item()

            ms = median_ms(partial(layers, run, x, weights, config))
            rows.append(
                {"shape": name, "variant": variant, "config": list(config),
                 "splits": parts.shape[0], "ms": round(ms, 4),
                 "tb_s": round(LAYERS * n * k / 2 / ms / 1e9, 2), "error": float(f"{error:.3g}")}
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        del weights
        torch.cuda.empty_cache()
    (out / "int4_chain.json").write_text(json.dumps(rows, indent=1) + "\n")
    report(out, rows)


def report(out: Path, rows: list[dict[str, Any]]) -> None:
    base = {r["shape"]: r for r in rows if r["variant"] == "words"}
    chains = [r for r in rows if r["variant"] == "chain"]
    lines = [
        f"# int4's one row, chained bf16 pair sums: {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, triton {triton.__version__}",
        "",
        "32 layers of each projection in one CUDA graph (8 weights in turn), median of 5; the "
        "kernels alone (fp32 partial sums per split, not summed). words: one_row_kernel's "
        f"[words, columns] tile {tuple(wo.INT4_WORDS_ROW_CONFIG)}; chain: int4_chain_kernel on "
        "Config(block_m, block_n, block_k, warps, stages, programs). error: relative, against "
        "the dequantized weight's product in fp32.",
        "",
        "| shape | words ms | splits | error | fastest chain config | ms | splits | error "
        "| words / chain |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, b in base.items():
        best = min((r for r in chains if r["shape"] == name), key=lambda r: r["ms"])
        lines.append(
            f"| {name} | {b['ms']} | {b['splits']} | {b['error']} | {tuple(best['config'])} | "
            f"{best['ms']} | {best['splits']} | {best['error']} | {b['ms'] / best['ms']:.3f} |"
        )
    totals: dict[tuple[int, ...], float] = {}
    for r in chains:
        totals[tuple(r["config"])] = totals.get(tuple(r["config"]), 0.0) + r["ms"]
    words_total = sum(b["ms"] for b in base.values())
    lines += [
        "",
        f"Four projections: words {words_total:.4f} ms. Chain configs by their total (fastest "
        "12), with each shape's splits (qkv, o, gate_up, down):",
        "",
        "| config | ms | words / this | splits |",
        "| --- | ---: | ---: | --- |",
    ]
    for config, ms in sorted(totals.items(), key=lambda item: item[1])[:12]:
        splits = [r["splits"] for r in chains if tuple(r["config"]) == config]
        lines.append(f"| {config} | {ms:.4f} | {words_total / ms:.3f} | {splits} |")
    (out / "int4_chain.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def sass(out: Path) -> None:
    from loop_sass import ARGS, compiled, loop_counts

    out.mkdir(parents=True, exist_ok=True)
    signature = {**ARGS, "SPAN": "i32", "GROUP": "constexpr", "BLOCK_N": "constexpr"}
    signature |= {"WORDS": "constexpr", "STREAMS": "constexpr", "CHAIN": "constexpr"}
    for config in sorted({c._replace(programs=0) for c in CONFIGS}):
        stream_words = config.block_k // 8 // config.warps
        constants = {"GROUP": 128, "BLOCK_N": config.block_n, "WORDS": stream_words}
        constants |= {"STREAMS": config.warps, "CHAIN": min(4, stream_words)}
        kernel = compiled(pair_kernels.int4_chain_kernel, signature, constants, config.warps)
        counts = loop_counts(kernel.asm["cubin"], out / "chain.cubin")
        per_thread = config.block_k // 8 * config.block_n // (32 * config.warps)
        top = sorted(counts["ops"].items(), key=lambda item: -item[1])[:8]
        print(
            f"{tuple(config)}: {counts['instructions']} a block "
            f"({counts['instructions'] / per_thread:.1f} a word), "
            f"{counts['kernel_barriers']} barriers in the kernel; {top}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/int4_chain"))
    parser.add_argument("--sass", action="store_true", help="count the loop's SASS, no GPU")
    args = parser.parse_args()
    if args.sass:
        sass(args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    timings(args.out, CONFIGS)


if __name__ == "__main__":
    main()
