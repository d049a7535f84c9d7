"""Soak: mixed Locust traffic for minutes, zero failures, worker memory flat after warm-up.

``HYMT_SOAK_SECONDS`` sets the length: a short soak by default, the full one
(``HYMT_SOAK_SECONDS=300``) in CI, hours before a release. The numbers go to
loadtest/reports/soak.json and are printed at the end of the test run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from conftest import locust_run

from hymt_serve.ops.launcher import Server, model_workers

pytestmark = [pytest.mark.integration, pytest.mark.soak]
REPO = Path(__file__).resolve().parents[2]
MODEL = "hunyuan-mt"
MAX_GROWTH = 0.10
SHORT_SOAK_S = 60  # enough for the warm-up, its memory baseline and a later reading


def worker_pids(server: Server) -> list[int]:
    return [int(worker["pid"]) for worker in model_workers(server, MODEL)]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_soak(server: Server) -> None:
    seconds = int(os.environ.get("HYMT_SOAK_SECONDS", str(SHORT_SOAK_S)))
    warm_up = min(120, seconds * 2 // 5)  # allocator pools settle over the first minutes
    [pid] = worker_pids(server)
    reports = REPO / "loadtest/reports"
    command, env = locust_run(
        server,
        "loadtest/locustfile.py",
        "soak",
        "-u",
        "4",
        "-r",
        "4",
        "-t",
        f"{seconds}s",
        HYMT_MAX_NEW_TOKENS="8",
        HYMT_P95_MS="20000",
    )
    started = time.monotonic()
    locust = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    samples: list[tuple[float, int]] = []
    while locust.poll() is None:
        samples.append((time.monotonic() - started, rss_bytes(pid)))
        time.sleep(5)
    stderr = locust.stderr.read() if locust.stderr else ""
    after_warm_up = [rss for at, rss in samples if warm_up <= at <= warm_up + 20]
    final = [rss for _, rss in samples[-3:]]
    baseline, end = statistics.median(after_warm_up), statistics.median(final)
    growth = end / baseline - 1
    totals = next(
        line
        for line in (reports / "soak_stats.csv").read_text().splitlines()
        if ",Aggregated," in line
    ).split(",")
    result = {
        "seconds": seconds,
        "requests": int(totals[2]),
        "failures": int(totals[3]),
        "worker_rss_mb_after_warm_up": round(baseline / 2**20, 1),
        "worker_rss_mb_at_end": round(end / 2**20, 1),
        "rss_growth": round(growth, 4),
        "worker_pid_unchanged": worker_pids(server) == [pid],
    }
    (reports / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nsoak: {json.dumps(result)}")
    assert locust.returncode == 0, stderr[-2000:]
    assert result["failures"] == 0 and result["requests"] > 0
    assert result["worker_pid_unchanged"]
    assert growth <= MAX_GROWTH, result
