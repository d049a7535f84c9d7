"""The engine benchmark runs end to end (tiny model on the CPU), so it does not rot between GPU
sessions. Its numbers here mean nothing; only that it serves every text and reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_engine_benchmark_smoke(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(REPO / "benchmarks/serving/bench_engine.py"),
        "--tiny",
        "--out",
        str(tmp_path / "out"),
        "--work",
        str(tmp_path / "work"),
        "--users",
        "1,3",
        "--duration",
        "1",
        "--profile-users",
        "2",
        "--profile-s",
        "1",
        "--mixed-tokens",
        "256,0",
    ]
    environ = {**os.environ, "PYTHONPATH": str(REPO / "handler")}
    subprocess.run(command, check=True, env=environ, timeout=600, capture_output=True)
    report = json.loads((tmp_path / "out/engine.json").read_text())
    assert [(row["users"], row["mixed_tokens"]) for row in report["rows"]] == [
        (1, 256),
        (1, 0),
        (3, 256),
        (3, 0),
    ]
    assert report["model_flops_per_token"] > 0 and report["bf16_matmul_tflops"] is None  # CPU
    for row in report["rows"]:
        assert row["requests_per_s"] > 0 and row["errors"] == 0 and row["steps_per_s"] > 0
        assert row["prompt_tokens_per_s"] > row["output_tokens_per_s"] > 0  # prompts are longer
        assert row["model_tflops"] is not None and row["mfu_pct"] is None
    assert (tmp_path / "out/engine.md").read_text().startswith("# Engine alone")
    assert [(p["users"], p["mixed_tokens"]) for p in report["profile"]] == [(2, 256), (2, 0)]
    assert "_mixed" in (tmp_path / "out/profile-mixed-256/profile_host.txt").read_text()
    assert "_decode" in (tmp_path / "out/profile-mixed-0/profile_host.txt").read_text()
    for mixed in (256, 0):
        text = (tmp_path / f"out/profile-mixed-{mixed}/profile_gpu.txt").read_text()
        assert "GPU kernel time" in text


def test_engine_benchmark_can_stop_rows_at_a_sampled_token(tmp_path: Path) -> None:
    """``--stop sampled``: rows end at the token a first pass samples most often, as a real
    model's end at EOS, instead of all running to their known lengths."""
    reports = {}
    for stop in ("eos", "sampled"):
        out = tmp_path / stop
        command = [
            sys.executable, str(REPO / "benchmarks/serving/bench_engine.py"), "--tiny",
            "--out", str(out), "--work", str(tmp_path / "work"), "--users", "3",
            "--duration", "1", "--stop", stop,
        ]  # fmt: skip
        environ = {**os.environ, "PYTHONPATH": str(REPO / "handler")}
        subprocess.run(command, check=True, env=environ, timeout=600, capture_output=True)
        reports[stop] = json.loads((out / "engine.json").read_text())
    assert reports["eos"]["stop_id"] == 127960  # the model's EOS, which random weights never pick
    assert reports["sampled"]["stop_id"] != 127960
    # Which requests finish inside the one-second window depends on the machine's speed, so
    # the mean output lengths of the two runs need not order; the rows' ends do.
    eos, sampled = (reports[k]["rows"][0] for k in reports)
    assert eos["stopped_requests"] == 0
    assert sampled["stopped_requests"] > 0
