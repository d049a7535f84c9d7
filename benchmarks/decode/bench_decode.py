"""Decode speed of HF ``generate`` and the fast engine on a 7B-shaped random-weight model.

A program, not a test: one run on one GPU builds the real ``hunyuan_v1_dense`` architecture
with random bf16 weights (speed does not depend on weight values), measures the device copy
bandwidth, and for each batch size times HF ``generate`` (eager, dynamic cache), the
production fallback (``hf-runner``: the scheduler over transformers' forward) and the fast
engine as production runs it (the scheduler's decode loop over the fast runner, stepped on the
calling thread as in batch mode), next to the weight+KV read roofline. Random weights never
choose EOS, so output lengths are fixed. ``--fast-quantization`` adds the fast engine loaded
from the saved folder through the server's own loader, as bf16 (``none``), quantized at load
(``fp8``, ``int8``, ``int4``) or as the FP8 checkpoint ``hymt quantize-fp8`` writes from it
(``fp8-checkpoint``), each with its ready time (load + build) and its weights' roofline.
Writes ``results.json``, ``results.md`` and ``decode.png`` to ``--out``.

    PYTHONPATH=handler python benchmarks/decode/bench_decode.py --out benchmarks/decode
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from hymt_serve.core.types import FinishReason, GenerationResult, GenerationRow
from hymt_serve.engine.runners.build import UnsupportedModelError, build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.runners.hf_forward import HFRunner
from hymt_serve.engine.scheduler.loop import Scheduler
from hymt_serve.ops.tiny_model import random_7b_model

KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
FORMS = ("none", "fp8", "int8", "int4", "fp8-checkpoint")
# "+head": the LM head quantized like the projections too (quantize_lm_head)
LOADED = (*FORMS, "fp8+head", "int8+head", "int4+head", "fp8-checkpoint+head")


def build_model() -> PreTrainedModel:
    """The 7B-shaped model with random bf16 weights on the GPU."""
    model: PreTrainedModel = random_7b_model("cuda")
    return model


def copy_bandwidth(gib: int = 4) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    src = torch.randn(gib * 2**28, device="cuda")
    dst = torch.empty_like(src)
    times = [_timed(lambda: dst.copy_(src)) for _ in range(12)][2:]
    return 2 * src.numel() * 4 / sorted(times)[len(times) // 2]


def _timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def prompts(batch: int, length: int) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(batch)
    return [
        tuple(torch.randint(3, 120000, (length,), generator=gen).tolist()) for _ in range(batch)
    ]


def measure(run: Callable[[int], object], batch: int, new_tokens: int) -> dict[str, float]:
    """ttft from a 1-token run; ms/step from the difference between a ``new_tokens`` run and
    one of half as many tokens, so that both hold the same admission of the batch and differ
    by steps of the whole batch only. (The difference to the 1-token run counted the mixed
    steps, where the first rows decode while later ones still prefill, as decode steps.)"""
    run(2)
    ttft = min(_timed(lambda: run(1)) for _ in range(2))
    half = max(2, new_tokens // 2)
    shorter = min(_timed(lambda: run(half)) for _ in range(2))
    torch.cuda.reset_peak_memory_stats()
    total = min(_timed(lambda: run(new_tokens)) for _ in range(2))
    return {
        "batch_size": batch,
        "new_tokens": new_tokens,
        "ms_per_step": round((total - shorter) / (new_tokens - half) * 1e3, 3),
        "output_tokens_per_s": round(batch * new_tokens / total, 1),
        "ttft_ms": round(ttft * 1e3, 2),
        "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
    }


def hf_runner(
    model: PreTrainedModel, batch_prompts: list[tuple[int, ...]]
) -> Callable[[int], object]:
    ids = torch.tensor(batch_prompts, device="cuda")

    def run(new: int) -> object:
        config = GenerationConfig(
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=127961,
        )
        with torch.no_grad():
            return model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=config
            )

    return run


def _ids(tokens: list[int], finish: FinishReason) -> GenerationResult:
    return GenerationResult("", tuple(tokens), finish)


def fast_runner(
    scheduler: Scheduler, batch_prompts: list[tuple[int, ...]]
) -> Callable[[int], object]:
    """Submit the batch's rows and step the scheduler until they are done (no stop tokens)."""

    def run(new: int) -> object:
        futures = [scheduler.submit(GenerationRow(p, new)) for p in batch_prompts]
        scheduler.run(futures)
        return [future.result() for future in futures]

    return run


