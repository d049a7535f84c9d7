"""Scheduler variants of one fast engine side by side: the sentence mix in a closed loop, the
variants taking turns level after level, so that they share the engine, its graphs and the
machine's state of the moment.

A program, not a test. It builds the engine as ``bench_engine.py`` does (the 7B-shaped
random-weight model on the GPU) and, per round, measures each variant once at each user count
with ``bench_engine.measure``. A variant is a name of the form ``buckets=a,b+lookahead=n``:

- ``buckets=``: decode buckets the engine may *not* use (their graphs stay captured but the
  batch pads past them), e.g. ``buckets=-160,-224`` is the engine without those two sizes;
- ``lookahead=n``: the scheduler's ``LOOKAHEAD`` (decode steps the host queues past a pending
  read-back; a finished row runs up to that many steps past its end);
- ``retire=0``: rows at their length stay in the batch until the read-back that delivers them
  arrives (the scheduler before ``Scheduler._retire``).

``base`` is the engine as built. Writes ``engine_ab.json`` (every measurement) and
``engine_ab.md`` (medians per variant and user count, and each variant's ratio to the first).

    PYTHONPATH=handler python benchmarks/serving/engine_ab.py --tokenizer TOKDIR --out DIR \
        --slots 256 --users 64,256 --variants base lookahead=1 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

import hymt_serve.engine.scheduler.loop as scheduler_module
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationResult
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.scheduler.loop import Scheduler
from hymt_serve.ops.tiny_model import default_tokenizer_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import (
    STOP_ID,
    ProfiledBatcher,
    build,
    measure,
    most_sampled,
    sentence_rows,
)
from flops import bf16_matmul_rate, utilisation


def parse_variant(name: str) -> dict[str, Any]:
    """``base`` or ``key=value`` parts joined by ``+`` (keys: buckets, lookahead, retire)."""
    variant: dict[str, Any] = {"name": name, "drop": set(), "lookahead": None, "retire": True}
    if name == "base":
        return variant
    for part in name.split("+"):
        key, _, value = part.partition("=")
        if key == "buckets":
            variant["drop"] = {int(v.removeprefix("-")) for v in value.split(",") if v}
        elif key == "lookahead":
            variant["lookahead"] = int(value)
        elif key == "retire" and value in ("0", "1"):
            variant["retire"] = value == "1"
        else:
            raise SystemExit(
                f"unknown variant part {part!r} (buckets=-a,-b, lookahead=n or retire=0|1)"
            )
    return variant


def apply(fast: FastRunner, all_buckets: tuple[int, ...], variant: dict[str, Any]) -> None:
    dropped = variant["drop"]
    if fast.max_batch_size in dropped:
        raise SystemExit("the largest bucket (the slot count) cannot be dropped")
    fast.buckets = tuple(b for b in all_buckets if b not in dropped)
    scheduler_module.LOOKAHEAD = variant["lookahead"] or DEFAULT_LOOKAHEAD
    Scheduler._retire = RETIRE if variant["retire"] else keep_rows_at_length  # type: ignore[method-assign]


def keep_rows_at_length(self: Scheduler) -> None:
    """``retire=0``: rows at their length stay in the batch until their read-back arrives."""


DEFAULT_LOOKAHEAD = scheduler_module.LOOKAHEAD
RETIRE = Scheduler._retire


def markdown(results: list[dict[str, Any]], names: list[str], users: list[int]) -> str:
    lines = [
        "| users | variant | req/s (median) | x first | p50 ms | rows/step | steps/s | runs |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for count in users:
        first = None
        for name in names:
            rows = [r for r in results if r["variant"] == name and r["users"] == count]
            rate = statistics.median(r["requests_per_s"] for r in rows)
            first = first or rate
            runs = ", ".join(f"{r['requests_per_s']:.1f}" for r in rows)
            p50 = statistics.median(r["p50_ms"] for r in rows)
            per_step = statistics.median(r["rows_per_step"] for r in rows)
            steps = statistics.median(r["steps_per_s"] for r in rows)
            lines.append(
                f"| {count} | {name} | {rate:.1f} | {rate / first:.3f} | {p50:.1f} | "
                f"{per_step:.1f} | {steps:.1f} | {runs} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU (smoke test)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hymt-engine-ab"))
    parser.add_argument("--users", type=lambda s: [int(x) for x in s.split(",")], default=[256])
    parser.add_argument("--variants", nargs="+", default=["base"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=1536)
    parser.add_argument("--cap", type=int, default=512)
    parser.add_argument("--stop", choices=("eos", "sampled"), default="eos")
    args = parser.parse_args()
    args.tokenizer = args.tokenizer or default_tokenizer_dir()
    # What build() reads, as bench_engine's defaults have them.
    args.prefix_entries = Settings.prefix_cache_entries
    args.mixed_tokens = [Settings.mixed_step_tokens]
    args.quantization, args.quantize_head = "none", False
    if args.tiny:
        args.slots, args.max_seq_len, args.cap = min(args.slots, 16), 256, 16
    variants = [parse_variant(name) for name in args.variants]
    fast, tokenizer, flops = build(args)
    all_buckets = fast.buckets
    rate = None if args.tiny else bf16_matmul_rate()
    rows = sentence_rows(tokenizer, args.cap)
    rows = [r for r in rows if len(r.prompt_ids) + r.max_new_tokens <= args.max_seq_len]
    stops = [STOP_ID]

    def scheduler() -> ProfiledBatcher:
        batcher = ProfiledBatcher(
            fast,
            stops,
            lambda tokens, finish: GenerationResult("", tuple(tokens), finish),
            max_seq_len=args.max_seq_len,
        )
        batcher.start()
        measure(batcher, rows, min(args.users), 2.0)  # warm-up
        return batcher

    if args.stop == "sampled":
        stops.append(most_sampled(scheduler(), rows))
    results = []
    for round_ in range(args.rounds):
        for count in args.users:
            for variant in variants:
                apply(fast, all_buckets, variant)
                batcher = scheduler()
                row = {"variant": variant["name"], "round": round_}
                row.update(measure(batcher, rows, count, args.duration))
                row.update(utilisation(row, flops, rate))
                print(json.dumps(row), flush=True)
                results.append(row)
                batcher.close()
    apply(fast, all_buckets, variants[0])
    args.out.mkdir(parents=True, exist_ok=True)
    names = [v["name"] for v in variants]
    report = {
        "device": torch.cuda.get_device_name(0) if not args.tiny else "CPU",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "buckets": list(all_buckets),
        "stop_id": stops[-1],
        "rows": results,
    }
    (args.out / "engine_ab.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(results, names, args.users)
    (args.out / "engine_ab.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
