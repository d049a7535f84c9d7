"""Where a mixed step's time goes at the sentence mix's 256-user shape, per weight form.

At 256 users the engine keeps about 208 rows decoding, and each step carries chunks of the
new rows' prompts (about 14 tokens each past the shared 12-token template). This loads one
engine per form (``step_ab.py``'s, over the same 7B-shaped random-weight checkpoint) with
that batch: ``--rows`` decoding rows at position 40 and ``--prompts`` prompts of 26 tokens
whose first 12 are already in their slots. It times the decode-only graph of the rows' bucket
and the mixed graph (the same decode step with the prompt chunk), then profiles the mixed
pass run eagerly (the kernels its graph replays) and sums the kernels by kind: GEMMs
(cuBLAS, fp8's scaled products), attention (the engine's Triton kernels), inductor's fused
elementwise kernels, the rest. The model's FLOPs (``flops.py``, as ``run_bench.py`` counts
them) over the mixed graph's time give the step's share of the card's bf16 matrix rate,
measured on the spot.

    PYTHONPATH=handler:benchmarks/decode:loadtest/serving \
        python benchmarks/serving/mixed_kernels.py --out DIR [--forms none fp8] [--rows 208]

Writes ``mixed_kernels.json`` and ``mixed_kernels.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_decode import build_model, cuda_kernels
from flops import bf16_matmul_rate, flops_per_token
from step_ab import PROMPT, engine

from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.runners.inputs import PackedPrompts, packed_layout, pinned
from hymt_serve.engine.runners.prefill import MIXED_BUCKETS

TEMPLATE = 12  # prompt tokens already in the slot (the shared instruction template)
LENGTH = 26  # prompt tokens of a sentence of the mix, template included
KINDS = (
    ("gemm", re.compile(r"nvjet|gemm|xmma|cutlass|cublas|scaled_mm|splitk|sm90_", re.I)),
    ("attention", re.compile(r"attention|attn|flash|prompt|combine|fmha|sdpa", re.I)),
    ("inductor", re.compile(r"^triton_")),
)


def timed_ms(fn: Callable[[], object], repeats: int = 50) -> float:
    """Median over 5 rounds of ``repeats`` calls, in ms a call."""
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / repeats * 1e3)
    return sorted(rounds)[2]


def kind(name: str) -> str:
    return next((label for label, pattern in KINDS if pattern.search(name)), "other")


def batch(runner: FastRunner, rows: int, prompts: int) -> tuple[int, int, PackedPrompts, list[int]]:
    """Load ``rows`` decoding rows and lay out ``prompts`` prompt chunks into the mixed graph
    that holds them: (decode bucket, chunk bucket, the eager view, the host layout)."""
    generator = torch.Generator().manual_seed(rows)
    high = runner.vocab
    ids = torch.randint(high // 2, high, (prompts, LENGTH), generator=generator).tolist()
    slots = list(range(rows, rows + prompts))
    starts = [TEMPLATE] * prompts
    tokens, keys = prompts * (LENGTH - TEMPLATE), prompts * LENGTH
    runner.load(
        torch.zeros(rows, dtype=torch.int64, device=runner.device),
        torch.full((rows,), PROMPT, dtype=torch.int64, device=runner.device),
        torch.arange(rows, device=runner.device),
    )
    chunk, width = next((c, k) for c, k in MIXED_BUCKETS if c >= tokens and k >= keys + 1)
    height = runner._mixed_rows(chunk)
    layout = packed_layout(
        ids, slots, tokens=chunk, rows=height, scratch_slot=runner.scratch_slot,
        starts=starts, keys=width,
    )  # fmt: skip
    flat = torch.tensor(layout, device=runner.device)
    return runner.bucket, chunk, PackedPrompts.view(flat, chunk, width, height), layout


def measure(
    runner: FastRunner, rows: int, prompts: int, flops: float, rate: float, top: int
) -> dict[str, Any]:
    with torch.inference_mode():
        bucket, chunk, view, layout = batch(runner, rows, prompts)
        decode_ms = timed_ms(runner.step)
        runner.prefill_inputs[: len(layout)].copy_(pinned(layout, torch.int64))
        graph = runner.mixed_graphs[bucket, chunk]
        mixed_ms = timed_ms(graph.replay)
        totals = cuda_kernels(lambda: runner._mixed_forward(bucket, view), width=100)
        runner.clear()
    by_kind: dict[str, list[float]] = {}
    for name, (ms, calls) in totals.items():
        entry = by_kind.setdefault(kind(name), [0.0, 0])
        entry[0] += ms
        entry[1] += calls
    real = rows + prompts * (LENGTH - TEMPLATE)
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return {
        "decode_bucket": bucket,
        "chunk_bucket": chunk,
        "tokens": real,
        "padded_tokens": bucket + chunk,
        "decode_graph_ms": round(decode_ms, 4),
        "mixed_graph_ms": round(mixed_ms, 4),
        "mfu": round(real * flops / (mixed_ms / 1e3) / rate, 4),
        "kernel_ms": round(sum(v[0] for v in totals.values()), 4),
        "launches": int(sum(v[1] for v in totals.values())),
        "kinds": {k: {"ms": round(v[0], 4), "launches": int(v[1])} for k, v in by_kind.items()},
        "top": [{"kernel": k, "ms": round(v[0], 4), "calls": int(v[1])} for k, v in ranked],
    }


def markdown(found: dict[str, Any]) -> list[str]:
    lines = [
        f"# Kernels of a mixed step: {found['gpu']}, torch {found['torch']}, bf16 products "
        f"{found['bf16_matmul_tflops']} TFLOP/s",
        "",
    ]
    for form, got in found["forms"].items():
        lines += [
            f"## {form}: {got['tokens']} tokens ({got['decode_bucket']} decode rows padded + "
            f"{got['chunk_bucket']} prompt tokens padded = {got['padded_tokens']})",
            "",
            f"- decode-only graph {got['decode_graph_ms']} ms; mixed graph "
            f"{got['mixed_graph_ms']} ms; model FLOP utilisation of the mixed step "
            f"{100 * got['mfu']:.1f} % (real tokens)",
            f"- eager kernels: {got['kernel_ms']} ms in {got['launches']} launches",
            "",
            "| kind | ms | share | launches |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name, entry in sorted(got["kinds"].items(), key=lambda kv: -kv[1]["ms"]):
            share = 100 * entry["ms"] / got["kernel_ms"]
            lines.append(f"| {name} | {entry['ms']} | {share:.1f} % | {entry['launches']} |")
        lines += ["", "| kernel | ms | calls |", "| --- | ---: | ---: |"]
        lines += [f"| `{k['kernel']}` | {k['ms']} | {k['calls']} |" for k in got["top"]]
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--forms", nargs="+", default=["none", "fp8"])
    parser.add_argument("--rows", type=int, default=208)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/hymt-7b-random"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.checkpoint / "config.json").is_file():
        build_model().save_pretrained(args.checkpoint)
        gc.collect()
        torch.cuda.empty_cache()
    flops = flops_per_token(json.loads((args.checkpoint / "config.json").read_text()))
    rate = bf16_matmul_rate()
    assert rate is not None, "needs a CUDA GPU"
    found: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "flops_per_token": flops,
        "bf16_matmul_tflops": round(rate / 1e12, 1),
        "rows": args.rows,
        "prompts": args.prompts,
        "forms": {},
    }
    for form in args.forms:
        runner = engine(args.checkpoint, form, "base", 256, PROMPT + 128)
        found["forms"][form] = measure(runner, args.rows, args.prompts, flops, rate, args.top)
        del runner
        gc.collect()
        torch.cuda.empty_cache()
        lines = markdown(found)
        (args.out / "mixed_kernels.json").write_text(json.dumps(found, indent=1) + "\n")
        (args.out / "mixed_kernels.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
