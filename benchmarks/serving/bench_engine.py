"""The engine's scheduler alone: its speed without TorchServe, HTTP or a load generator.

A program, not a test. It builds the fast engine (the 7B-shaped random-weight model on the GPU,
or ``--tiny`` on the CPU), tokenises the load test's sentence mix with the real chat template
and the 1.2 x source-tokens length rule of ``loadtest/serving/run_bench.py``, and drives the
production scheduler (on its serving thread, as in async mode) in a closed loop: each simulated
user submits its next text from the previous one's completion callback, so no client thread
competes with the engine for the GIL. Per user count it reports requests/s, prompt and output
tokens/s, model FLOP utilisation (``loadtest/serving/flops.py``), latency, decode steps/s, rows
per step, texts per prefill and the engine thread's host seconds per wall second in admitting
(prefill), stepping and reading back.
``--admit-wait-ms``/``--admit-rows`` sweep the admission policy between steps;
``--mixed-tokens 256,0`` runs mixed steps (prompt chunks in the decode step, the
``mixed_step_tokens`` setting) and prefills between steps side by side, alternating per level
over one engine. Random weights never sample EOS, so every row runs to its length, which the
scheduler knows in advance; ``--stop sampled`` makes rows end the way a real model's do, at a
token they sample: the one sampled most often in a first pass over the mix (``stop_id``,
``output_tokens_per_request`` and ``stopped_requests`` in the report). Writes ``engine.json``
and ``engine.md`` to ``--out``. ``--profile-users N`` adds a profiled window at N users per
``--mixed-tokens`` value (in ``profile-mixed-M/``): the engine thread under cProfile (where its
host time goes, ``profile_host.txt``) and the GPU under torch.profiler (kernel time per wall
second and the top kernels, ``profile_gpu.txt``).

    PYTHONPATH=handler python benchmarks/serving/bench_engine.py --tokenizer TOKDIR --out DIR
    PYTHONPATH=handler python benchmarks/serving/bench_engine.py --tiny --out DIR
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import pstats
import random
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hymt_serve.core.config import Scheduler as SchedulerConfig
from hymt_serve.core.types import GenerationResult, GenerationRow
from hymt_serve.engine.codec import encode_user_turn
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.scheduler.loop import ADMIT_ROWS, ADMIT_WAIT_S, Scheduler
from hymt_serve.ops.tiny_model import (
    build_tiny_model,
    default_tokenizer_dir,
    random_7b_model,
)
from hymt_serve.ops.tiny_moe import random_30b_a3b_model
from hymt_serve.request.languages import lookup
from hymt_serve.request.prompts import build_prompt

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "loadtest/serving"))
from flops import bf16_matmul_rate, flops_per_token, utilisation  # noqa: E402
from run_bench import length_rule_jobs, long_jobs  # noqa: E402

STOP_ID = 127960


def sentence_rows(tokenizer: Any, cap: int, workload: str = "sentences") -> list[GenerationRow]:
    """The serving benchmark's jobs (``run_bench.length_rule_jobs``, or ``long_jobs`` for the
    long-input workload), templated and tokenised."""
    jobs = long_jobs(tokenizer, cap) if workload == "long" else length_rule_jobs(tokenizer, cap)
    rows = []
    for item, new in jobs:
        source, target = lookup(item["source_lang"]), lookup(item["target_lang"])
        assert target is not None, item["target_lang"]
        prompt, _ = build_prompt(item["text"], source, target)
        rows.append(GenerationRow(tuple(encode_user_turn(tokenizer, prompt)), new))
    return rows


def build(args: argparse.Namespace) -> tuple[FastRunner, Any, float]:
    """The fast engine, the tokenizer and the model's FLOPs per token."""
    if args.tiny:
        folder = build_tiny_model(args.work / "tiny-model", args.tokenizer)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
    elif args.model == "hy-mt2-30b-a3b":
        model = random_30b_a3b_model("cuda")
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        model = random_7b_model("cuda")
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    flops = flops_per_token(model.config.to_dict())
    fast = build_fast_runner(
        model,
        max_batch_size=args.slots,
        max_seq_len=args.max_seq_len,
        prefix_entries=args.prefix_entries,
        mixed_tokens=max(args.mixed_tokens),
        quantize=args.quantization,
        quantize_head=args.quantize_head,
    )
    return fast, tokenizer, flops


