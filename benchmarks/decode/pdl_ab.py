"""The decode step with and without programmatic dependent launch (``hymt_serve.engine.pdl``),
side by side in one process on a 7B-shaped random-weight model.

For each weight form, two engines are loaded from the same checkpoint as the server loads it,
one built with ``HYMT_PDL=0`` and one with PDL on. Both generate the same greedy tokens for the
same prompts (checked: PDL changes when kernels start, never what they compute). Then the
replay time of each one's captured step is taken in turns (off, on, off, on, ...) for each
batch, and the medians and their ratio are written as JSON and Markdown.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/pdl_ab.py --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from bench_decode import _ids, build_model, graph_step_ms, prompts

from hymt_serve.engine import pdl
from hymt_serve.engine.fast import build_fast_runner
from hymt_serve.engine.loading import load_model
from hymt_serve.engine.runner import FastRunner
from hymt_serve.engine.scheduler import Scheduler
from hymt_serve.engine.types import GenerationRow
from hymt_serve.request.settings import Settings

FORMS = ("none", "int4+head", "int8+head", "fp8", "int4", "int8")


def engine(checkpoint: Path, form: str, pdl_on: bool, batch: int, length: int) -> FastRunner:
    """The fast engine over ``checkpoint`` in ``form`` (as bench_decode's loaded rows)."""
    os.environ[pdl.ENV] = "1" if pdl_on else "0"
    quantization, _, head = form.partition("+")
    settings = {
        "model_path": str(checkpoint),
        "quantization": quantization,
        "quantize_lm_head": head == "head",
        "max_input_tokens": 40,
        "max_new_tokens": length - 40,
    }
    loaded = load_model(Settings.from_mapping(settings, environ={}))
    runner = build_fast_runner(
        loaded.model,
        max_batch_size=batch,
        max_seq_len=length,
        quantize=loaded.plan.quantization,
        fp8_scales=loaded.fp8_scales,
        int4=loaded.int4,
        quantize_head=head == "head",
    )
    return runner


def greedy(runner: FastRunner, length: int) -> list[tuple[int, ...]]:
    scheduler = Scheduler(runner, (), _ids, max_seq_len=length)
    futures = [scheduler.submit(GenerationRow(p, 32)) for p in prompts(4, 40)]
    scheduler.run(futures)
    return [future.result().token_ids for future in futures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=["none", "int4+head"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/hymt-7b-random"))
    args = parser.parse_args()
    length = 40 + 128
    if not (args.checkpoint / "config.json").is_file():
        model = build_model()
        model.save_pretrained(args.checkpoint)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    rows: list[dict[str, Any]] = []
    for form in args.forms:
        pair = {on: engine(args.checkpoint, form, on, max(args.batches), length) for on in (0, 1)}
        same = greedy(pair[0], length) == greedy(pair[1], length)
        print(f"{form}: same greedy tokens with and without PDL: {same}", flush=True)
        for batch in args.batches:
            times: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(args.turns):
                for on in (0, 1):
                    times[on].append(graph_step_ms(pair[on], batch))
            off, on = statistics.median(times[0]), statistics.median(times[1])
            rows.append(
                {"form": form, "batch": batch, "off_ms": round(off, 4), "on_ms": round(on, 4),
                 "off_over_on": round(off / on, 3), "same_tokens": same,
                 "turns": {"off": times[0], "on": times[1]}}
            )  # fmt: skip
            print({k: v for k, v in rows[-1].items() if k != "turns"}, flush=True)
        del pair
        gc.collect()
        torch.cuda.empty_cache()
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pdl_ab.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Decode step with and without PDL: {report['gpu']}, torch {report['torch']}",
        "",
        f"`{report['command']}`",
        "",
        f"Replays of the captured step, median of {args.turns} turns each (taken alternately).",
        "",
        "| form | batch | PDL off ms | PDL on ms | off / on | same greedy tokens |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [
        f"| {r['form']} | {r['batch']} | {r['off_ms']} | {r['on_ms']} | {r['off_over_on']} | "
        f"{r['same_tokens']} |"
        for r in rows
    ]
    (args.out / "pdl_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
