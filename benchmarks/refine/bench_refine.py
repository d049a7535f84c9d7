"""What Chimera refinement costs against a plain translation, in one run on one machine.

One TorchServe (token auth on, the GPU profile's async mode) serves the same 7B-shaped
random-weight model twice: as the translation model and as the Chimera model (each its own
archive and worker, both on the one GPU), and ``hymt web --refine-model`` runs in front. At each
concurrency, closed-loop users send the load test's sentence mix either straight to the
translation model (plain) or to ``/api/refine`` (six candidate requests, then one Chimera
request), alternately. Output lengths follow the serving benchmark's rule (1.2 x the source
tokens); random weights never stop early, so every candidate runs to its length and differs
from the others: Chimera is always called with six candidates, the most refinement can cost
(a real model's agreeing candidates skip the Chimera call).

Writes results.json, results.md (with refine / plain ratios) and refine.png to ``--out``.

    PYTHONPATH=handler:loadtest/serving python benchmarks/refine/bench_refine.py --out DIR
    PYTHONPATH=handler:loadtest/serving python benchmarks/refine/bench_refine.py --tiny --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from client import Job, send
from run_bench import (
    REPO,
    GpuSampler,
    _gpu_name,
    build_model,
    measure_levels,
    sentence_jobs,
)

TRANSLATOR, CHIMERA = "hunyuan-mt", "hunyuan-mt-chimera"


def start_stack(model_dir: Path, work: Path, tiny: bool, web_port: int) -> tuple[Any, Any]:
    """TorchServe with both models, then the web front end; (server, web process)."""
    from hymt_serve.ops.archive import build_archive
    from hymt_serve.ops.launcher import start, wait_ready

    profile = "cpu" if tiny else "gpu"
    common: dict[str, Any] = {"minWorkers": 1, "maxWorkers": 1}
    common.update({"asyncCommunication": True, "batchSize": 1})
    if tiny:
        common["handler.engine"] = "fast"
    for name, family in ((TRANSLATOR, "auto"), (CHIMERA, "hunyuan-mt-chimera")):
        build_archive(
            model_path=model_dir,
            template=REPO / f"configs/model-config-{profile}.yaml",
            export_path=work / "model_store",
            # Rounds repeat their texts: the model's work, not the translation memory's answers.
            overrides={
                **common,
                "handler.prompt_family": family,
                "handler.translation_memory": False,
            },
            name=name,
        )
    models = [f"{name}={name}.mar" for name in (TRANSLATOR, CHIMERA)]
    server, _ = start(
        REPO / "config.properties", work / "run", model_store=work / "model_store", models=models
    )
    wait_ready(server, [TRANSLATOR, CHIMERA], timeout=900)
    command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(work / "run")]
    command += ["--port", str(web_port), "--refine-model", CHIMERA]
    log = (work / "web.log").open("ab")
    web = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return server, web


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/hymt-7b-random"))
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU (smoke test)")
    parser.add_argument(
        "--users", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument(
        "--systems",
        type=lambda s: s.split(","),
        default=["plain", "refine"],
        help="plain (translation model), refine (/api/refine), chimera (the Chimera model alone, "
        "given six candidates)",
    )
    parser.add_argument("--cap", type=int, default=128, help="longest output (tokens)")
    parser.add_argument("--web-port", type=int, default=8090)
    parser.add_argument("--work", type=Path, default=Path("/tmp/hymt-refine-work"))
    args = parser.parse_args()
    from hymt_serve.ops.launcher import stop, stop_web
    from hymt_serve.ops.tiny_model import default_tokenizer_dir

    model_dir = build_model(args.model_dir, args.tokenizer or default_tokenizer_dir(), args.tiny)
    jobs = sentence_jobs(model_dir, args.cap if not args.tiny else 16)
    print(json.dumps({"segments": len(jobs)}), flush=True)
    sampler = GpuSampler()
    started = time.monotonic()
    server, web = start_stack(model_dir, args.work, args.tiny, args.web_port)
    try:
        plain_url = f"{server.inference_url()}/predictions/{TRANSLATOR}"
        refine_url = f"http://127.0.0.1:{args.web_port}/api/refine"

        def maker(url: str, headers: dict[str, str], candidates: bool = False) -> Any:
            def make_job(rng: random.Random) -> Job:
                row, n = rng.choice(jobs)
                body = {
                    "text": row["text"],
                    "source_lang": row["source_lang"],
                    "target_lang": row["target_lang"],
                    "max_new_tokens": n,
                }
                if candidates:  # six distinct stand-ins about as long as real candidates
                    body["candidates"] = [f"{row['text']} ({i})" for i in range(1, 7)]
                return Job(url, body, headers, n)

            return make_job

        plain = maker(plain_url, server.headers("inference"))
        refine = maker(refine_url, {})
        chimera_url = f"{server.inference_url()}/predictions/{CHIMERA}"
        chimera = maker(chimera_url, server.headers("inference"), candidates=True)
        systems = {"plain": plain, "refine": refine, "chimera": chimera}
        _wait_until_answered(refine(random.Random(0)))
        ready_s = round(time.monotonic() - started, 1)
        phases = _phase_split(refine, 12)
        print(json.dumps({"phases_ms": phases}), flush=True)
        result = {
            "gpu": _gpu_name(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]),
            "ready_s": ready_s,
            "duration_s": args.duration,
            "segments": len(jobs),
            "phases_ms": phases,
            "rows": [],
        }
        for users in args.users:
            for kind in args.systems:
                make_job = systems[kind]
                labels = {"system": kind, "mode": kind, "gpus": 1}
                result["rows"] += measure_levels(labels, make_job, [users], args.duration, sampler)
            write_report(args.out, result)  # after each level: a cut-short run keeps its rows
    finally:
        stop_web(server)
        web.wait(30)
        stop(server)


def _wait_until_answered(job: Job, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if send(job, 120).error is None:
            return
        time.sleep(1)
    raise SystemExit("the refine endpoint never answered")


def _phase_split(make_job: Any, count: int) -> dict[str, float]:
    """Median milliseconds of each refinement phase, one request at a time."""
    import urllib.request

    seen: dict[str, list[float]] = {"candidates": [], "refine": []}
    rng = random.Random(1)
    for _ in range(count):
        job = make_job(rng)
        url, body = job.url, job.body
        request = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            timing = json.loads(response.read())["timing_ms"]
        for phase in seen:
            seen[phase].append(timing[phase])
    return {phase: round(statistics.median(values), 1) for phase, values in seen.items()}


def write_report(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    by = {(r["mode"], r["users"]): r for r in result["rows"]}
    lines = [
        f"# Chimera refinement against a plain translation: {result['gpu']}, {result['date']}",
        "",
        f"`{result['command']}`",
        "",
        f"{result['segments']} segments of the load test's mix; {result['duration_s']} s per "
        "level; closed-loop users; random weights: every candidate runs to its length and "
        "Chimera always gets six (the most refinement costs).",
        "",
        f"One request at a time, median of 12: candidates {result['phases_ms']['candidates']} ms, "
        f"Chimera {result['phases_ms']['refine']} ms.",
        "",
        "| users | plain req/s | refine req/s | refine/plain req/s | plain p50 ms | "
        "refine p50 ms | refine/plain p50 | plain p95 ms | refine p95 ms | errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for users in sorted({u for mode, u in by if mode == "refine" and ("plain", u) in by}):
        plain, refined = by[("plain", users)], by[("refine", users)]
        lines.append(
            f"| {users} | {plain['requests_per_s']} | {refined['requests_per_s']} | "
            f"{_ratio(refined['requests_per_s'], plain['requests_per_s'])} | {plain['p50_ms']} | "
            f"{refined['p50_ms']} | {_ratio(refined['p50_ms'], plain['p50_ms'])} | "
            f"{plain['p95_ms']} | {refined['p95_ms']} | "
            f"{plain['errors'] + refined['errors']} |"
        )
    chimera = [r for r in result["rows"] if r["mode"] == "chimera"]
    if chimera:
        lines += [
            "",
            "The Chimera model alone (six given candidates per request):",
            "",
            "| users | req/s | p50 ms | p95 ms | errors |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {r['users']} | {r['requests_per_s']} | {r['p50_ms']} | {r['p95_ms']} | "
            f"{r['errors']} |"
            for r in chimera
        ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    plot(out, result["rows"])


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else ""


def plot(out: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for index, mode in enumerate(("plain", "refine", "chimera")):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["users"])
        users = [r["users"] for r in mine]
        left.plot(users, [r["requests_per_s"] for r in mine], marker="o", color=f"C{index}",
                  label=mode)  # fmt: skip
        right.plot(users, [r["p50_ms"] for r in mine], marker="o", color=f"C{index}",
                   label=f"{mode} p50")  # fmt: skip
    for axis, label in ((left, "requests/s"), (right, "latency ms")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("concurrent users")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle("Chimera refinement (6 candidates + 1 refine call) vs plain translation")
    fig.tight_layout()
    fig.savefig(out / "refine.png", dpi=110)


if __name__ == "__main__":
    main()
