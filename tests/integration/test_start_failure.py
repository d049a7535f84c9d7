"""`hymt start` against a real TorchServe: it must fail fast, non-zero, with the handler's own
message, on a bad setting (in batch mode and in async mode, where TorchServe logs no "Load model
failed" and retries the worker only minutes later); and `--foreground`, the image's entrypoint,
must stop TorchServe on SIGTERM (`docker stop`) both while the workers load and once they
serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, free_ports

from hymt_serve.ops.archive import build_archive
from hymt_serve.ops.launcher import Server, stop

pytestmark = pytest.mark.integration

ASYNC = {"asyncCommunication": True, "batchSize": 1}


def _start_command(model_dir: Path, folder: Path, overrides: dict[str, Any]) -> list[str]:
    """``hymt start`` for an archive of ``model_dir`` (CPU profile + overrides) on free ports."""
    store = folder / "store"
    build_archive(
        model_path=model_dir,
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=store,
        overrides=overrides,
    )
    ports = free_ports(6)
    names = ["inference_address", "management_address", "metrics_address"]
    sets = [f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, ports, strict=False)]
    sets += [
        f"grpc_inference_port={ports[3]}",
        f"grpc_management_port={ports[4]}",
        f"initial_worker_port={ports[5]}",
    ]
    command = [sys.executable, "-m", "hymt_serve.cli", "start"]
    command += ["--config", str(REPO / "config.properties"), "--workdir", str(folder / "run")]
    command += ["--model-store", str(store), "--timeout", "200"]
    for item in sets:
        command += ["--set", item]
    return command


@pytest.mark.parametrize("mode", ["batch", "async"])
def test_bad_handler_setting_fails_start_with_its_message(
    tiny_model_dir: Path, tmp_path: Path, mode: str
) -> None:
    overrides = {"handler.max_new_tokens": -5, **(ASYNC if mode == "async" else {})}
    command = _start_command(tiny_model_dir, tmp_path, overrides)
    began = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert run.returncode == 1, run.stderr[-2000:]
    message = "a worker refused its settings: max_new_tokens must be an integer in [1, 32768]"
    assert f"{message}, got -5" in run.stderr
    assert time.monotonic() - began < 120  # gave up on its own, long before the timeout
    assert Server((tmp_path / "run").resolve()).pid() is None  # and stopped TorchServe


def test_workers_without_torch_fail_start_with_the_missing_module(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Workers whose Python cannot import torch (as when TorchServe ran from another Python's
    script) die at start, each restart the same way; in async mode TorchServe logs no failed
    load, so the start reads the import error and gives up at once."""
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    command = _start_command(tiny_model_dir, tmp_path, ASYNC)
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    began = time.monotonic()
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": path}
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "the workers die at start: ModuleNotFoundError: No module named 'torch'" in run.stderr
    assert time.monotonic() - began < 120
    assert Server((tmp_path / "run").resolve()).pid() is None


def _wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("when", ["loading", "serving"])
def test_foreground_start_stops_torchserve_on_sigterm(
    tiny_model_dir: Path, tmp_path: Path, when: str
) -> None:
    command = [*_start_command(tiny_model_dir, tmp_path, ASYNC), "--foreground"]
    server = Server((tmp_path / "run").resolve())
    output = tmp_path / "output.txt"  # TorchServe's own output goes here too: not a pipe
    with output.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        assert _wait_for(lambda: server.pid() is not None, 60), "TorchServe never started"
        if when == "serving":  # hymt start has seen every worker READY and says so
            assert _wait_for(lambda: b"TorchServe ready" in output.read_bytes(), 180)
        process.send_signal(signal.SIGTERM)  # "loading": the frontend is up, the worker is not
        code = process.wait(timeout=90)
        # 143: it was still waiting for READY (0: TorchServe's own exit after a clean stop)
        assert code == (128 + signal.SIGTERM if when == "loading" else 0)
        assert _wait_for(lambda: server.pid() is None, 30), "TorchServe still running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stop(server)
