"""CPU workers side by side: each engine taking every core against the cores divided among them
(``cpu_threads``), with and without a busy process beside them.

Starts ``--engines`` processes at once, each loading the tiny random-weight model as the CPU
demo does (``engine: hf``, float32) with the given thread count, and times ``--rounds`` batches
of ``--rows`` rows generating ``--tokens`` tokens each (random weights generate to the limit).
Prints a table and writes ``threads.json`` and ``threads.md`` to ``--out``.

    PYTHONPATH=handler python benchmarks/cpu/threads.py --out benchmarks/cpu/results
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _engine_process(
    model_dir: str, threads: int, rows: int, tokens: int, rounds: int, start: Any, out: Any
) -> None:
    from hymt_serve.core.settings import Settings
    from hymt_serve.core.types import GenerationRow
    from hymt_serve.engine.engine import load_engine

    raw = {"model_path": model_dir, "device": "cpu", "dtype": "float32", "engine": "hf"}
    settings = Settings.from_mapping({**raw, "cpu_threads": threads, "max_new_tokens": tokens})
    engine = load_engine(settings)
    ids = tuple(engine.encode_prompt("A sentence to translate, slowly."))
    batch = [GenerationRow(ids, tokens) for _ in range(rows)]
    engine.generate(batch[:1])  # first-call costs out of the timing
    start.wait()
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        results = engine.generate(batch)
        seconds.append(time.perf_counter() - began)
        if any(r.output_tokens != tokens for r in results):  # the same work in every case
            raise RuntimeError(f"rows stopped early: {[r.output_tokens for r in results]}")
    out.put(seconds)


def _busy(stop: Any) -> None:
    while not stop.is_set():
        sum(range(10_000))


def run_case(model_dir: Path, args: argparse.Namespace, threads: int, busy: bool) -> list[float]:
    """Seconds per batch of every engine's every round."""
    ctx = mp.get_context("spawn")
    start, stop, out = ctx.Barrier(args.engines + 1), ctx.Event(), ctx.Queue()
    shape = (args.rows, args.tokens, args.rounds)
    engines = [
        ctx.Process(target=_engine_process, args=(str(model_dir), threads, *shape, start, out))
        for _ in range(args.engines)
    ]
    neighbour = ctx.Process(target=_busy, args=(stop,)) if busy else None
    for process in engines:
        process.start()
    start.wait()  # every engine loaded: the timed rounds begin together
    if neighbour:
        neighbour.start()
    seconds = [s for _ in engines for s in out.get(timeout=1_800)]
    stop.set()
    for process in [*engines, *([neighbour] if neighbour else [])]:
        process.join()
    return seconds


def main() -> None:
    from hymt_serve.core.settings import usable_cpus
    from hymt_serve.ops.tiny_model import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/cpu/results"))
    args = parser.parse_args()
    cores = usable_cpus()
    shared = max(1, cores // args.engines)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny")
        for busy in (False, True):
            for threads in dict.fromkeys((cores, shared)):  # every core first, then a share
                seconds = run_case(model_dir, args, threads, busy)
                rows.append({
                    "threads_per_engine": threads, "busy_neighbour": busy,
                    "median_s": statistics.median(seconds), "max_s": max(seconds),
                    "seconds": [round(s, 4) for s in seconds],
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    header = (
        f"{args.engines} engines on {cores} usable cores, batches of {args.rows} rows x "
        f"{args.tokens} tokens, {args.rounds} rounds each\n\n"
        "| threads per engine | busy neighbour | median s a batch | slowest s "
        "| x the shared count |\n"
        "| ---: | --- | ---: | ---: | ---: |\n"
    )
    base = {r["busy_neighbour"]: r["median_s"] for r in rows if r["threads_per_engine"] == shared}
    table = "".join(
        f"| {r['threads_per_engine']} | {'yes' if r['busy_neighbour'] else 'no'} | "
        f"{r['median_s']:.2f} | {r['max_s']:.2f} | "
        f"{r['median_s'] / base[r['busy_neighbour']]:.2f} |\n"
        for r in rows
    )
    print(header + table)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"engines": args.engines, "cores": cores, "rows": args.rows, "tokens": args.tokens}
    (args.out / "threads.json").write_text(json.dumps({**meta, "cases": rows}, indent=1) + "\n")
    (args.out / "threads.md").write_text(header + table)


if __name__ == "__main__":
    main()
