"""int4 at one row: where the one-row kernel's time goes, and the arithmetic that cuts it.

The one-row int4 kernel (``weight_only_kernels.int4_row``) read a 7B's projections at
1.4-2.0 TB/s with fp32 arithmetic, and a sweep over its tiles, warps, program counts and
pipeline stages moved it by 5 % at most (benchmarks/decode/quantized/int4-one-row/). This
script runs the kernel's loads with each arithmetic (``MODES``):

- ``loads``: the words only XORed together: what the access pattern reads at with next to no
  arithmetic (the floor for any arithmetic on it);
- ``fp32``: ``int4_pairs`` (fp16 inputs in the engine): two nibbles per integer operation,
  three fp32 operations per pair, about 30 instructions a word;
- ``bf16x2``: two products per bf16x2 instruction (``bf16x2_step``), the inputs loaded one
  bf16 at a time and paired by integer operations (the engine's first bf16x2 kernel);
- ``bf16x2-words``: ``int4_bf16x2`` (bf16 inputs in the engine): the same with the inputs
  loaded as four bf16 pairs a word and permuted by ``prmt`` (four loads and four permutes
  where ``bf16x2`` has eight loads and about 20 integer operations per word of each
  thread's tile);

each with the next block loaded before this block's arithmetic (``--ahead 1``, as the
engine) or the next two (``2``), over tiles of 64-256 columns and 32-128 inputs, 1-2 warps
and 1,056-2,112 programs. It prints and writes (``--out``) one pass over the projections
(32 layers of qkv, o, gate_up, down; CUDA graph; four distinct weights in turn, nothing in
L2) for each, after checking each against the dequantized reference, with its registers, and
the best of each kind per projection against the engine's kernel. (The first runs also
loaded each block's inputs with its words, a block ahead: it did not help, and was taken
out.)

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_packed.py --out DIR
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
import triton
import triton.language as tl
from fp8_gemm import LAYERS, SHAPES, timed_graph
from int4_pairs import one_pass, pass_inputs

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.weight_only_triton import (
    bf16x2_step,
    int4_bf16x2,
    int4_block,
    int4_pairs,
)

MODES = {"loads": 0, "fp32": 1, "bf16x2": 2, "bf16x2-words": 3}
REGISTERS: dict[tuple[int, ...], tuple[int, int]] = {}  # (tile, mode, ahead): registers, spills


@triton.jit
def bf16x2_scalar(
    x_row, words, word_ok, packed, scale, zero, DEPTH: tl.constexpr, BLOCK_N: tl.constexpr
):
    # int4_bf16x2's arithmetic with its inputs loaded one bf16 at a time, x[8w + j] and
    # x[8w + j + 4], and paired by integer operations (eight loads and about 20 operations a
    # word of each thread's tile, where int4_bf16x2 has four loads and four prmt).
    minus = (-(zero + 128.0)).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    minus = tl.broadcast_to((minus | (minus << 16))[None, :], (DEPTH, BLOCK_N))
    acc = tl.zeros((DEPTH, BLOCK_N), dtype=tl.int32)
    for j in tl.static_range(4):
        xa = tl.load(x_row + words * 8 + j, mask=word_ok, other=0.0)
        xb = tl.load(x_row + words * 8 + j + 4, mask=word_ok, other=0.0)
        pair = (xa.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (
            xb.to(tl.int16, bitcast=True).to(tl.int32) << 16
        )
        acc = bf16x2_step(packed >> (4 * j), pair[:, None], minus, acc)
    low = (acc << 16).to(tl.float32, bitcast=True)
    high = (acc & -65536).to(tl.float32, bitcast=True)
    return (low + high) * scale[None, :]


@triton.jit
def block_products(
    x_row, words, word_ok, packed, scale, zero, MODE: tl.constexpr, DEPTH: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    # One block's [words, columns] products in fp32, the group scale applied.
    if MODE == 0:
        return (packed ^ words[:, None]).to(tl.float32, bitcast=True)
    elif MODE == 1:
        return int4_pairs(x_row, words, word_ok, packed, scale, zero, DEPTH, BLOCK_N)
    elif MODE == 2:
        return bf16x2_scalar(x_row, words, word_ok, packed, scale, zero, DEPTH, BLOCK_N)
    else:
        return int4_bf16x2(x_row, words, word_ok, packed, scale, zero, DEPTH, BLOCK_N)


@triton.jit(do_not_specialize=["M"])
def row_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPAN,
    MODE: tl.constexpr, AHEAD: tl.constexpr,
):  # fmt: skip
    # One row's products over [start, start + SPAN), AHEAD blocks loaded before the
    # arithmetic of the block they follow (the engine's int4_row with MODE 1 or 2, AHEAD 1).
    x_row = x_ptr + tl.program_id(2) * stride_xm
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    DEPTH: tl.constexpr = BLOCK_K // 8
    limit = tl.minimum(start + SPAN, K)
    acc = tl.zeros((DEPTH, BLOCK_N), dtype=tl.float32)
    b0 = int4_block(w_ptr, s_ptr, start, limit, cols, col_ok, N, K, GROUP, DEPTH)
    if AHEAD == 1:
        for offset in range(0, SPAN, BLOCK_K):
            b1 = int4_block(
                w_ptr, s_ptr, start + offset + BLOCK_K, limit, cols, col_ok, N, K, GROUP, DEPTH
            )
            words, word_ok, packed, scale, zero = b0
            acc += block_products(x_row, words, word_ok, packed, scale, zero, MODE, DEPTH, BLOCK_N)
            b0 = b1
    else:
        b1 = int4_block(w_ptr, s_ptr, start + BLOCK_K, limit, cols, col_ok, N, K, GROUP, DEPTH)
        for offset in range(0, SPAN, BLOCK_K):
            b2 = int4_block(
                w_ptr, s_ptr, start + offset + 2 * BLOCK_K, limit, cols, col_ok, N, K, GROUP,
                DEPTH,
            )  # fmt: skip
            words, word_ok, packed, scale, zero = b0
            acc += block_products(x_row, words, word_ok, packed, scale, zero, MODE, DEPTH, BLOCK_N)
            b0 = b1
            b1 = b2
    out = out_ptr + tl.program_id(1) * M * N + tl.program_id(2) * N + cols
    tl.store(out, tl.sum(acc, axis=0), mask=col_ok)


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    config: wo.Config,
    mode: int = 1,
    ahead: int = 1,
) -> torch.Tensor:
    rows, inputs = x.shape
    cols = wo.out_features(weight)
    group = inputs // scale.shape[1]
    splits = wo.splits_for(weight, config)
    parts = x.new_empty(splits, rows, cols, dtype=torch.float32)
    span = triton.cdiv(inputs, splits * config.block_k) * config.block_k
    grid = (triton.cdiv(cols, config.block_n), splits, rows)
    compiled = row_kernel[grid](
        x, weight, scale, parts, rows, cols, inputs, x.stride(0), GROUP=group,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPAN=span, MODE=mode, AHEAD=ahead,
        num_warps=config.warps, num_stages=1,
    )  # fmt: skip
    REGISTERS[config.block_n, config.block_k, config.warps, mode, ahead] = (
        getattr(compiled, "n_regs", -1),
        getattr(compiled, "n_spills", -1),
    )
    return parts


def error_of(run: object, device: str) -> float:
    """Worst relative error against the dequantized reference over a few shapes (the inputs
    and weights a 7B's scale: activations of about 1, weights of about 0.02)."""
    worst = 0.0
    for cols, inputs in ((200, 384), (6144, 4096), (4096, 14336)):
        weight = torch.randn(cols, inputs, device=device) * 0.02
        q, scale = wo.quantize_int4_groups(weight)
        x = torch.randn(1, inputs, device=device, dtype=torch.bfloat16)
        got = run(x, q, scale).sum(0)  # type: ignore[operator]
        want = torch.nn.functional.linear(x.float(), wo.dequantize(q, scale))
        worst = max(worst, ((got - want).norm() / want.norm()).item())
    return worst


Run = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]


