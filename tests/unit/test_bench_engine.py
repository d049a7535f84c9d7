"""The engine benchmark runs end to end (tiny model on the CPU), so it does not rot between GPU
sessions. Its numbers here mean nothing; only that it serves every text and reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def bench_engine(out: Path, work: Path, *options: str) -> dict[str, Any]:
    """Run the engine benchmark on the tiny model (built once in ``work``); its report."""
    command = [
        sys.executable, str(REPO / "benchmarks/serving/bench_engine.py"), "--tiny",
        "--out", str(out), "--work", str(work), *options,
    ]  # fmt: skip
    environ = {**os.environ, "PYTHONPATH": str(REPO / "handler")}
    subprocess.run(command, check=True, env=environ, timeout=600, capture_output=True)
    return dict(json.loads((out / "engine.json").read_text()))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One run with its default ``--stop eos``, every option the smoke test checks: its output
    folder and report (also the EOS run the ``--stop sampled`` test compares with)."""
    tmp_path = tmp_path_factory.mktemp("bench-engine")
    options = ["--users", "1,3", "--duration", "1", "--profile-users", "2", "--profile-s", "1"]
    report = bench_engine(tmp_path / "out", tmp_path / "work", *options, "--mixed-tokens", "256,0")
    return tmp_path, report


def test_engine_benchmark_smoke(smoke: tuple[Path, dict[str, Any]]) -> None:
    tmp_path, report = smoke
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


def test_engine_benchmark_can_stop_rows_at_a_sampled_token(
    smoke: tuple[Path, dict[str, Any]],
) -> None:
    """``--stop sampled``: rows end at the token a first pass samples most often, as a real
    model's end at EOS, instead of all running to their known lengths (the smoke run's
    default ``--stop eos``, with 1 and 3 users, is the comparison)."""
    folder, eos = smoke
    options = ["--users", "3", "--duration", "1", "--stop", "sampled"]
    sampled = bench_engine(folder / "sampled", folder / "work", *options)
    assert eos["stop_id"] == 127960  # the model's EOS, which random weights never pick
    assert sampled["stop_id"] != 127960
    # Which requests finish inside the one-second window depends on the machine's speed, so
    # the mean output lengths of the two runs need not order; the rows' ends do.
    assert all(row["stopped_requests"] == 0 for row in eos["rows"])
    assert sampled["rows"][0]["stopped_requests"] > 0
