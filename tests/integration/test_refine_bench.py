"""The refinement benchmark end to end on the CPU (tiny model as both models), so that it does
not rot between GPU sessions. Its numbers here mean nothing; only that every system served every
request and the report holds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_ports

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_refine_benchmark_runs_every_system(tmp_path: Path) -> None:
    [web_port] = free_ports(1)
    command = [
        sys.executable,
        str(REPO / "benchmarks/refine/bench_refine.py"),
        "--tiny",
        "--out", str(tmp_path / "out"),
        "--work", str(tmp_path / "work"),
        "--model-dir", str(tmp_path / "model"),
        "--users", "2",
        "--duration", "2",
        "--systems", "plain,refine,chimera",
        "--web-port", str(web_port),
    ]  # fmt: skip
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "handler"), str(REPO / "loadtest/serving")]),
    }
    run = subprocess.run(
        command, env=environ, timeout=900, capture_output=True, text=True, cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "out/results.json").read_text())
    assert {row["mode"] for row in report["rows"]} == {"plain", "refine", "chimera"}
    for row in report["rows"]:
        assert row["errors"] == 0 and row["requests"] > 0, row
    assert set(report["phases_ms"]) == {"candidates", "refine"}
    text = (tmp_path / "out/results.md").read_text()
    assert "| 2 |" in text and "The Chimera model alone" in text
    assert (tmp_path / "out/refine.png").stat().st_size > 0
