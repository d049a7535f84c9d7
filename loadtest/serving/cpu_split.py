"""CPU time per request of each process on the path from TorchServe's front end to the engine.

The front end is TorchServe's Java process (its pid file); the workers are its Python
children (``model_service_worker``); the engine processes are the workers' own children (the
async mode's engine process, with what multiprocessing starts beside it). A snapshot of their
CPU seconds (user + system) before and after a load level, divided by the requests it
completed, says where the path's CPU goes. psutil is imported when a split is asked for (the
GPU machine may lack it: then the rows have no split).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ROLES = ("frontend", "worker", "engine")
CpuSnapshot = Callable[[], dict[str, float]]


def cpu_snapshot(frontend_pid: int) -> CpuSnapshot | None:
    """A function giving the CPU seconds so far of each role under TorchServe ``frontend_pid``;
    None without psutil."""
    try:
        import psutil
    except ImportError:
        return None

    def snapshot() -> dict[str, float]:
        seconds = dict.fromkeys(ROLES, 0.0)
        try:
            frontend = psutil.Process(frontend_pid)
            seconds["frontend"] = _cpu(frontend)
            for child in frontend.children():
                if not any("model_service_worker" in part for part in child.cmdline()):
                    continue
                seconds["worker"] += _cpu(child)
                seconds["engine"] += sum(_cpu(p) for p in child.children(recursive=True))
        except psutil.Error:  # a process ended between the listing and the reading
            pass
        return seconds

    return snapshot


def _cpu(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def per_request(
    before: dict[str, float], after: dict[str, float], requests: int
) -> dict[str, float | None]:
    """``<role>_cpu_ms`` per completed request for each role of the snapshots (``ROLES``, and
    ``web`` where the path goes through hymt web: :mod:`frontend`); None for no requests."""
    return {
        f"{role}_cpu_ms": round((after[role] - before[role]) * 1000 / requests, 3)
        if requests
        else None
        for role in before
    }
