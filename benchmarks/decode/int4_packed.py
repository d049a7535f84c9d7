"""int4 at one row: where the engine's one-row kernel loses its time, and two ways to cut it.

The engine's one-row int4 kernel (``weight_only_kernels.int4_row``) reads a 7B's projections at
1.4-2.0 TB/s, and a sweep over its tiles, warps, program counts and pipeline stages moved it
by 5 % at most (benchmarks/decode/quantized/int4-one-row/): the limit is not the tile. This
script runs, on the engine's tiles and split:

- ``loads``: the same loads, the words only XORed together: what this access pattern reads at
  with next to no arithmetic (the floor for any arithmetic on it);
- ``fp32``: the engine's arithmetic (about 30 instructions a word: two nibbles per integer
  operation into fp32, three fp32 operations per pair);
- ``bf16x2``: two nibbles per bf16x2 instruction. ``lop3`` masks nibbles ``j`` and ``j + 4``
  into the halves of 0x43004300 (the bf16 pair 128 + q, exact), one ``fma.bf16x2`` takes off
  128 + the zero point (exact: small integers), one more multiplies by the inputs
  ``(x[8w + j], x[8w + j + 4])`` and adds: eight products a word in four bf16x2 accumulations,
  widened to fp32 once a block (about 19 instructions a word). The four products a lane sums
  in bf16 round at 2^-9 of their size, far under int4's own quantization error;

each with the next block loaded before this block's arithmetic (``ahead`` 1, as the engine),
or the next two (``ahead`` 2), over the engine's split (2,112 programs) and fewer, longer
programs. It prints and writes (``--out``) one pass over the projections (32 layers of qkv, o,
gate_up, down; CUDA graph; four distinct weights in turn, nothing in L2) for each, after
checking each against the dequantized reference, and the best of each kind per projection.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_packed.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from fp8_gemm import LAYERS, SHAPES, timed_graph
from int4_pairs import one_pass, pass_inputs

from hymt_serve.engine import weight_only as wo
from hymt_serve.engine.weight_only_kernels import int4_block

MODES = {"loads": 0, "fp32": 1, "bf16x2": 2}
REGISTERS: dict[tuple[int, ...], tuple[int, int]] = {}  # (tile, mode, ahead): registers, spills


@triton.jit
def load_block(
    x_row, w_ptr, s_ptr, k0, limit, cols, col_ok, N, K, GROUP: tl.constexpr,
    DEPTH: tl.constexpr, X_AHEAD: tl.constexpr,
):  # fmt: skip
    # A block's words, scales and zero points, and with X_AHEAD its inputs too: the eight
    # [words] vectors x[8w + i], i = 0..7 (else scalars the products load for themselves).
    words, word_ok, packed, scale, zero = int4_block(
        w_ptr, s_ptr, k0, limit, cols, col_ok, N, K, GROUP, DEPTH
    )
    if X_AHEAD:
        x0, x1, x2, x3, x4, x5, x6, x7 = load_inputs(x_row, words, word_ok)
    else:
        x0, x1, x2, x3, x4, x5, x6, x7 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    return words, word_ok, packed, scale, zero, x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def load_inputs(x_row, words, word_ok):
    x = x_row + words * 8
    x0 = tl.load(x + 0, mask=word_ok, other=0.0)
    x1 = tl.load(x + 1, mask=word_ok, other=0.0)
    x2 = tl.load(x + 2, mask=word_ok, other=0.0)
    x3 = tl.load(x + 3, mask=word_ok, other=0.0)
    x4 = tl.load(x + 4, mask=word_ok, other=0.0)
    x5 = tl.load(x + 5, mask=word_ok, other=0.0)
    x6 = tl.load(x + 6, mask=word_ok, other=0.0)
    x7 = tl.load(x + 7, mask=word_ok, other=0.0)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def fp32_pair(packed, xa, xb, j: tl.constexpr):
    # The engine's arithmetic for nibbles j and j + 4: (128 + q) * x in fp32.
    pair = ((packed >> (4 * j)) & 0x000F000F) | 0x43004300
    low = (pair << 16).to(tl.float32, bitcast=True)
    high = (pair & -65536).to(tl.float32, bitcast=True)
    return low * xa.to(tl.float32)[:, None] + high * xb.to(tl.float32)[:, None]


@triton.jit
def bf16x2_pair(packed, xa, xb, minus, acc, j: tl.constexpr):
    # One bf16x2 step for nibbles j and j + 4 of every word, against (x[8w + j], x[8w + j + 4]):
    # lop3 (a & 0x000F000F) | 0x43004300 -> (128 + q_j, 128 + q_j+4); fma * 1 - (128 + zero)
    # -> q - zero, exact; fma with the inputs into the accumulator.
    pair = (xa.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (
        xb.to(tl.int16, bitcast=True).to(tl.int32) << 16
    )
    return tl.inline_asm_elementwise(
        "{ .reg .b32 p, w, mask, magic, one;"
        " mov.b32 mask, 0x000F000F; mov.b32 magic, 0x43004300; mov.b32 one, 0x3F803F80;"
        " lop3.b32 p, $1, mask, magic, 0xEA;"
        " fma.rn.bf16x2 w, p, one, $3;"
        " fma.rn.bf16x2 $0, w, $2, $4; }",
        "=r,r,r,r,r",
        [packed >> (4 * j), tl.broadcast_to(pair[:, None], acc.shape), minus, acc],
        dtype=tl.int32,
        is_pure=True,
        pack=1,
    )


@triton.jit
def block_products(
    x_row, block, MODE: tl.constexpr, X_AHEAD: tl.constexpr, DEPTH: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    # One block's [words, columns] products in fp32, the group scale applied.
    words, word_ok, packed, scale, zero, x0, x1, x2, x3, x4, x5, x6, x7 = block
    if MODE == 0:
        return (packed ^ words[:, None]).to(tl.float32, bitcast=True)
    if not X_AHEAD:
        x0, x1, x2, x3, x4, x5, x6, x7 = load_inputs(x_row, words, word_ok)
    if MODE == 1:
        part = fp32_pair(packed, x0, x4, 0)
        part += fp32_pair(packed, x1, x5, 1)
        part += fp32_pair(packed, x2, x6, 2)
        part += fp32_pair(packed, x3, x7, 3)
        x_sum = (x0.to(tl.float32) + x4.to(tl.float32)) + (x1.to(tl.float32) + x5.to(tl.float32))
        x_sum += (x2.to(tl.float32) + x6.to(tl.float32)) + (x3.to(tl.float32) + x7.to(tl.float32))
        return part * scale[None, :] - x_sum[:, None] * ((zero + 128.0) * scale)[None, :]
    base = (-(zero + 128.0)).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    minus = tl.broadcast_to((base | (base << 16))[None, :], (DEPTH, BLOCK_N))
    acc = tl.zeros((DEPTH, BLOCK_N), dtype=tl.int32)  # bf16x2 (+0, +0)
    acc = bf16x2_pair(packed, x0, x4, minus, acc, 0)
    acc = bf16x2_pair(packed, x1, x5, minus, acc, 1)
    acc = bf16x2_pair(packed, x2, x6, minus, acc, 2)
    acc = bf16x2_pair(packed, x3, x7, minus, acc, 3)
    low = (acc << 16).to(tl.float32, bitcast=True)
    high = (acc & -65536).to(tl.float32, bitcast=True)
    return (low + high) * scale[None, :]


@triton.jit(do_not_specialize=["M"])
def row_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPAN,
    MODE: tl.constexpr, AHEAD: tl.constexpr, X_AHEAD: tl.constexpr,
):  # fmt: skip
    # One row's products over [start, start + SPAN), AHEAD blocks loaded before the
    # arithmetic of the block they follow.
    x_row = x_ptr + tl.program_id(2) * stride_xm
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    DEPTH: tl.constexpr = BLOCK_K // 8
    limit = tl.minimum(start + SPAN, K)
    acc = tl.zeros((DEPTH, BLOCK_N), dtype=tl.float32)
    b0 = load_block(x_row, w_ptr, s_ptr, start, limit, cols, col_ok, N, K, GROUP, DEPTH, X_AHEAD)
    if AHEAD == 1:
        for offset in range(0, SPAN, BLOCK_K):
            b1 = load_block(
                x_row, w_ptr, s_ptr, start + offset + BLOCK_K, limit, cols, col_ok, N, K,
                GROUP, DEPTH, X_AHEAD,
            )  # fmt: skip
            acc += block_products(x_row, b0, MODE, X_AHEAD, DEPTH, BLOCK_N)
            b0 = b1
    else:
        b1 = load_block(
            x_row, w_ptr, s_ptr, start + BLOCK_K, limit, cols, col_ok, N, K, GROUP, DEPTH,
            X_AHEAD,
        )  # fmt: skip
        for offset in range(0, SPAN, BLOCK_K):
            b2 = load_block(
                x_row, w_ptr, s_ptr, start + offset + 2 * BLOCK_K, limit, cols, col_ok, N, K,
                GROUP, DEPTH, X_AHEAD,
            )  # fmt: skip
            acc += block_products(x_row, b0, MODE, X_AHEAD, DEPTH, BLOCK_N)
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
    x_ahead: bool = False,
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
        X_AHEAD=x_ahead, num_warps=config.warps, num_stages=1,
    )  # fmt: skip
    REGISTERS[config.block_n, config.warps, mode, ahead, x_ahead] = (
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


def kernel(config: wo.Config, mode: int, ahead: int, x_ahead: bool) -> Run:
    """This script's kernel on ``config`` as ``one_pass`` calls a launch."""
    return lambda x, q, s, _: launch(x, q, s, config, mode, ahead, x_ahead)


