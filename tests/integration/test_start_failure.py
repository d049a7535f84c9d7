"""`hymt start` must fail fast, non-zero, with the handler's own message, on a bad setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_ports

from hymt_serve.ops.archive import build_archive

pytestmark = pytest.mark.integration


def test_bad_handler_setting_fails_start_with_its_message(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    build_archive(
        model_path=tiny_model_dir,
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=store,
        overrides={"handler.max_new_tokens": -5},
    )
    ports = free_ports(6)
    names = ["inference_address", "management_address", "metrics_address"]
    sets = [f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, ports, strict=False)]
    sets += [
        f"grpc_inference_port={ports[3]}",
        f"grpc_management_port={ports[4]}",
        f"initial_worker_port={ports[5]}",
    ]
    command = [
        sys.executable,
        "-m",
        "hymt_serve.ops.cli",
        "start",
        "--config",
        str(REPO / "config.properties"),
        "--workdir",
        str(tmp_path / "run"),
        "--model-store",
        str(store),
        "--timeout",
        "200",
    ]
    for item in sets:
        command += ["--set", item]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert run.returncode == 1
    assert "max_new_tokens must be an integer in [1, 32768], got -5" in run.stderr
    assert "failed 2 times" in run.stderr  # gave up on its own, long before the timeout
