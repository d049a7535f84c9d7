"""``hymt stop`` ends the web front end of its work folder, and nothing else."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from conftest import free_ports

pytestmark = pytest.mark.integration


def hymt(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "hymt_serve.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def wait_serving(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.2)
    raise AssertionError(f"hymt web did not start (exit {process.poll()})")


def test_hymt_stop_ends_this_work_folders_web_front_end(tmp_path: Path) -> None:
    [port] = free_ports(1)
    workdir = tmp_path / "run"  # as hymt start renders it (no TorchServe needed here)
    workdir.mkdir()
    (workdir / "config.properties").write_text("inference_address=http://127.0.0.1:9\n")
    command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(workdir)]
    web = subprocess.Popen([*command, "--port", str(port)])
    other = subprocess.Popen(["sleep", "60"])  # a stranger whose pid a stale file might name
    try:
        wait_serving(f"http://127.0.0.1:{port}/", web)
        assert (workdir / "web.pid").read_text().strip() == str(web.pid)
        stopped = hymt("stop", "--workdir", str(workdir))
        assert "web front end stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        assert web.wait(timeout=15) is not None
        assert not (workdir / "web.pid").exists()
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/", timeout=2)
        (workdir / "web.pid").write_text(f"{other.pid}\n")
        hymt("stop", "--workdir", str(workdir))
        assert other.poll() is None  # a pid file naming another program is not obeyed
    finally:
        for process in (web, other):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=15)
