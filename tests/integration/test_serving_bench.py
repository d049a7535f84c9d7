"""The serving benchmark harness end to end on the CPU (tiny model), so that it does not rot
between GPU sessions: it builds the archive, starts our TorchServe in async mode and the naive
baseline, drives both with forked client processes and writes the report; with ``--paths`` it
also starts hymt web in front of each TorchServe and sends the same requests through its
``/api/translate`` and ``/v1/chat/completions``. Its numbers here mean nothing; only that
every system and path served every request, each reply had the output length asked for, and
the report holds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hymt_serve.ops.frontend_guard import JAR

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
FIELDS = {
    "system", "gpus", "users", "requests_per_s", "output_tokens_per_s", "prompt_tokens_per_s",
    "model_tflops", "mfu_pct", "p50_ms", "p95_ms", "p99_ms", "errors", "gpu_util_pct",
    "gpu_mem_gb",
}  # fmt: skip


PATHS = ["torchserve", "web", "openai"]


def test_serving_benchmark_runs_both_systems(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(REPO / "loadtest/serving/run_bench.py"),
        "--tiny",
        "--out", str(tmp_path / "out"),
        "--work", str(tmp_path / "work"),
        "--model-dir", str(tmp_path / "model"),
        "--users", "1,3",
        "--naive-users", "2",
        "--duration", "2",
        "--client-processes", "2",
        "--modes", "continuous,continuous-int8+head",
        "--paths", ",".join(PATHS),
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
    assert set(report["cold_start_s"]) == {"torchserve", "torchserve_continuous-int8+head", "naive"}
    seen = [(row["system"], row.get("mode"), row["users"]) for row in report["rows"]]
    modes = ("continuous", "continuous-int8+head")
    assert sorted(seen) == sorted(
        [(path, mode, users) for path in PATHS for mode in modes for users in (1, 3)]
        + [("naive", "naive", 2)]
    )
    described = json.loads((tmp_path / "work/describe-continuous-int8+head-1.json").read_text())
    custom = described[0]["customizedMetadata"]
    engine = (json.loads(custom) if isinstance(custom, str) else custom)["engine"]
    assert engine["quantization"] == "int8", engine
    assert engine["fast"]["projections"] == "int8 weight-only, a scale per output row"
    assert engine["fast"]["lm_head"] == "int8, a scale per row, its table shared with the embedding"
    # the language check off for every path (the chat form's replies are never checked)
    assert (
        custom_settings(tmp_path / "work/describe-continuous-1.json")["target_language_check"]
        == "off"
    )
    for row in report["rows"]:
        assert set(row) >= FIELDS, FIELDS - set(row)
        assert row["errors"] == 0 and row["requests"] > 0, row
        assert row["output_mismatches"] == 0, row  # every reply as long as asked for
        assert row["client_processes"] == 2
        assert row["prompt_tokens_per_s"] > row["output_tokens_per_s"] > 0, row  # both counted
        if row["system"] in ("web", "openai"):  # hymt web's own CPU per request
            assert row["web_cpu_ms"] > 0 and row["web_cpu_pct"] > 0, row
        if row["system"] != "naive":  # the path's CPU per request, process by process
            assert row["frontend_cpu_ms"] > 0 and row["worker_cpu_ms"] > 0, row
            assert row["engine_cpu_ms"] > 0, row  # async mode: the engine's own process
            # the latency split from the metrics port: the engine's round trip inside the
            # front end's time (metrics reach the front end a moment after the reply, so the
            # two means are not compared exactly)
            assert row["frontend_ms"] > 0 and row["engine_round_trip_ms"] > 0, row
            assert row["frontend_ms"] < row["mean_ms"] * 1.5, row
    assert report["model_flops_per_token"] > 0
    assert (tmp_path / "out/serving.png").stat().st_size > 0
    text = (tmp_path / "out/results.md").read_text()
    assert "| torchserve |" in text and "## The front end's cost" in text
    compared = {(e["mode"], e["users"], e["path"]) for e in report["frontend_comparison"]}
    assert compared == {(m, u, p) for m in modes for u in (1, 3) for p in PATHS[1:]}
    assert all(e["ratio"] > 0 and e["verdict"] == "" for e in report["frontend_comparison"])
    # beside the report, per mode: the front-end plugin's counts and the metrics port's text
    metrics = (tmp_path / "out/metrics-continuous-1.txt").read_text()
    assert "ts_inference_requests_total" in metrics
    guard = (tmp_path / "out/guard-continuous-1.json").read_text()
    if JAR.is_file():
        assert json.loads(guard)["guarded"] == 1, guard


def custom_settings(describe: Path) -> dict[str, object]:
    """The handler's settings in a describe reply (TorchServe's customizedMetadata)."""
    custom = json.loads(describe.read_text())[0]["customizedMetadata"]
    settings = (json.loads(custom) if isinstance(custom, str) else custom)["settings"]
    assert isinstance(settings, dict)
    return settings