def kernel(config: wo.Config, mode: int, ahead: int) -> Run:
    """This script's kernel on ``config`` as ``one_pass`` calls a launch."""
    return lambda x, q, s, _: launch(x, q, s, config, mode, ahead)


def engine_kernel(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, _: object) -> torch.Tensor:
    """The engine's one-row kernel on its own tiles and split."""
    config = wo.ONE_ROW_CONFIGS[wo.INT4]
    group = x.shape[1] // s.shape[1]
    return wo.launch(x, q, s, wo.INT4, group, wo.splits_for(q, config), config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ahead", type=int, nargs="+", choices=(1, 2), default=[1, 2])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = parser.parse_args()
    torch.manual_seed(0)
    forms, xs = pass_inputs("cuda", 1)

    def timed(run: Run, only: int | None = None) -> dict[str, object]:
        """One pass over the projections (or 32 layers of projection ``only``)."""
        shapes = range(len(SHAPES)) if only is None else [only]
        these = [[form[i] for i in shapes] for form in forms]
        ms = timed_graph(partial(one_pass, run, [xs[i] for i in shapes], these, None))
        row: dict[str, object] = {"ms": round(ms, 4)}
        if only is not None:
            q, s = forms[0][only]
            read = LAYERS * (q.numel() * q.element_size() + s.numel() * s.element_size())
            row |= {"shape": list(SHAPES[only]), "tb_s": round(read / ms / 1e9, 2)}
        return row

    def record(row: dict[str, object], into: list[dict[str, object]]) -> None:
        into.append(row)
        print(json.dumps(row), flush=True)

    rows: list[dict[str, object]] = []
    engine = {"kernel": "engine", "config": list(wo.ONE_ROW_CONFIGS[wo.INT4])}
    error = error_of(lambda x, q, s: engine_kernel(x, q, s, None), "cuda")
    record(engine | {"error": error} | timed(engine_kernel), rows)
    best: dict[tuple[str, int], tuple[float, wo.Config]] = {}
    # Blocks of 32-128 inputs (a group of 128 takes its scales once a block or reloads them):
    # with 1 warp a 128-column tile, with 2 warps a 256-column tile, gives the scales' own load
    # the products' layout (no exchange through shared memory each block).
    tiles = itertools.product((64, 128, 256), (32, 64, 128), (1, 2), (1056, 2112))
    for (block_n, block_k, warps, programs), (name, mode), ahead in itertools.product(
        tiles, MODES.items(), args.ahead
    ):
        if name not in args.modes:
            continue
        config = wo.Config(1, block_n, block_k, warps, 1, programs)
        run = kernel(config, mode, ahead)
        error = 0.0
        if name != "loads":
            error = error_of(lambda x, q, s, r=run: r(x, q, s, None), "cuda")
        row = {"kernel": name, "ahead": ahead, "config": list(config), "error": error}
        row |= timed(run)
        row["registers"], row["spills"] = REGISTERS[block_n, block_k, warps, mode, ahead]
        record(row, rows)
        ms = float(rows[-1]["ms"])  # type: ignore[arg-type]
        if (name, ahead) not in best or ms < best[name, ahead][0]:
            best[name, ahead] = (ms, config)
    per_shape: list[dict[str, object]] = []
    for i in range(len(SHAPES)):
        record(engine | timed(engine_kernel, i), per_shape)
        for (name, ahead), (_, config) in best.items():
            row = {"kernel": name, "ahead": ahead, "config": list(config)}
            record(row | timed(kernel(config, MODES[name], ahead), i), per_shape)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "rows": rows, "per_shape": per_shape}
    (args.out / "int4_packed.json").write_text(json.dumps(report, indent=2))
    (args.out / "int4_packed.md").write_text(markdown(report, best))
    print(markdown(report, best))


def markdown(report: dict[str, Any], best: dict[tuple[str, int], tuple[float, wo.Config]]) -> str:
    """The best tile of each kind over a pass, and each projection on those tiles."""
    engine = report["rows"][0]
    lines = [
        f"One pass over a 7B's projections at one row ({report['gpu']}, CUDA graph, ms).",
        "",
        "| kernel | ahead | tile (block_m, block_n, block_k, warps, stages, programs) | ms |",
        "| --- | ---: | --- | ---: |",
        f"| engine | 1 | {tuple(engine['config'])} | {engine['ms']} |",
    ]
    for (name, ahead), (ms, config) in sorted(best.items(), key=lambda item: item[1][0]):
        lines.append(f"| {name} | {ahead} | {tuple(config)} | {ms} |")
    lines += [
        "",
        "| projection | kernel | ahead | ms | TB/s |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in report["per_shape"]:
        lines.append(
            f"| {tuple(row['shape'])} | {row['kernel']} | {row.get('ahead', 1)} | {row['ms']} "
            f"| {row['tb_s']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
