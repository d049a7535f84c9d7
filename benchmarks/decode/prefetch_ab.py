"""The decode step with the weight kernels' L2 prefetch off and at several sizes, side by side
in one process on a 7B-shaped random-weight model.

Each weight kernel of the step (the weight-only kernels, and bf16's one-row kernel) can ask the
first bytes of the next product's weight into L2 once its programs are done
(``weight_only.set_l2_prefetch``), so that the memory keeps loading weights while the step's
small kernels (norms, RoPE, attention, the SiLU product) run. For each weight form, one engine
per variant is loaded from the same checkpoint as the server loads it; all must give the same
greedy tokens (the prefetch changes where bytes wait, never what is computed). Then the replay
time of each engine's captured step is taken in turns for each batch, and the medians and
their ratios to the variant without prefetch are written as JSON and Markdown (after each
form, so a run cut short keeps what it measured).

A variant is ``MB`` (lines marked evict_last) or ``MB:normal`` (normal priority); ``0`` is off.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/prefetch_ab.py --out DIR \
        --forms none int4+head int8+head --variants 0 16 32 --batches 1 64
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from bench_decode import _ids, build_model, graph_step_ms, prompts

from hymt_serve.engine import weight_only
from hymt_serve.engine.fast import build_fast_runner
from hymt_serve.engine.loading import load_model
from hymt_serve.engine.runner import FastRunner
from hymt_serve.engine.scheduler import Scheduler
from hymt_serve.engine.types import GenerationRow
from hymt_serve.request.settings import Settings

FORMS = ("none", "int4+head", "int8+head", "fp8", "int4", "int8")
PROMPT = 40


def parse_variant(variant: str) -> tuple[int, int]:
    """``"32"`` -> (32 MiB, evict_last), ``"32:normal"`` -> (32 MiB, normal priority)."""
    megabytes, _, mode = variant.partition(":")
    return int(float(megabytes) * 2**20), 2 if mode == "normal" else 1


def engine(checkpoint: Path, form: str, variant: str, batch: int, length: int) -> FastRunner:
    """The fast engine over ``checkpoint`` in ``form``, captured with ``variant``'s prefetch."""
    weight_only.set_l2_prefetch(*parse_variant(variant))
    quantization, _, head = form.partition("+")
    settings = {
        "model_path": str(checkpoint),
        "quantization": quantization,
        "quantize_lm_head": head == "head",
        "max_input_tokens": PROMPT,
        "max_new_tokens": length - PROMPT,
    }
    loaded = load_model(Settings.from_mapping(settings, environ={}))
    return build_fast_runner(
        loaded.model,
        max_batch_size=batch,
        max_seq_len=length,
        quantize=loaded.plan.quantization,
        fp8_scales=loaded.fp8_scales,
        int4=loaded.int4,
        quantize_head=head == "head",
    )


def greedy(runner: FastRunner, length: int) -> list[tuple[int, ...]]:
    scheduler = Scheduler(runner, (), _ids, max_seq_len=length)
    futures = [scheduler.submit(GenerationRow(p, 32)) for p in prompts(4, PROMPT)]
    scheduler.run(futures)
    return [future.result().token_ids for future in futures]


def write(out: Path, report: dict[str, Any], turns: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefetch_ab.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Decode step with the L2 prefetch off and on: {report['gpu']}, torch {report['torch']}",
        "",
        f"`{report['command']}`",
        "",
        f"Replays of the captured step, median of {turns} turns each (taken in turns).",
        "",
        "| form | batch | prefetch | ms | off / this | same greedy tokens |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    lines += [
        f"| {r['form']} | {r['batch']} | {r['variant']} | {r['ms']} | {r['off_over_this']} | "
        f"{r['same_tokens']} |"
        for r in report["rows"]
    ]
    (out / "prefetch_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=["none", "int4+head"])
    parser.add_argument("--variants", nargs="+", default=["0", "16", "32"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/hymt-7b-random"))
    args = parser.parse_args()
    if args.variants[0] != "0":
        parser.error("the first variant is the baseline: 0")
    length = PROMPT + 128
    if not (args.checkpoint / "config.json").is_file():
        model = build_model()
        model.save_pretrained(args.checkpoint)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "rows": [],
    }
    for form in args.forms:
        engines = {
            v: engine(args.checkpoint, form, v, max(args.batches), length) for v in args.variants
        }
        tokens = {v: greedy(runner, length) for v, runner in engines.items()}
        for batch in args.batches:
            times: dict[str, list[float]] = {v: [] for v in args.variants}
            for _ in range(args.turns):
                for variant, runner in engines.items():
                    times[variant].append(graph_step_ms(runner, batch))
            off = statistics.median(times["0"])
            for variant in args.variants:
                ms = statistics.median(times[variant])
                report["rows"].append(
                    {"form": form, "batch": batch, "variant": variant, "ms": round(ms, 4),
                     "off_over_this": round(off / ms, 3),
                     "same_tokens": tokens[variant] == tokens["0"], "turns": times[variant]}
                )  # fmt: skip
        write(args.out, report, args.turns)
        del engines
        gc.collect()
        torch.cuda.empty_cache()
    weight_only.set_l2_prefetch(0)


if __name__ == "__main__":
    main()