class ClosedLoop:
    """``users`` simulated users, each submitting its next text when the last one finishes."""

    def __init__(self, batcher: Scheduler, rows: list[GenerationRow], users: int) -> None:
        self.batcher, self.rows = batcher, rows
        self.rng = random.Random(users)
        self.latencies: list[float] = []
        self.tokens = 0
        self.prompt_tokens = 0
        self.stopped = 0  # rows a stop token ended (the rest ran to their length)
        self.errors = 0
        self.running = True
        self.in_flight = users
        self.drained = threading.Event()
        self.lock = threading.Lock()
        for _ in range(users):
            self._submit()

    def _submit(self) -> None:
        row = self.rng.choice(self.rows)
        started = time.perf_counter()
        future = self.batcher.submit(row)
        future.add_done_callback(lambda f: self._done(f, started, len(row.prompt_ids)))

    def _done(self, future: Future[GenerationResult], started: float, prompt: int) -> None:
        with self.lock:
            if future.exception() is None:
                self.latencies.append(time.perf_counter() - started)
                self.tokens += future.result().output_tokens
                self.prompt_tokens += prompt
                self.stopped += future.result().finish_reason == "stop"
            else:
                self.errors += 1
            if not self.running:
                self.in_flight -= 1
                if self.in_flight == 0:
                    self.drained.set()
                return
        self._submit()


