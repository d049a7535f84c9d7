"""int4 at one row on tensor cores: the engine's one-row kernel (CUDA cores) against tiled ones.

The one-row int4 kernel (``weight_only_kernels.int4_row``) reads a 7B's projections at about
1.7 TB/s, under half of what the card copies (benchmarks/decode/quantized/int4-one-row/). bf16
at one row went fastest on tensor cores, one live row of a 16-row tile whose loads Triton
pipelines (benchmarks/decode/bf16-row/). This script asks the same of int4:

- ``engine``: the engine's one-row kernel and tiles (the baseline; with ``--rows``, the
  engine's few-rows tiles);
- ``tile``: the engine's tiled kernel (``int4_tile``, its few-rows path) at one row;
- ``magic``: a tiled kernel whose nibbles reach the tensor cores without a conversion
  instruction: a nibble masked into the low bits of 0x4300 reads as the bf16 128 + q, exactly;
  eight 16-deep products per 128-input block; 128 and the zero point come off once per block
  through the block's sum of inputs. Its loads are left to Triton's pipeline (``magic``) or
  the next block's words load ahead by hand (``magic-ahead``, as the engine's kernels do).

Each is checked against the dequantized reference, then timed over one pass of a 7B's
projections (32 layers of qkv, o, gate_up, down; 4 distinct weights in turn; CUDA graph), at
one row or at ``--rows`` (the engine's few-rows path). Result (H200,
benchmarks/decode/quantized/against-bf16-row/): both ``magic`` forms took 1.7-1.9 x the
one-row kernel's time, so the engine keeps it.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_dot.py --out DIR [--rows 8]
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
from fp8_gemm import timed_graph
from int4_pairs import engine_launch, error_of, one_pass, pass_inputs

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.weight_only_triton import int4_block


@triton.jit
def magic_block(
    x_rows, row_ok, words, word_ok, packed, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):  # type: ignore[no-untyped-def]
    # One 128-input block's products sum over j of x[:, 8w + j] (128 + q_j[w, :]), and the
    # block's sum of inputs per row.
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for j in tl.static_range(8):
        x = tl.load(
            x_rows + (words * 8 + j)[None, :], mask=row_ok[:, None] & word_ok[None, :], other=0.0
        )
        bits = ((packed >> (4 * j)) & 0xF) | 0x4300
        q = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
        part += tl.dot(x, q.to(x.dtype))
        x_sum += tl.sum(x.to(tl.float32), axis=1)
    return part, x_sum


@triton.jit(do_not_specialize=["M", "SPAN"])
def magic_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPAN,
    AHEAD: tl.constexpr,
):  # fmt: skip
    # One program per (column tile, split, row tile); blocks of 128 inputs (one group).
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    limit = tl.minimum(start + SPAN, K)
    x_rows = x_ptr + rows[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    words, word_ok, packed, scale, zero = int4_block(
        w_ptr, s_ptr, start, limit, cols, col_ok, N, K, GROUP, 16
    )
    for offset in range(0, SPAN, 128):
        if AHEAD:
            ahead = int4_block(
                w_ptr, s_ptr, start + offset + 128, limit, cols, col_ok, N, K, GROUP, 16
            )
        else:
            words, word_ok, packed, scale, zero = int4_block(
                w_ptr, s_ptr, start + offset, limit, cols, col_ok, N, K, GROUP, 16
            )
        part, x_sum = magic_block(x_rows, row_ok, words, word_ok, packed, BLOCK_M, BLOCK_N)
        acc += part * scale[None, :] - x_sum[:, None] * ((zero + 128.0) * scale)[None, :]
        if AHEAD:
            words, word_ok, packed, scale, zero = ahead
    out = out_ptr + tl.program_id(1) * M * N + rows[:, None] * N + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])


def launch_magic(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: wo.Config, ahead: bool
) -> torch.Tensor:
    rows, inputs = x.shape
    cols = wo.out_features(weight)
    group = inputs // scale.shape[1]
    assert group % 128 == 0, group
    config = config._replace(block_k=128)
    splits = wo.splits_for(weight, config)
    parts = x.new_empty(splits, rows, cols, dtype=torch.float32)
    span = triton.cdiv(inputs, splits * 128) * 128
    grid = (triton.cdiv(cols, config.block_n), splits, triton.cdiv(rows, config.block_m))
    magic_kernel[grid](
        x, weight, scale, parts, rows, cols, inputs, x.stride(0), GROUP=group,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, SPAN=span, AHEAD=ahead,
        num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return parts


def variants(rows: int) -> list[tuple[str, object, wo.Config]]:
    engine = wo.ONE_ROW_CONFIGS[wo.INT4] if rows == 1 else wo.FEW_ROWS_CONFIGS[wo.INT4]
    found: list[tuple[str, object, wo.Config]] = [("engine", engine_launch, engine)]
    tiles = itertools.product((32, 64, 128), (128,), (4,), (1, 3), (264, 528, 1056))
    found += [("tile", engine_launch, wo.Config(16, *t)) for t in tiles]
    tiles = itertools.product((32, 64, 128), (128,), (4,), (3, 4), (264, 528, 1056))
    found += [("magic", partial(launch_magic, ahead=False), wo.Config(16, *t)) for t in tiles]
    tiles = itertools.product((32, 64, 128), (128,), (4,), (1, 3), (264, 528, 1056))
    found += [("magic-ahead", partial(launch_magic, ahead=True), wo.Config(16, *t)) for t in tiles]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check-only", action="store_true", help="correctness, no timing")
    parser.add_argument("--rows", type=int, default=1, help="rows of input in the timed pass")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    forms, xs = ([], []) if args.check_only else pass_inputs(device, args.rows)
    results = []
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / f"int4_dot-{args.rows}.json"
    for name, launch, config in variants(args.rows):
        row: dict[str, object] = {"kernel": name, "config": list(config), "rows": args.rows}
        try:
            row["error"] = error_of(launch, config, device)
            if not args.check_only:
                row["ms"] = round(timed_graph(partial(one_pass, launch, xs, forms, config)), 3)
        except Exception as exc:  # a tile the compiler refuses is reported, not fatal
            row["failed"] = f"{exc!r:.200}"
        results.append(row)
        print(json.dumps(row), flush=True)
        saved.write_text(json.dumps({"rows": results}, indent=2))
    timed = [r for r in results if "ms" in r]
    for name in dict.fromkeys(r["kernel"] for r in timed):
        best = min((r for r in timed if r["kernel"] == name), key=lambda r: r["ms"])  # type: ignore[arg-type,return-value]
        print(f"best {name}: {best['config']} {best['ms']} ms (error {best['error']:.2e})")


if __name__ == "__main__":
    main()
