"""Soak: mixed Locust traffic for minutes, zero failures, worker memory flat after warm-up.

``HYMT_SOAK_SECONDS`` sets the length: a short soak by default, the full one
(``HYMT_SOAK_SECONDS=100``, 16 users) in CI, hours before a release. The numbers go to
loadtest/reports/soak.json and are printed at the end of the test run.
"""

from __future__ import annotations

import csv
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
# Users of the soak. A leak grows with the requests served, so what decides the soak's power is
# how many requests fall between the memory baseline and the last reading, not its seconds:
# 16 users (each waits 0.5-2 s between requests) send about four times what 4 users sent, so
# 100 s covers as many requests after warm-up as the 300 s soak of 4 users did
# (docs/testing.md#the-soak has the numbers).
USERS = 16
SAMPLE_S = 5  # between memory readings: the baseline takes those of 20 s, the end the last 3


def worker_pids(server: Server) -> list[int]:
    return [int(worker["pid"]) for worker in model_workers(server, MODEL)]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def requests_after(history: Path, seconds: int) -> int:
    """Requests that Locust's per-second history counts after ``seconds`` of its run."""
    with history.open(newline="") as lines:
        rows = [row for row in csv.DictReader(lines) if row["Name"] == "Aggregated"]
    first = int(rows[0]["Timestamp"])
    at = [row for row in rows if int(row["Timestamp"]) - first <= seconds][-1]
    return int(rows[-1]["Total Request Count"]) - int(at["Total Request Count"])


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
        str(USERS),
        "-r",
        str(USERS),
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
        time.sleep(SAMPLE_S)
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
        "users": USERS,
        "requests": int(totals[2]),
        "requests_after_warm_up": requests_after(reports / "soak_stats_history.csv", warm_up),
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
