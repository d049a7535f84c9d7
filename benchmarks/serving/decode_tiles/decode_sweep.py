"""The decode attention kernel's launch configs on the GPU: positions per tile (BLOCK_N), warps
and pipeline stages, at the sentence mix's batches and live lengths and one long case. Each
config runs in a CUDA graph (100 replays) and is checked against the PyTorch reference.

A program, not a test: it chose ``attention._DECODE_TILES``. Writes ``decode_sweep.json``.
``--splits`` instead times the engine's tiles at each split count of the sequence (1-16) for
small batches and several live lengths (``split_sweep.json``): what ``attention.num_splits``
chooses from.

    PYTHONPATH=handler python benchmarks/serving/decode_tiles/decode_sweep.py --out DIR [--splits]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import torch
import triton

from hymt_serve.engine.kernels import attention

KV_HEADS, HEADS, DIM, MAX_LEN = 8, 32, 128, 1536  # the 7B; the GPU profile's 1,024 + 512 tokens
CASES = [(1, 60), (64, 60), (128, 100), (256, 60), (64, 700)]  # (batch, live positions)


SPLIT_CASES = [(b, n) for b in (1, 2, 4, 8, 16, 32) for n in (60, 100, 300, 700)]


def run(
    batch: int, length: int, block_n: int, warps: int, stages: int, splits: int = 0
) -> dict[str, Any]:
    """One config in a CUDA graph; ``splits`` 0: the engine's own count for the batch."""
    torch.manual_seed(0)
    k_cache = torch.randn(batch + 1, KV_HEADS, MAX_LEN, DIM, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    k_new = torch.randn(batch, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn_like(k_new)
    slots = torch.arange(batch, device="cuda")
    positions = torch.full((batch,), length - 1, device="cuda")
    splits = splits or attention.num_splits(batch, KV_HEADS, MAX_LEN)
    out = torch.empty_like(q)
    parts = max(splits, 2) if splits > 1 else 1
    acc = torch.empty(batch, HEADS, parts, DIM, device="cuda", dtype=torch.float32)
    stats = torch.empty(batch, HEADS, parts, 2, device="cuda", dtype=torch.float32)
    group = HEADS // KV_HEADS

    def call() -> None:
        attention._decode_kernel[(batch, KV_HEADS, splits)](
            q, k_new, v_new, k_cache, v_cache, slots, positions, out, acc, stats,
            q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0),
            v_new.stride(1), *k_cache.stride()[:3], DIM**-0.5,
            HEADS=HEADS, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), DIM=DIM,
            SPLITS=splits, BLOCK_N=block_n, num_warps=warps, num_stages=stages,
        )  # fmt: skip
        if splits > 1:
            attention._combine_kernel[(batch, HEADS)](acc, stats, out, SPLITS=splits, DIM=DIM)

    expected = attention.reference_decode_attention(
        q, k_new, v_new, k_cache.clone(), v_cache.clone(), slots, positions, DIM**-0.5
    )
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    error = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    us = 10 * start.elapsed_time(end)  # ms over 100 replays -> us per replay
    read = batch * KV_HEADS * length * DIM * 2 * 2  # K and V, bf16
    return {
        "batch": batch, "length": length, "splits": splits, "block_n": block_n,
        "warps": warps, "stages": stages, "us": round(us, 2),
        "tb_s": round(read / us / 1e6, 2), "rel_err": error,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--splits", action="store_true", help="sweep the split count instead")
    args = parser.parse_args()
    if args.splits:
        tiles = attention._DECODE_TILES
        found = []
        for (batch, length), splits in itertools.product(SPLIT_CASES, (1, 2, 4, 8, 16)):
            found.append(
                run(
                    batch, length, tiles["BLOCK_N"], tiles["num_warps"], tiles["num_stages"], splits
                )
            )
            print(json.dumps(found[-1]), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "split_sweep.json").write_text(json.dumps(found, indent=1) + "\n")
        return
    rows = []
    for (batch, length), block_n, warps, stages in itertools.product(
        CASES, (32, 64, 128), (2, 4, 8), (1, 2, 3)
    ):
        try:
            row = run(batch, length, block_n, warps, stages)
        except Exception as error:  # a config that does not compile or fit is reported
            row = {"batch": batch, "length": length, "block_n": block_n, "warps": warps,
                   "stages": stages, "error": type(error).__name__}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_sweep.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
