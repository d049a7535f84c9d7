"""The serving benchmark's CPU split: the roles found under a TorchServe-like process tree and
the per-request arithmetic."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest/serving"))
from cpu_split import cpu_snapshot, per_request


def test_per_request_divides_each_roles_seconds_by_the_requests() -> None:
    before = {"frontend": 1.0, "worker": 2.0, "engine": 3.0}
    after = {"frontend": 1.5, "worker": 4.0, "engine": 3.25}
    assert per_request(before, after, 250) == {
        "frontend_cpu_ms": 2.0,
        "worker_cpu_ms": 8.0,
        "engine_cpu_ms": 1.0,
    }
    assert per_request(before, after, 0)["worker_cpu_ms"] is None


def test_a_worker_and_its_engine_are_told_from_the_frontend() -> None:
    """A stand-in front end whose child is named like TorchServe's worker and spins, and whose
    grandchild (the engine) spins too."""
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    # The worker starts the engine, then spins; the front end starts the worker, then sleeps.
    worker = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {spin!r}])\n{spin}"
    frontend_code = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {worker!r}, 'model_service_worker']); "
        "time.sleep(4)"
    )
    frontend = subprocess.Popen([sys.executable, "-c", frontend_code])
    try:
        snapshot = cpu_snapshot(frontend.pid)
        assert snapshot is not None
        time.sleep(0.5)
        first = snapshot()
        time.sleep(1.5)
        second = snapshot()
    finally:
        frontend.kill()
    assert second["worker"] - first["worker"] > 0.5  # the worker spun
    assert second["engine"] - first["engine"] > 0.5  # and so did its child
    assert second["frontend"] - first["frontend"] < 0.2  # the front end only slept
