"""``hymt_serve.ops.system_metrics``: TorchServe's system metrics, GPU readings from
``nvidia-smi`` instead of the ``nvgpu`` package, in lines TorchServe's front end parses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ts.metrics.system_metrics")

from hymt_serve.ops import system_metrics

REPO = Path(__file__).resolve().parents[2]
# TorchServe 0.12.0's Metric.parse (the pattern in its jar): name.unit:value|#dims|#hostname:..
LINE = re.compile(
    r"\s*([\w\s]+)\.([\w\s]+):([0-9\-,.e]+)\|#([^|]*)(\|#type:([^|,]+))?"
    r"\|#hostname:([^,]+),([^,]+)(,(.*))?"
)
SMI = "0, 1024, 81920, 37\n1, [N/A], 81920, 5\n"


def fake_smi(folder: Path, output: str = SMI, code: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {code}\n")
    script.chmod(0o755)
    return folder


def collect(path: str) -> dict[tuple[str, str], float]:
    """Run the collector as TorchServe does (the PIDs on stdin: none) and parse its lines."""
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO / "handler")}
    done = subprocess.run(
        [sys.executable, "-m", "hymt_serve.ops.system_metrics"],
        input="",
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    assert done.stderr == ""
    parsed = {}
    for line in done.stdout.splitlines():
        if not line:  # the front end skips empty lines
            continue
        match = LINE.fullmatch(line)
        assert match, line
        pairs = [pair.split(":") for pair in match.group(4).split(",")]
        assert all(len(pair) == 2 for pair in pairs), line  # the front end drops others
        device = dict(pairs).get("device_id", "")
        parsed[(match.group(1), device)] = float(match.group(3))
    return parsed


def test_gpu_readings_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path / "bin")))
    assert system_metrics.gpu_readings() == [
        {"index": 0, "mem_used": 1024, "mem_used_percent": 1.25, "utilization": 37},
        {"index": 1, "utilization": 5},  # memory "[N/A]" (a MIG device): left out
    ]


def test_no_gpus_when_nvidia_smi_is_missing_or_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert system_metrics.gpu_readings() == []
    monkeypatch.setenv("PATH", str(fake_smi(tmp_path / "bin", "No devices were found\n", 6)))
    assert system_metrics.gpu_readings() == []


def test_the_collector_prints_host_and_gpu_metrics_the_front_end_parses(tmp_path: Path) -> None:
    bin_dir = fake_smi(tmp_path / "bin")
    found = collect(f"{bin_dir}:{os.environ['PATH']}")
    for name in ("CPUUtilization", "MemoryUsed", "MemoryAvailable", "DiskUsage"):
        assert (name, "") in found, name
    assert found[("GPUUtilization", "0")] == 37
    assert found[("GPUUtilization", "1")] == 5
    assert found[("GPUMemoryUsed", "0")] == 1024
    assert found[("GPUMemoryUtilization", "0")] == 1.25
    assert ("GPUMemoryUsed", "1") not in found


def test_without_nvidia_smi_the_host_metrics_still_come(tmp_path: Path) -> None:
    found = collect(str(tmp_path / "empty"))  # no nvidia-smi anywhere on PATH
    assert ("MemoryUtilization", "") in found
    assert not [name for name, _ in found if name.startswith("GPU")]


def test_torchserve_is_pointed_at_it() -> None:
    for config in ("config.properties", "docker/config.properties"):
        lines = (REPO / config).read_text().splitlines()
        assert "system_metrics_cmd=-m hymt_serve.ops.system_metrics" in lines, config