def fallback_runner(
    model: PreTrainedModel, batch_prompts: list[tuple[int, ...]]
) -> Callable[[int], object]:
    """The production fallback (``engine: hf``, quantized models): the scheduler over
    transformers' forward, one step at a time."""
    runner = HFRunner(model, pad_id=127961, max_batch_size=len(batch_prompts))
    width = len(batch_prompts[0]) + 512
    return fast_runner(Scheduler(runner, (), _ids, max_seq_len=width), batch_prompts)


def graph_step_ms(runner: FastRunner, batch: int) -> float:
    """Pure replay time of the captured step for ``batch``'s bucket (no sampling; every
    position reads 100 cached positions of the scratch slot)."""
    with torch.inference_mode():
        scratch = torch.full((batch,), runner.scratch_slot, device=runner.device)
        runner.load(torch.zeros_like(scratch), torch.full_like(scratch, 100), scratch)
        runner.step()
        try:
            return _timed(lambda: [runner.step() for _ in range(50)]) / 50 * 1e3
        finally:
            runner.clear()


def attention_kernels(runner: FastRunner) -> list[str]:
    """CUDA kernel names seen during one eager decode step that look like attention."""
    with (
        torch.inference_mode(),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof,
    ):
        runner.clear()
        runner._forward(8)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    keys = ("attn", "attention", "flash", "decode", "sdpa", "fmha", "combine")
    return sorted(n for n in names if any(k in n.lower() for k in keys))


def cuda_kernels(fn: Callable[[], object], width: int = 90) -> dict[str, list[float]]:
    """Device time (ms) and launches of each CUDA kernel of one ``fn()`` (run once before,
    to warm up), by name (its first ``width`` characters)."""
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals.setdefault(event.name[:width], [0.0, 0])
            entry[0] += event.device_time_total / 1e3
            entry[1] += 1
    return totals


def kernel_times(runner: FastRunner, bucket: int, top: int = 12) -> list[dict[str, Any]]:
    """The costliest CUDA kernels of one eager decode step (same kernels as the graph), then
    one row for all of them (``"kernel": "all"``: how many launches, their summed time)."""
    with torch.inference_mode():
        runner.clear()
        runner.positions[:bucket] = 100
        totals = cuda_kernels(lambda: runner._forward(bucket))
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    rows = [{"kernel": k, "ms": round(v[0], 3), "calls": int(v[1])} for k, v in ranked]
    every = [sum(v[0] for v in totals.values()), sum(v[1] for v in totals.values())]
    return [*rows, {"kernel": "all", "ms": round(every[0], 3), "calls": int(every[1])}]


def roofline_ms(weight_bytes: int, batch: int, context: float, bandwidth: float) -> float:
    return (weight_bytes + batch * context * KV_BYTES_PER_TOKEN) / bandwidth * 1e3


def quantized_rows(
    path: Path, batches: list[int], prompt_tokens: int, new_tokens: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """HF generate on bitsandbytes int8 and nf4 loads of the saved checkpoint, if importable."""
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError:
        return [], ["not measured: bitsandbytes is not installed on this machine"]
    modes = {
        "hf-int8": BitsAndBytesConfig(load_in_8bit=True),
        "hf-nf4": BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        ),
    }
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for engine, config in modes.items():
        try:
            rows += quantized_engine_rows(engine, config, path, batches, prompt_tokens, new_tokens)
            notes.append(f"{engine}: measured; {rows[-1].pop('note')}")
        except Exception as exc:  # a failed optional measurement is reported, not fatal
            notes.append(f"{engine}: failed: {exc!r:.300}")
        gc.collect()
        torch.cuda.empty_cache()
    return rows, notes


