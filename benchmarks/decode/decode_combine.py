"""Decode attention with the splits combined inside the kernel (arrival counters) against the
separate combine kernel, on the GPU profile's cache (1,536 positions a slot, 8 KV heads of 128,
32 query heads) at the batches that split (1-32 rows), each in a CUDA graph of 32 calls (one
per layer, as in a decode step). Prints and saves a table of microseconds per call.

    PYTHONPATH=handler python benchmarks/decode/decode_combine.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from hymt_serve.engine import attention

LAYERS = 32


def time_graph(batch: int, live: int, length: int, fused: bool, replays: int = 50) -> float:
    """Microseconds per attention call: a graph of LAYERS calls over one cache, replayed."""
    torch.manual_seed(batch)
    slots_total = max(batch, 4)
    kv = torch.randn(2, slots_total, 8, length, 128, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, 32, 128, device="cuda", dtype=torch.bfloat16)
    new = torch.randn(2, batch, 8, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.arange(batch, device="cuda")
    positions = torch.full((batch,), live - 1, device="cuda")
    saved = attention._COUNTER_SLOTS
    attention._COUNTER_SLOTS = saved if fused else 0
    try:

        def step() -> torch.Tensor:
            out = q
            for _ in range(LAYERS):
                out = attention._triton_decode_attention(
                    out, new[0], new[1], kv[0], kv[1], slots, positions, 128**-0.5
                )
            return out

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            expected = step()  # warm-up (compiles, makes the counters)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = step()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(got.float(), expected.float(), atol=1e-2, rtol=1e-2)
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / LAYERS)
        return statistics.median(times)
    finally:
        attention._COUNTER_SLOTS = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--live", type=int, nargs="+", default=[60, 600])
    parser.add_argument("--length", type=int, default=1536)
    args = parser.parse_args()
    rows = []
    for live in args.live:
        for batch in args.batches:
            splits = attention.num_splits(batch, 8, args.length)
            # alternate the order, so that neither side always runs second
            order = (True, False) if batch % 2 else (False, True)
            us = {fused: time_graph(batch, live, args.length, fused) for fused in order}
            rows.append(
                {"batch": batch, "live": live, "splits": splits, "separate_us": round(us[False], 2),
                 "fused_us": round(us[True], 2), "ratio": round(us[True] / us[False], 3)}
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        f"# Decode attention: splits combined in the kernel against the combine kernel "
        f"({torch.cuda.get_device_name()}, cache {args.length} positions)",
        "",
        "| batch | live positions | splits | separate us/call | fused us/call | fused / separate |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['batch']} | {r['live']} | {r['splits']} | {r['separate_us']} | {r['fused_us']} "
        f"| {r['ratio']} |"
        for r in rows
    ]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
