"""Rebuild benchmarks/serving/results.{json,md}, serving.png and engine.md from the raw runs.

All runs were made on 2026-11-29 with the 7B-shaped random-weight model; this script only
labels and merges their rows, it measures nothing:

- ``raw/1gpu-machine-results.json``: one command on the one-H200 machine (16 cores) that served
  both systems on the same GPU, one after the other: TorchServe as shipped (GPU profile,
  continuous batching) at 1-256 users, then the naive Flask baseline at 1, 8 and 64 users.
- ``raw/x2-machine-scaling.log``: one command on the two-H200 machine (32 cores): TorchServe on
  one GPU, then on two (one worker per GPU), 64-512 users, the users split over 8 client
  processes (one Python client process tops out near 400-600 requests/s). Its JSON lines are
  the harness's own output; ``raw/x2-machine-describe-*.json`` is the describe API after each.
- ``raw/1gpu-machine-30-token-sentences.json``: one command on the one-H200 machine (a fresh
  one: no compile cache), one user, only the segments of 28-32 source tokens (4 segments,
  34-36 output tokens), both systems: the issue's single-user goal for a 30-token sentence.
- ``engine/*.json``: ``benchmarks/serving/bench_engine.py`` (the continuous batcher alone, no
  TorchServe) before and after the prefill/read-back rework, one-H200 machine.

    python benchmarks/serving/assemble.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "loadtest/serving"), str(HERE.parents[1] / "handler")]

from run_bench import write_report  # noqa: E402

ONE = "1x H200 host"
TWO = "2x H200 host"


def one_gpu_run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads((HERE / "raw/1gpu-machine-results.json").read_text())
    rows = data["rows"]
    for row in rows:
        row.update(machine=ONE, client_processes=1)
    return data, rows


def scaling_run() -> tuple[list[dict[str, Any]], dict[str, float]]:
    rows: list[dict[str, Any]] = []
    colds: dict[str, float] = {}
    for line in (HERE / "raw/x2-machine-scaling.log").read_text().splitlines():
        row = json.loads(line)
        if "cold_start" in row:
            colds[f"{row['cold_start']} ({TWO})"] = row["seconds"]
        else:
            row.update(machine=TWO)
            rows.append(row)
    return rows, colds


def scaling_table(rows: list[dict[str, Any]]) -> str:
    by = {(r["gpus"], r["users"]): r for r in rows}
    lines = [
        "| users | 1 GPU req/s | 2 GPUs req/s | ratio | 1 GPU p50 ms | 2 GPUs p50 ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for users in sorted({u for _, u in by}):
        one, two = by[(1, users)], by[(2, users)]
        ratio = two["requests_per_s"] / one["requests_per_s"]
        lines.append(
            f"| {users} | {one['requests_per_s']:.1f} | {two['requests_per_s']:.1f} | "
            f"{ratio:.2f}x | {one['p50_ms']} | {two['p50_ms']} |"
        )
    best_one = max(r["requests_per_s"] for r in rows if r["gpus"] == 1)
    best_two = max(r["requests_per_s"] for r in rows if r["gpus"] == 2)
    lines.append(
        f"\nPeak: {best_one:.1f} req/s on one GPU, {best_two:.1f} on two: "
        f"{best_two / best_one:.2f}x."
    )
    return "\n".join(lines)


def engine_table() -> str:
    columns = [
        "users",
        "requests_per_s",
        "p50_ms",
        "steps_per_s",
        "rows_per_step",
        "texts_per_prefill",
        "admit_host_share",
    ]
    parts = [
        "# The continuous batcher alone, before and after the prefill rework\n",
        "`PYTHONPATH=handler python benchmarks/serving/bench_engine.py --tokenizer TOKDIR --out "
        "DIR --users 1,8,32,64,128,256 --profile-users 64` on the one-H200 machine, "
        "2026-11-29 (two separate runs of the same command, before and after; same model, "
        "same sentence mix and length rule as the serving benchmark, admit_rows 16, "
        "admit_wait 20 ms). *Before*: eager prefill of right-padded prompts (over a "
        "thousand kernel launches), a blocking host copy per admitted row, read-backs that "
        "stall the GPU. *After*: packed prompts through captured prefill graphs (one per "
        "token bucket), asynchronous pinned copies and read-backs.\n",
    ]
    for name in ("before", "after"):
        data = json.loads((HERE / f"engine/{name}.json").read_text())
        parts.append(f"## {name} ({data['date']})\n")
        parts.append("| " + " | ".join(columns) + " |")
        parts.append("|" + " ---: |" * len(columns))
        parts += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in data["rows"]]
        share = data["profile"]["gpu_kernel_share"]
        parts.append(
            f"\nGPU kernel time per wall second at {data['profile']['users']} users "
            f"(torch.profiler): {share}.\n"
        )
    parts.append(
        "The profiles are in `engine/*-profile-*.txt` (the *before* host profile was taken "
        "with torch.profiler running at the same time, which inflates its per-op costs)."
    )
    return "\n".join(parts) + "\n"


def main() -> None:
    data, rows = one_gpu_run()
    scaling, scaling_colds = scaling_run()
    colds = {**data["cold_start_s"], **scaling_colds}
    command = (
        "PYTHONPATH=handler:loadtest/serving python loadtest/serving/run_bench.py --out DIR "
        "--tokenizer TOKDIR --model-dir /tmp/hymt-7b --modes continuous --gpus 1 "
        "--users 1,8,32,64,128,256 --naive-users 1,8,64 --duration 8 (1x H200); "
        "... --gpus 1,2 --users 64,128,256,512 --duration 8 --skip-naive --client-processes 8 "
        "(2x H200); merged by python benchmarks/serving/assemble.py"
    )
    write_report(
        HERE,
        {
            "gpu": "NVIDIA H200",
            "date": data["date"],
            "command": command,
            "cold_start_s": colds,
            "rows": rows + scaling,
            "note": data["note"]
            + " Rows of the 2x H200 machine come from a second command (scaling: the same "
            "deployment with one worker per GPU); compare them with each other, not with the "
            "1x H200 machine's rows (another host).",
        },
    )
    with (HERE / "results.md").open("a") as md:
        md.write("\n## Two GPUs against one (2x H200 machine, same command)\n\n")
        md.write(scaling_table(scaling) + "\n")
    (HERE / "engine.md").write_text(engine_table())
    short = json.loads((HERE / "raw/1gpu-machine-30-token-sentences.json").read_text())
    result = json.loads((HERE / "results.json").read_text())
    result["one_user_30_token_sentences"] = {
        "command": short["command"],
        "date": short["date"],
        "cold_start_s": short["cold_start_s"],
        "rows": short["rows"],
    }
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    with (HERE / "results.md").open("a") as md:
        md.write(
            "\n## One user, 30-token sentences (1x H200 host, a fresh machine)\n\n"
            f"`{short['command']}` ({short['date']}): the segments of 28-32 source tokens "
            "(34-36 output tokens), one user, 10 s per system.\n\n"
            "| system | requests | p50_ms | p95_ms | p99_ms | errors |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: |\n"
        )
        for row in short["rows"]:
            md.write(
                f"| {row['system']} | {row['requests']} | {row['p50_ms']} | {row['p95_ms']} | "
                f"{row['p99_ms']} | {row['errors']} |\n"
            )
        colds = ", ".join(f"{k} {v} s" for k, v in short["cold_start_s"].items())
        md.write(
            f"\nCold start on this fresh machine: {colds} (34.0 s in the main run, on a "
            "machine that had compiled the same kernels minutes before; most likely inductor's "
            "compile cache makes the difference, not measured separately).\n"
        )


if __name__ == "__main__":
    main()
