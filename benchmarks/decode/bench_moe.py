"""Decode speed of the fast engine on Hy-MT2-30B-A3B's shape (``hy_v3``, random bf16 weights).

A program, not a test: one run on one GPU builds the real ``hy_v3`` architecture with random
bf16 weights (speed does not depend on the values of the weights; the router's are spread as
a trained router's are, so that tokens choose varied experts), builds the fast engine as
production does (ready time: build, compile, capture), and for each batch size times the
scheduler's decode loop against two rooflines: the weights a step must read (attention, the
dense layer, the router, the shared expert, the LM head and the experts the batch chooses,
expected under uniform routing: ``E x (1 - (1 - k/E)^b)`` of ``E`` per layer) plus the KV cache,
and the all-experts roofline (every weight once). It also reports the memory plan (how many KV
tokens fit beside the weights), the costliest kernels of a step, and writes ``results.json``,
``results.md`` and ``decode.png`` to ``--out``.

``--quantize fp8`` measures the same with the weights quantized at load as the ``quantization:
fp8`` setting does (experts e4m3 with a scale per row, read weight-only by the pair kernels;
attention and the dense layer e4m3 on FP8 tensor cores): both rooflines then count the bytes
the fast engine holds (one per e4m3 weight, their scales, the router in fp32, the LM head in
bf16), taken from its own tensors.

    PYTHONPATH=handler python benchmarks/decode/bench_moe.py --out benchmarks/decode/hy-mt2-30b-a3b
    PYTHONPATH=handler python benchmarks/decode/bench_moe.py --quantize fp8 \
        --batches 1 8 64 128 --out benchmarks/decode/hy-mt2-30b-a3b-fp8
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from bench_decode import (
    _ids,
    copy_bandwidth,
    fast_runner,
    graph_step_ms,
    kernel_times,
    measure,
    prompts,
)

from hymt_serve.engine.runners.build import KV_CACHE_SHARE, build_fast_runner
from hymt_serve.engine.scheduler.loop import Scheduler
from hymt_serve.ops.tiny_moe import HY_MT2_30B_SHAPE, random_30b_a3b_model

SHAPE = HY_MT2_30B_SHAPE
KV_BYTES_PER_TOKEN = (
    SHAPE["num_hidden_layers"] * SHAPE["num_key_value_heads"] * SHAPE["head_dim"] * 2 * 2
)


def weight_plan(fast: Any) -> dict[str, float]:
    """Bytes of the routed experts (per layer and expert too) and of everything else a step
    reads (the embedding table excluded: a step reads one row of it per token), from the fast
    engine's own tensors: what it holds, bf16 or e4m3 with their scales."""
    experts = SHAPE["num_experts"]
    routed = other = 0
    sparse = 0
    for layer in fast.weights.layers:
        for name, tensor in layer._asdict().items():
            size = tensor.numel() * tensor.element_size()
            if name.startswith("experts_"):  # routed rows first, the stacked shared expert last
                part = size * experts // tensor.shape[0]
                routed, other = routed + part, other + size - part
            else:
                other += size
        sparse += hasattr(layer, "router")
    head = fast.weights.lm_head
    other += head.numel() * head.element_size() + fast.weights.final_norm.numel() * 2
    return {
        "routed_bytes": routed,
        "other_bytes": other,
        "expert_bytes": routed / max(sparse * experts, 1),
        "sparse_layers": sparse,
    }


