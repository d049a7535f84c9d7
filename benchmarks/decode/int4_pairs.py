"""int4 at one row: the engine's one-row kernel against the same arithmetic without its prefetch.

The engine's one-row int4 kernel (``weight_only_kernels.int4_row``) widens two nibbles per
integer operation (nibbles ``j`` and ``j + 4`` of a word masked into two bf16 halves ORed
with 0x4300 read as 128 + q, exactly; 128 and the zero point come off once per block through
the sum of the block's inputs), and loads the next block's words before it does this block's
arithmetic. ``pairs_kernel`` here is the same arithmetic without that prefetch. This script
chose both (results: benchmarks/decode/quantized/int4-one-row/): the kernel before, five
instructions per weight and no prefetch, took 2.34 ms per pass whatever its pipeline stages;
the pairs alone 2.24 ms; with the prefetch 2.11 ms.

It prints and writes (``--out``) one pass over a 7B's projections (32 layers of qkv, o,
gate_up, down; CUDA graph) at one row for each kernel over a few tiles, after checking each
against the dequantized reference.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_pairs.py --out DIR
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
from fp8_gemm import LAYERS, SHAPES, timed_graph

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.weight_only_triton import int4_block, int4_pairs

COPIES = 4  # distinct weights per pass (weight_only_gemm.py): nothing sits in L2


@triton.jit(do_not_specialize=["M"])
def pairs_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPAN,
):  # fmt: skip
    row = tl.program_id(2)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    DEPTH: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros((DEPTH, BLOCK_N), dtype=tl.float32)
    for offset in range(0, SPAN, BLOCK_K):
        k0 = start + offset
        words, word_ok, packed, scale, zero = int4_block(
            w_ptr, s_ptr, k0, K, cols, col_ok, N, K, GROUP, DEPTH
        )
        acc += int4_pairs(
            x_ptr + row * stride_xm, words, word_ok, packed, scale, zero, DEPTH, BLOCK_N
        )
    out = out_ptr + tl.program_id(1) * M * N + row * N + cols
    tl.store(out, tl.sum(acc, axis=0), mask=col_ok)


def launch_pairs(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: wo.Config
) -> torch.Tensor:
    rows, inputs = x.shape
    cols = wo.out_features(weight)
    group = inputs // scale.shape[1]
    splits = wo.splits_for(weight, config)
    parts = x.new_empty(splits, rows, cols, dtype=torch.float32)
    span = triton.cdiv(inputs, splits * config.block_k) * config.block_k
    grid = (triton.cdiv(cols, config.block_n), splits, rows)
    pairs_kernel[grid](
        x, weight, scale, parts, rows, cols, inputs, x.stride(0), GROUP=group,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPAN=span,
        num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return parts


def engine_launch(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: wo.Config
) -> torch.Tensor:
    group = wo.in_features(weight) // scale.shape[1]
    return wo.launch(x, weight, scale, wo.INT4, group, wo.splits_for(weight, config), config)


def error_of(launch: object, config: wo.Config, device: str) -> float:
    """Worst relative error against the dequantized reference over a few shapes."""
    worst = 0.0
    for cols, inputs in ((200, 384), (6144, 4096), (4096, 14336)):
        weight = torch.randn(cols, inputs, device=device) * 0.02
        q, scale = wo.quantize_int4_groups(weight)
        x = torch.randn(
            1, inputs, device=device, dtype=torch.float16 if device == "cpu" else torch.bfloat16
        )
        got = launch(x, q, scale, config).sum(0)  # type: ignore[operator]
        want = torch.nn.functional.linear(x.float(), wo.dequantize(q, scale))
        worst = max(worst, ((got - want).norm() / want.norm()).item())
        if device == "cpu":
            break  # the interpreter is slow: the small shape only
    return worst


def one_pass(
    launch: object,
    xs: list[torch.Tensor],
    forms: list[list[tuple[torch.Tensor, torch.Tensor]]],
    config: wo.Config,
) -> None:
    for layer in range(LAYERS):
        for x, (q, s) in zip(xs, forms[layer % COPIES], strict=True):
            launch(x, q, s, config)  # type: ignore[operator]


def pass_inputs(
    device: str, rows: int
) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], list[torch.Tensor]]:
    """COPIES int4 forms of each projection, and ``rows`` rows of input for each."""
    forms = [
        [wo.quantize_int4_groups(torch.randn(n, k, device=device) * 0.02) for n, k in SHAPES]
        for _ in range(COPIES)
    ]
    xs = [torch.randn(rows, k, device=device, dtype=torch.bfloat16) for _, k in SHAPES]
    return forms, xs


def per_shape(
    xs: list[torch.Tensor], forms: list[list[tuple[torch.Tensor, torch.Tensor]]], config: wo.Config
) -> list[dict[str, object]]:
    """The engine's kernel (its tiles) per projection: 32 layers of one shape each, and the
    rate at which it reads that shape's weights and scales."""
    rows = []
    for i, (n, k) in enumerate(SHAPES):
        q, s = forms[0][i]
        splits = wo.splits_for(q, config)
        only = [[form[i]] for form in forms]
        ms = timed_graph(partial(one_pass, engine_launch, [xs[i]], only, config))
        read = LAYERS * (q.numel() * q.element_size() + s.numel() * s.element_size())
        rows.append(
            {
                "shape": [n, k],
                "splits": splits,
                "ms": round(ms, 3),
                "tb_s": round(read / ms / 1e9, 2),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check-only", action="store_true", help="correctness, no timing")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = itertools.product((32, 64, 128), (128,), (2, 4), (1, 3), (1056, 2112))
    variants = [("engine", engine_launch, wo.Config(1, *c)) for c in engine]
    splits = itertools.product((64,), (128,), (2,), (1,), (264, 528, 4224))  # longer, shorter loops
    variants += [("engine", engine_launch, wo.Config(1, *c)) for c in splits]
    pairs = itertools.product((32, 64, 128), (128,), (2, 4), (3,), (1056, 2112))
    variants += [("pairs", launch_pairs, wo.Config(1, *c)) for c in pairs]
    results = []
    torch.manual_seed(0)
    forms, xs = ([], []) if args.check_only else pass_inputs(device, 1)
    for name, launch, config in variants:
        row = {"kernel": name, "config": list(config), "error": error_of(launch, config, device)}
        if not args.check_only:
            row["ms"] = round(timed_graph(partial(one_pass, launch, xs, forms, config)), 3)
        results.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": results}
    if not args.check_only:
        report["per_shape"] = per_shape(xs, forms, wo.ONE_ROW_CONFIGS[wo.INT4])
        print(json.dumps(report["per_shape"]), flush=True)
    (args.out / "int4_pairs.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
