"""Rebuild benchmarks/serving/results.{json,md} and serving.png from the two raw runs in raw/.

Both runs were made with ``loadtest/serving/run_bench.py`` on 2026-11-29, on the same kind of
H200 and the same saved 7B-shaped model; this script only relabels and merges their rows:

- ``raw/x2-machine-bench.log`` (the two-H200 machine, one command): TorchServe continuous mode
  on 1 GPU, on 2 GPUs (one worker each), and batch mode on 1 GPU, 1-256 users, 8 s per level.
  Its rows were printed before the labels were added (each config starts after a "cold start"
  line). Its GPU sampler read GPU 0 only, while the one-worker runs were placed on GPU 1, so
  their GPU utilisation and memory are unknown (null here); the 2-GPU rows average both GPUs.
- ``raw/1gpu-machine-results.json`` (the one-H200 machine, earlier the same session): the
  naive Flask baseline at 1, 8 and 64 users, 10 s per level. (Its TorchServe rows measured an
  earlier in-process scheduler and are superseded by the run above.)

    python benchmarks/serving/assemble.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "loadtest/serving"), str(HERE.parents[1] / "handler")]

from run_bench import write_report  # noqa: E402

CONFIG = re.compile(r"^torchserve (\w+) x(\d+) cold start ([\d.]+) s$")


def x2_rows(path: Path) -> tuple[list[dict[str, Any]], dict[str, float]]:
    rows: list[dict[str, Any]] = []
    colds: dict[str, float] = {}
    mode, gpus = "", 0
    for line in path.read_text().splitlines():
        match = CONFIG.match(line.strip())
        if match:
            mode, gpus = match.group(1), int(match.group(2))
            name = "torchserve" if mode == "continuous" else f"torchserve_{mode}"
            colds[name if gpus == 1 else f"{name}_{gpus}gpus"] = float(match.group(3))
        elif line.startswith("{") and mode:
            row = json.loads(line)
            row.update(system="torchserve", mode=mode, gpus=gpus, machine="2x H200")
            if gpus == 1:  # the sampler read the idle GPU 0
                row.update(gpu_util_pct=None, gpu_mem_gb=None)
            rows.append(row)
    return rows, colds


def naive_rows(path: Path) -> tuple[list[dict[str, Any]], float]:
    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if r["system"] == "naive"]
    for row in rows:
        row.update(mode="naive", gpus=1, machine="1x H200")
    return rows, data["cold_start_s"]["naive"]


def main() -> None:
    rows, colds = x2_rows(HERE / "raw/x2-machine-bench.log")
    naive, colds["naive"] = naive_rows(HERE / "raw/1gpu-machine-results.json")
    write_report(
        HERE,
        {
            "gpu": "NVIDIA H200",
            "date": "2026-11-29",
            "command": (
                "PYTHONPATH=handler:loadtest/serving python loadtest/serving/run_bench.py "
                "--out DIR --tokenizer TOKDIR --model-dir /tmp/hymt-7b --modes continuous,batch "
                "--gpus 1,2 --users 1,8,32,64,128,256 --duration 8 --skip-naive (2x H200) and "
                "... --modes continuous,batch --naive-users 1,8,64 --duration 10 (1x H200, naive "
                "rows); merged by python benchmarks/serving/assemble.py"
            ),
            "cold_start_s": colds,
            "rows": rows + naive,
            "note": (
                "Closed-loop users, 8 s per level (naive 10 s); the load test's sentence mix "
                "(segments under 300 characters, many language pairs); output length 1.2 x "
                "source tokens for every system; one worker per GPU, token auth on. Mode "
                "continuous: the GPU profile as shipped (TorchServe async mode, batchSize 1, "
                "the handler's continuous batcher over 128 KV-cache slots in a child process). "
                "Mode batch: TorchServe batching, batchSize 64, maxBatchDelay 5 ms, the fast "
                "engine per batch. GPU utilisation is unknown (None) for the one-GPU TorchServe "
                "rows (see assemble.py)."
            ),
        },
    )


if __name__ == "__main__":
    main()