def rooflines(
    plan: dict[str, float], batch: int, context: float, bandwidth: float
) -> dict[str, float]:
    experts, k = SHAPE["num_experts"], SHAPE["num_experts_per_tok"]
    touched = experts * (1 - (1 - k / experts) ** batch)
    active = plan["other_bytes"] + plan["sparse_layers"] * touched * plan["expert_bytes"]
    kv = batch * context * KV_BYTES_PER_TOKEN
    return {
        "experts_per_layer": round(touched, 1),
        "roofline_ms": round((active + kv) / bandwidth * 1e3, 3),
        "all_experts_roofline_ms": round(
            (plan["other_bytes"] + plan["routed_bytes"] + kv) / bandwidth * 1e3, 3
        ),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Decode on Hy-MT2-30B-A3B's shape, {report['quantize']}, {report['gpu']}",
        "",
        f"{report['date']}; `{report['command']}`; torch {report['torch']}; copy bandwidth "
        f"{report['bandwidth_tb_s']} TB/s; weights {report['weight_gb']} GB as the engine holds "
        f"them ({report['quantize']}); "
        f"prompt {report['prompt_tokens']} tokens.",
        "",
        "| batch | ms/step | graph ms/step | roofline ms (active) | x roofline | "
        "all-experts roofline ms | experts/layer | tokens/s | ttft ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["rows"]:
        ratio = row["ms_per_step"] / row["roofline_ms"]
        lines.append(
            f"| {row['batch_size']} | {row['ms_per_step']} | {row['graph_ms_per_step']} | "
            f"{row['roofline_ms']} | {ratio:.2f} | {row['all_experts_roofline_ms']} | "
            f"{row['experts_per_layer']} | {row['output_tokens_per_s']} | {row['ttft_ms']} |"
        )
    memory = report["memory_plan"]
    lines += [
        "",
        f"Ready in {report['ready_s']} s ({report['timings']}).",
        "",
        f"Memory plan on this card: {memory['weights_gb']} GB of weights; "
        f"{memory['kv_bytes_per_token']} bytes of KV cache per token; "
        f"{memory['kv_tokens_that_fit']:,} KV tokens fit in {KV_CACHE_SHARE:.0%} of the "
        f"{memory['free_gb_after_weights']} GB left ({memory['slots_at_2048']} rows of 2,048 "
        "tokens).",
        "",
        "Costliest kernels of one eager step:",
        "",
    ]
    for bucket, kernels in report["kernel_times"].items():
        lines += [f"batch {bucket}:", "", "| kernel | ms | calls |", "| --- | --- | --- |"]
        lines += [f"| `{k['kernel']}` | {k['ms']} | {k['calls']} |" for k in kernels]
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    batches = [r["batch_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(batches, [r["ms_per_step"] for r in rows], "o-", label="fast engine")
    ax.plot(batches, [r["roofline_ms"] for r in rows], "--", label="roofline (experts chosen)")
    ax.plot(batches, [r["all_experts_roofline_ms"] for r in rows], ":", label="all experts")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"Hy-MT2-30B-A3B shape, {report['quantize']}, {report['gpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (a probe)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--quantize", choices=["none", "fp8"], default="none", help="quantize at load"
    )
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    torch.cuda.empty_cache()  # (its 8 GiB of buffers would stay reserved beside 60 GB)
    started = time.perf_counter()
    model = random_30b_a3b_model("cuda", layers=args.layers)
    built_s = time.perf_counter() - started
    # graph_step_ms reads 100 cached positions
    max_seq_len = max(args.prompt_tokens + args.new_tokens, 128)
    torch.cuda.empty_cache()
    start = time.perf_counter()
    fast = build_fast_runner(
        model,
        max_batch_size=max(args.batches),
        max_seq_len=max_seq_len,
        compile_model=not args.no_compile,
        quantize=args.quantize,
    )
    ready_s = time.perf_counter() - start
    print(f"ready in {ready_s:.1f} s: {fast.describe()}", flush=True)
    plan = weight_plan(fast)
    weight_bytes = plan["routed_bytes"] + plan["other_bytes"]
    weight_bytes += fast.weights.embed.numel() * fast.weights.embed.element_size()
    torch.cuda.empty_cache()
    # free memory with the weights held, the KV cache the runner sized given back
    free_after_weights = torch.cuda.mem_get_info()[0] + fast.describe()["kv_cache_gb"] * 1e9
    scheduler = Scheduler(fast, (), _ids, max_seq_len=max_seq_len)
    rows = []
    for batch in args.batches:
        row = measure(
            fast_runner(scheduler, prompts(batch, args.prompt_tokens)), batch, args.new_tokens
        )
        row.update(rooflines(plan, batch, args.prompt_tokens + args.new_tokens / 2, bandwidth))
        row["graph_ms_per_step"] = round(graph_step_ms(fast, batch), 3)
        rows.append(row)
        print(row, flush=True)
    kv_tokens = int(free_after_weights * KV_CACHE_SHARE) // KV_BYTES_PER_TOKEN
    plan_summary = {k: round(v / 1e9, 3) if k.endswith("bytes") else v for k, v in plan.items()}
    report = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "quantize": "bf16" if args.quantize == "none" else args.quantize,
        "torch": torch.__version__,
        "prompt_tokens": args.prompt_tokens,
        "bandwidth_tb_s": round(bandwidth / 1e12, 3),
        "weight_gb": round(weight_bytes / 1e9, 2),
        "random_build_s": round(built_s, 1),
        "ready_s": round(ready_s, 1),
        "timings": {k: round(v, 1) for k, v in fast.timings.items()},
        "memory_plan": {
            "weights_gb": round(weight_bytes / 1e9, 2),
            "free_gb_after_weights": round(free_after_weights / 1e9, 1),
            "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
            "kv_tokens_that_fit": int(kv_tokens),
            "slots_at_2048": kv_tokens // 2048,
        },
        "fast_engine": fast.describe(),
        "weight_plan_gb": plan_summary,
        "kernel_times": {
            b: kernel_times(fast, fast.bucket_for(b)) for b in (1, 64) if b <= max(args.batches)
        },
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "results.md").write_text(markdown(report))
    plot(report, args.out / "decode.png")
    print(markdown(report))


if __name__ == "__main__":
    main()