def engine_kernel(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, _: object) -> torch.Tensor:
    """The engine's one-row kernel on its own tiles and split."""
    config = wo.ONE_ROW_CONFIGS[wo.INT4]
    group = x.shape[1] // s.shape[1]
    return wo.launch(x, q, s, wo.INT4, group, wo.splits_for(q, config), config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
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
    best: dict[tuple[str, int, bool], tuple[float, wo.Config]] = {}
    tiles = itertools.product((32, 64, 128), (1, 2, 4), (528, 1056, 2112))
    for (block_n, warps, programs), (name, mode), ahead, x_ahead in itertools.product(
        tiles, MODES.items(), (1, 2), (False, True)
    ):
        if name == "loads" and x_ahead:
            continue
        config = wo.Config(1, block_n, 128, warps, 1, programs)
        run = kernel(config, mode, ahead, x_ahead)
        error = 0.0
        if name != "loads":
            error = error_of(lambda x, q, s, r=run: r(x, q, s, None), "cuda")
        row = {
            "kernel": name, "ahead": ahead, "x_ahead": x_ahead, "config": list(config),
            "error": error,
        }  # fmt: skip
        row |= timed(run)
        row["registers"], row["spills"] = REGISTERS[block_n, warps, mode, ahead, x_ahead]
        record(row, rows)
        ms = float(rows[-1]["ms"])  # type: ignore[arg-type]
        if (name, ahead, x_ahead) not in best or ms < best[name, ahead, x_ahead][0]:
            best[name, ahead, x_ahead] = (ms, config)
    per_shape: list[dict[str, object]] = []
    for i in range(len(SHAPES)):
        record(engine | timed(engine_kernel, i), per_shape)
        for (name, ahead, x_ahead), (_, config) in best.items():
            row = {"kernel": name, "ahead": ahead, "x_ahead": x_ahead, "config": list(config)}
            record(row | timed(kernel(config, MODES[name], ahead, x_ahead), i), per_shape)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "rows": rows, "per_shape": per_shape}
    (args.out / "int4_packed.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
