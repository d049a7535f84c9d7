"""A short headless Locust run against the tiny-model server; its CSV/HTML report is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from hymt_serve.ops.launcher import Server

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_locust_run_has_no_failures(server: Server) -> None:
    env = {
        **os.environ,
        "PORT": str(urlparse(server.inference_url()).port),
        "HYMT_KEY_FILE": str(server.workdir / "key_file.json"),
        "HYMT_MAX_NEW_TOKENS": "8",
        "HYMT_P95_MS": "20000",
        "USERS": "4",
        "SPAWN_RATE": "4",
        "DURATION": os.environ.get("HYMT_LOCUST_DURATION", "30s"),
    }
    env.pop("HYMT_TOKEN", None)
    run = subprocess.run(
        ["bash", "loadtest/run_ci.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-2000:]
    stats = (REPO / "loadtest/reports/ci_stats.csv").read_text()
    aggregated = [line for line in stats.splitlines() if ",Aggregated," in line]
    assert aggregated, stats
    fields = aggregated[0].split(",")
    assert int(fields[2]) > 0 and int(fields[3]) == 0  # requests made, none failed
    assert (REPO / "loadtest/reports/ci.html").is_file()


def test_renewed_key_replaces_the_old_one(server: Server) -> None:
    old = server.headers("inference")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hymt_serve.cli",
            "token",
            "--renew",
            "--workdir",
            str(server.workdir),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    new = server.headers("inference")
    assert new != old
    url = f"{server.inference_url()}/ping"
    assert requests.get(url, headers=new, timeout=10).status_code == 200
    assert requests.get(url, headers=old, timeout=10).status_code == 400