def quantized_engine_rows(
    engine: str, config: Any, path: Path, batches: list[int], prompt_tokens: int, new_tokens: int
) -> list[dict[str, Any]]:
    model = AutoModelForCausalLM.from_pretrained(
        path, quantization_config=config, device_map="cuda", dtype=torch.bfloat16
    ).eval()
    try:
        build_fast_runner(model, max_batch_size=1, max_seq_len=64)
        note = "the fast engine accepted it (unexpected)"
    except UnsupportedModelError as exc:
        note = f"the fast engine refuses it ({exc.reason})"
    rows = []
    for batch in batches:
        row = measure(hf_runner(model, prompts(batch, prompt_tokens)), batch, new_tokens)
        rows.append({"engine": engine, **row, "weights_gb": model.get_memory_footprint() / 1e9})
        print(rows[-1], flush=True)
    rows[-1]["note"] = note
    return rows


def write_outputs(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results.md").write_text(markdown(report))
    plot(report, out / "decode.png")


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Decode benchmark: {report['gpu']}, {report['date']}",
        "",
        f"`{report['command']}`",
        "",
        f"7B-shaped hunyuan_v1_dense, random bf16 weights, prompt {report['prompt_tokens']} "
        "tokens, "
        f"greedy, fixed output length. Copy bandwidth {report['bandwidth_tb_s']} TB/s; roofline "
        f"(weights + KV read once per step) {report['roofline_ms_per_step']} ms/step at batch 1. "
        "ms/step: the difference between a run of the new tokens and one of half as many, over "
        "the steps between them; graph ms/step: replays of the captured step alone.",
        "",
        "| engine | batch | new tokens | ms/step | graph ms/step | roofline ms/step | x roofline "
        "| tokens/s | TTFT ms | peak GPU GB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['engine']} | {r['batch_size']} | {r['new_tokens']} | {r['ms_per_step']} | "
            f"{r.get('graph_ms_per_step', '')} | {r['roofline_ms']} | "
            f"{r['ms_per_step'] / r['roofline_ms']:.2f} | {r['output_tokens_per_s']} | "
            f"{r['ttft_ms']} | {r['peak_gpu_mem_gb']} |"
        )
    lines += [
        "",
        f"Fast engine: `{json.dumps(report['fast_engine'])}`",
        "",
        f"Attention kernels seen in a decode step: {report['attention_kernels']}",
        "",
        f"bitsandbytes int8/nf4 (HF generate): {'; '.join(report['bitsandbytes'])}",
        "",
        *summary(report),
    ]
    for batch, kernels in report.get("kernel_times", {}).items():
        lines += [
            f"Costliest kernels of one eager decode step, batch {batch}:",
            "",
            "| kernel | ms | calls |",
            "| --- | ---: | ---: |",
        ]
        lines += [f"| `{k['kernel']}` | {k['ms']} | {k['calls']} |" for k in kernels] + [""]
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> list[str]:
    """The issue's goals, read off the rows (batch 1 step, batch 64 speed-up, ready time)."""
    by = {(r["engine"], r["batch_size"]): r for r in report["rows"]}
    lines = [f"Ready time (from_model: fuse, compile, capture): {report['ready_s']} s.", ""]
    if ("fast", 1) in by:
        step = by["fast", 1]["ms_per_step"]
        ratio = step / by["fast", 1]["roofline_ms"]
        lines += [f"Batch 1: {step} ms/step = {ratio:.2f} x roofline.", ""]
    if ("fast", 64) in by and ("hf", 64) in by:
        fast, hf = by["fast", 64], by["hf", 64]
        speedup = fast["output_tokens_per_s"] / hf["output_tokens_per_s"]
        step_speedup = hf["ms_per_step"] / fast["ms_per_step"]
        share = fast["output_tokens_per_s"] / (64e3 / fast["roofline_ms"])
        steady = fast["roofline_ms"] / fast["ms_per_step"]
        lines += [
            f"Batch 64: {speedup:.2f} x HF tokens/s end to end ({step_speedup:.2f} x per step); "
            f"{share:.0%} of the roofline rate end to end ({steady:.0%} per step).",
            "",
        ]
    for quantize in LOADED:
        engine_name = "fast-loaded" if quantize == "none" else f"fast-{quantize}"
        for batch in (1, 128):
            if (engine_name, batch) in by and ("fast", batch) in by:
                ours = by[engine_name, batch]["ms_per_step"]
                bf16 = by["fast", batch]["ms_per_step"]
                lines += [
                    f"{quantize} batch {batch}: {ours} ms/step against bf16's {bf16} "
                    f"({bf16 / ours:.2f} x).",
                    "",
                ]
        if quantize in report:
            engine = report[quantize]["fast_engine"]
            lines += [
                f"{quantize} ready time (load + build) {report[quantize]['ready_s']} s; "
                f"weights {engine['weight_bytes'] / 1e9:.2f} GB.",
                "",
            ]
    return lines


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"hf": "o-", "hf-runner": "D-", "fast": "s-", "fast-fp8": "P-", "fast-int8": "X-"}
    styles["hf-int8"] = "v:"
    styles["hf-nf4"] = "^:"
    for engine, style in styles.items():
        rows = [r for r in report["rows"] if r["engine"] == engine]
        if not rows:
            continue
        sizes = [r["batch_size"] for r in rows]
        left.plot(sizes, [r["ms_per_step"] for r in rows], style, label=engine)
        right.plot(sizes, [r["output_tokens_per_s"] for r in rows], style, label=engine)
    rows = [r for r in report["rows"] if r["engine"] == "fast"]
    sizes = [r["batch_size"] for r in rows]
    left.plot(sizes, [r["roofline_ms"] for r in rows], "k--", label="roofline")
    right.plot(
        sizes,
        [b / r["roofline_ms"] * 1e3 for b, r in zip(sizes, rows, strict=True)],
        "k--",
        label="roofline",
    )
    for ax, label in ((left, "ms per decode step"), (right, "output tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"7B-shaped hunyuan_v1_dense decode, bf16, {report['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--fast-new-tokens", type=int, default=128)
    parser.add_argument("--hf-new-tokens", type=int, default=32)
    parser.add_argument("--skip-hf", action="store_true", help="time the fast engine only")
    parser.add_argument("--quantized-batches", type=int, nargs="*", default=[1, 64])
    parser.add_argument("--quantized-new-tokens", type=int, default=16)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/hymt-7b-random"))
    parser.add_argument(
        "--fast-quantization",
        nargs="*",
        choices=LOADED,
        default=[],
        help="also the fast engine loaded from --checkpoint as production loads it: bf16 "
        "(none), quantized at load (fp8, int8, int4), or the FP8 checkpoint that "
        "`hymt quantize-fp8` writes from it (fp8-checkpoint); +head: with the LM head "
        "quantized too (quantize_lm_head)",
    )
    parser.add_argument(
        "--kernels", type=int, default=12, help="kernels listed per profiled decode step"
    )
    return parser.parse_args()


def engine_rows(
    engine: str, runner: Callable[[list[tuple[int, ...]]], Callable[[int], object]],
    args: argparse.Namespace, new_tokens: int, roofline: Callable[[int, float], float],
) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for batch in args.batches:
        row = measure(runner(prompts(batch, args.prompt_tokens)), batch, new_tokens)
        row["roofline_ms"] = round(roofline(batch, args.prompt_tokens + new_tokens / 2), 3)
        rows.append({"engine": engine, **row})
        print(rows[-1], flush=True)
    return rows


def fast_section(
    model: PreTrainedModel,
    args: argparse.Namespace,
    roofline: Callable[[int, float], float] | float,
    name: str = "fast",
    **build: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Build the fast engine over ``model`` (fusing its weights in place; ``build``: how to
    quantize them) and time it. ``roofline`` is a function, or the copy bandwidth (then the
    roofline reads the weights the engine holds)."""
    start = time.perf_counter()
    max_seq_len = args.prompt_tokens + args.fast_new_tokens
    fast = build_fast_runner(
        model, max_batch_size=max(args.batches), max_seq_len=max_seq_len, **build
    )
    ready_s = time.perf_counter() - start
    scheduler = Scheduler(fast, (), _ids, max_seq_len=max_seq_len)
    print(f"{name} ready in {ready_s:.1f} s: {fast.describe()}", flush=True)
    if not callable(roofline):
        held, bandwidth = fast.describe()["weight_bytes"], roofline
        roofline = partial(lambda b, c, n: roofline_ms(n, b, c, bandwidth), n=held)
    rows = engine_rows(name, partial(fast_runner, scheduler), args, args.fast_new_tokens, roofline)
    for row in rows:
        row["graph_ms_per_step"] = round(graph_step_ms(fast, row["batch_size"]), 3)
    info = {
        "ready_s": round(ready_s, 1),
        "fast_engine": {**fast.describe(), "scheduler": scheduler.describe()},
        "attention_kernels": attention_kernels(fast),
        "kernel_times": {
            b: kernel_times(fast, fast.bucket_for(b), args.kernels)
            for b in (1, 64, 128)
            if b <= max(args.batches)
        },
    }
    return rows, info


def loaded_section(
    args: argparse.Namespace, quantize: str, bandwidth: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The fast engine over ``--checkpoint`` (or its FP8 checkpoint) loaded as the server
    loads it; ready time = load + build."""
    from hymt_serve.core.settings import Settings
    from hymt_serve.engine.checkpoints.loading import load_model

    form, _, head = quantize.partition("+")
    path = args.checkpoint
    if form == "fp8-checkpoint":
        path = args.checkpoint.with_name(args.checkpoint.name + "-fp8")
        if not path.is_dir():
            from hymt_serve.ops.quantize import write_fp8_checkpoint

            started = time.perf_counter()
            write_fp8_checkpoint(args.checkpoint, path, device="cuda", prompts=prompts(8, 40))
            print(f"wrote {path} in {time.perf_counter() - started:.1f} s", flush=True)
    settings = {
        "model_path": str(path),
        "quantization": form if form in ("fp8", "int8", "int4") else "none",
        "quantize_lm_head": head == "head",
        "max_input_tokens": args.prompt_tokens,
        "max_new_tokens": args.fast_new_tokens,
    }
    loaded = load_model(Settings.from_mapping(settings, environ={}))
    name = "fast-loaded" if quantize == "none" else f"fast-{quantize}"
    rows, info = fast_section(
        loaded.model,
        args,
        bandwidth,
        name,
        quantize=loaded.plan.quantization,
        fp8_scales=loaded.fp8_scales,
        int4=loaded.int4,
        quantize_head=head == "head",
    )
    info["load_s"] = round(loaded.seconds, 1)
    info["ready_s"] = round(loaded.seconds + info["ready_s"], 1)
    return rows, info


def main() -> None:
    args = parse_args()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    model = build_model()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def roofline(batch: int, context: float) -> float:
        return roofline_ms(weight_bytes, batch, context, bandwidth)

    hf = partial(hf_runner, model)
    rows = [] if args.skip_hf else engine_rows("hf", hf, args, args.hf_new_tokens, roofline)
    if not args.skip_hf:
        fallback = partial(fallback_runner, model)
        rows += engine_rows("hf-runner", fallback, args, args.hf_new_tokens, roofline)
    if args.quantized_batches or args.fast_quantization:
        model.save_pretrained(args.checkpoint)  # before the fast engine fuses weights in place
    torch.cuda.empty_cache()
    fast_rows, fast_info = fast_section(model, args, roofline)
    del model, hf
    gc.collect()
    torch.cuda.empty_cache()
    print(f"GPU memory still allocated: {torch.cuda.memory_allocated() / 1e9:.2f} GB", flush=True)
    quantized_info: dict[str, Any] = {}
    for quantize in args.fast_quantization:
        loaded_rows, quantized_info[quantize] = loaded_section(args, quantize, bandwidth)
        fast_rows += loaded_rows
        gc.collect()
        torch.cuda.empty_cache()
    quantized: list[dict[str, Any]] = []
    notes = ["not measured: no --quantized-batches"]
    if args.quantized_batches:
        quantized, notes = quantized_rows(
            args.checkpoint, args.quantized_batches, args.prompt_tokens, args.quantized_new_tokens
        )
    for row in quantized:
        row["roofline_ms"] = round(roofline(row["batch_size"], args.prompt_tokens), 3)
    report = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "torch": torch.__version__,
        "prompt_tokens": args.prompt_tokens,
        "bandwidth_tb_s": round(bandwidth / 1e12, 3),
        "weight_gb": round(weight_bytes / 1e9, 3),
        "roofline_ms_per_step": round(
            roofline(1, args.prompt_tokens + args.fast_new_tokens / 2), 3
        ),
        **fast_info,
        **quantized_info,
        "bitsandbytes": notes,
        "rows": rows + quantized + fast_rows,
    }
    write_outputs(args.out, report)
    print(markdown(report))


if __name__ == "__main__":
    main()