class ProfiledBatcher(Scheduler):
    """The scheduler with a switch for cProfile on its own thread (cProfile only
    follows the thread that enables it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.want_profile = False
        self.profile: cProfile.Profile | None = None
        self.profile_done = threading.Event()

    def step(self, *, block: bool = False) -> bool:
        if self.want_profile and self.profile is None:
            self.profile = cProfile.Profile()
            self.profile.enable()
        elif not self.want_profile and self.profile is not None and not self.profile_done.is_set():
            self.profile.disable()
            self.profile_done.set()
        return super().step(block=block)


def profile_window(
    batcher: ProfiledBatcher, rows: list[GenerationRow], users: int, seconds: float, out: Path
) -> dict[str, Any]:
    """``seconds`` at ``users`` users with the engine thread under cProfile and the GPU under
    torch.profiler; writes profile_host.txt and profile_gpu.txt, returns the summary."""
    from torch.profiler import ProfilerActivity, profile

    loop = ClosedLoop(batcher, rows, users)
    time.sleep(2.0)  # reach the steady state first
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    batcher.want_profile = True  # first the engine thread alone under cProfile ...
    time.sleep(seconds)
    batcher.want_profile = False
    batcher.profile_done.wait(60)
    started = time.perf_counter()  # ... then the GPU under torch.profiler
    with profile(activities=activities) as prof:
        time.sleep(seconds)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    with loop.lock:
        loop.running = False
    loop.drained.wait(600)
    text = io.StringIO()
    assert batcher.profile is not None
    stats = pstats.Stats(batcher.profile, stream=text)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(45)
    (out / "profile_host.txt").write_text(text.getvalue())
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events)
    gpu_busy = kernel_us / 1e6 / elapsed
    table = events.table(sort_by="self_device_time_total", row_limit=40)
    table += "\n" + events.table(sort_by="self_cpu_time_total", row_limit=40)
    (out / "profile_gpu.txt").write_text(
        f"{users} users, {elapsed:.2f} s, GPU kernel time per wall second {gpu_busy:.3f}\n\n"
        + table
    )
    return {"users": users, "seconds": round(elapsed, 2), "gpu_kernel_share": round(gpu_busy, 3)}


def most_sampled(batcher: Scheduler, rows: list[GenerationRow]) -> int:
    """The token sampled most often over every row of the mix, once each (closes
    ``batcher``)."""
    futures = [batcher.submit(row) for row in rows]
    batcher.run(futures)
    batcher.close()
    counts = Counter(token for future in futures for token in future.result().token_ids)
    return counts.most_common(1)[0][0]


def measure(
    batcher: Scheduler, rows: list[GenerationRow], users: int, duration: float
) -> dict[str, Any]:
    before = dict(batcher.stats)
    loop = ClosedLoop(batcher, rows, users)
    started = time.perf_counter()
    time.sleep(duration)
    with loop.lock:
        loop.running = False
        done, tokens, latencies = len(loop.latencies), loop.tokens, sorted(loop.latencies)
        prompt_tokens, stopped = loop.prompt_tokens, loop.stopped
        stats = {k: batcher.stats[k] - before.get(k, 0) for k in batcher.stats}
    elapsed = time.perf_counter() - started
    loop.drained.wait(600)
    steps = stats["steps"] or 1
    return {
        "users": users,
        "requests_per_s": round(done / elapsed, 2),
        "prompt_tokens_per_s": round(prompt_tokens / elapsed, 1),
        "output_tokens_per_s": round(tokens / elapsed, 1),
        "output_tokens_per_request": round(tokens / done, 1) if done else None,
        "stopped_requests": stopped,
        "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1)
        if latencies
        else None,
        "errors": loop.errors,
        "steps_per_s": round(stats["steps"] / elapsed, 1),
        "readback_waits_per_s": round(stats["readback_waits"] / elapsed, 1),
        "rows_per_step": round(stats["row_steps"] / steps, 1),
        "texts_per_prefill": round(stats["prefill_rows"] / max(1, stats["prefills"]), 1),
        "prefills_per_s": round(stats["prefills"] / elapsed, 1),
        "admit_host_share": round(stats["admit_s"] / elapsed, 3),
        "prefill_host_share": round(stats["prefill_s"] / elapsed, 3),
        "step_host_share": round(stats["step_s"] / elapsed, 3),
        "sync_host_share": round(stats["sync_s"] / elapsed, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU (smoke test)")
    parser.add_argument(
        "--model",
        choices=("hunyuan-mt-7b", "hy-mt2-30b-a3b"),
        default="hunyuan-mt-7b",
        help="the random-weight shape on the GPU: the 7B, or Hy-MT2-30B-A3B's mixture",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/hymt-bench-engine"))
    parser.add_argument("--users", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--slots", type=int, default=128)
    parser.add_argument("--max-seq-len", type=int, default=1536)
    parser.add_argument("--cap", type=int, default=512)
    parser.add_argument("--admit-rows", type=int, default=ADMIT_ROWS)
    parser.add_argument("--admit-wait-ms", type=float, default=ADMIT_WAIT_S * 1000)
    parser.add_argument("--workload", choices=("sentences", "long"), default="sentences")
    parser.add_argument(
        "--prefix-entries",
        type=int,
        default=SchedulerConfig.prefix_cache_entries,
        help="prompt prefixes kept for reuse (the prefix_cache_entries setting; 0: off)",
    )
    parser.add_argument(
        "--mixed-tokens",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[SchedulerConfig.mixed_step_tokens],
        help="prompt tokens per mixed step, one or more (0: prefills between steps)",
    )
    parser.add_argument(
        "--quantization",
        choices=("none", "fp8", "int8"),
        default="none",
        help="quantize the projections at load (the quantization setting)",
    )
    parser.add_argument(
        "--quantize-head", action="store_true", help="the LM head too (quantize_lm_head)"
    )
    parser.add_argument(
        "--stop",
        choices=("eos", "sampled"),
        default="eos",
        help="stop at the model's EOS (never sampled by random weights: rows end at their "
        "length) or also at the token a first pass samples most often",
    )
    parser.add_argument("--profile-users", type=int, default=0, help="0: no profiled window")
    parser.add_argument("--profile-s", type=float, default=3.0)
    args = parser.parse_args()
    args.tokenizer = args.tokenizer or default_tokenizer_dir()
    if args.tiny:
        args.slots, args.max_seq_len, args.cap = min(args.slots, 16), 256, 16
    users = args.users or ([1, 4, 16] if args.tiny else [1, 8, 32, 64, 128])
    fast, tokenizer, flops = build(args)
    rate = None if args.tiny else bf16_matmul_rate()
    rows = sentence_rows(tokenizer, args.cap, args.workload)
    if args.model == "hy-mt2-30b-a3b":
        # Its own tokenizer is not at hand: the 7B family's stands in (a sentence's token
        # count is what the engine's work depends on), its ids folded into the vocabulary.
        vocab = fast.shape.vocab
        rows = [replace(r, prompt_ids=tuple(i % vocab for i in r.prompt_ids)) for r in rows]
    rows = [r for r in rows if r.max_new_tokens < args.max_seq_len]
    rows = [r for r in rows if len(r.prompt_ids) + r.max_new_tokens <= args.max_seq_len]

    stops = [STOP_ID]

    def scheduler(mixed: int) -> ProfiledBatcher:
        fast.mixed_tokens = mixed
        batcher = ProfiledBatcher(
            fast,
            stops,
            lambda tokens, finish: GenerationResult("", tuple(tokens), finish),
            max_seq_len=args.max_seq_len,
            admit_rows=args.admit_rows,
            admit_wait_s=args.admit_wait_ms / 1000,
        )
        batcher.start()
        measure(batcher, rows, min(users), 2.0)  # warm-up: first prefill shapes, allocator
        return batcher

    if args.stop == "sampled":
        stops.append(most_sampled(scheduler(args.mixed_tokens[0]), rows))
        print(json.dumps({"stop_id": stops[-1]}), flush=True)
    results = []
    for count in users:
        for mixed in args.mixed_tokens:
            batcher = scheduler(mixed)
            results.append({"mixed_tokens": mixed, **measure(batcher, rows, count, args.duration)})
            results[-1].update(utilisation(results[-1], flops, rate))
            print(json.dumps(results[-1]), flush=True)
            batcher.close()
    args.out.mkdir(parents=True, exist_ok=True)
    profiled = []
    for mixed in args.mixed_tokens if args.profile_users else []:
        batcher = scheduler(mixed)
        folder = args.out / f"profile-mixed-{mixed}"
        folder.mkdir(exist_ok=True)
        window = profile_window(batcher, rows, args.profile_users, args.profile_s, folder)
        profiled.append({"mixed_tokens": mixed, **window})
        print(json.dumps({"profile": profiled[-1]}), flush=True)
        batcher.close()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.tiny else "CPU"
    report = {
        "device": device,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "texts": len(rows),
        "stop_id": stops[-1],
        "model_flops_per_token": flops,
        "bf16_matmul_tflops": None if rate is None else round(rate / 1e12, 1),
        "rows": results,
        "profile": profiled,
        "engine": fast.describe(),
        "dynamo_counters": {k: dict(v) for k, v in torch._dynamo.utils.counters.items()},
    }
    (args.out / "engine.json").write_text(json.dumps(report, indent=2) + "\n")
    columns = list(results[0])
    table = ["| " + " | ".join(columns) + " |", "|" + " ---: |" * len(columns)]
    table += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in results]
    (args.out / "engine.md").write_text(
        f"# Engine alone (scheduler + fast runner): {device}, {report['date']}\n\n"
        f"workload {args.workload}, quantization {args.quantization}"
        f"{' + head' if args.quantize_head else ''}, prefix entries {args.prefix_entries}, "
        "mixed_tokens "
        f"{args.mixed_tokens} (0: prefills between steps, admit_rows "
        f"{args.admit_rows}, admit_wait_ms {args.admit_wait_ms}), slots {args.slots}, "
        f"{len(rows)} texts, {args.duration:.0f} s per level. model_tflops: (prompt + output "
        f"tokens/s) x {flops / 1e9:.2f} GFLOP per token; mfu_pct: that over the bf16 matrix "
        f"rate measured here ({report['bf16_matmul_tflops']} TFLOP/s)\n\n" + "\n".join(table) + "\n"
    )


if __name__ == "__main__":
    main()
