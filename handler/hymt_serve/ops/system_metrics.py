"""TorchServe's system metrics collector, with GPU readings that need no ``nvgpu`` package.

TorchServe's front end runs a collector every ``metric_time_interval`` and reads metric lines
from its output (host CPU, memory and disk, then GPU memory and utilization). In 0.12.0 its
own collector imports ``nvgpu`` (and ``pynvml``) as soon as the host has a GPU; without them
the import fails, and since the GPU step comes before the memory steps, every run prints
nothing and logs a traceback: on a GPU host none of the system metrics reach Prometheus.

This collector runs TorchServe's own steps (the same metrics, units and dimensions) with the
GPU step replaced by one ``nvidia-smi`` query. Without ``nvidia-smi`` there are no GPU
metrics, and the host's still come. ``config.properties`` points TorchServe at it with
``system_metrics_cmd=-m hymt_serve.ops.system_metrics``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from typing import Any

QUERY = "index,memory.used,memory.total,utilization.gpu"
TIMEOUT_S = 10.0


def gpu_readings() -> list[dict[str, float]]:
    """One dict per GPU that ``nvidia-smi`` lists: ``index``, ``mem_used`` (MiB),
    ``mem_used_percent`` and ``utilization`` (%); a field it cannot read ("[N/A]", as on MIG
    devices) is left out. No ``nvidia-smi``, or a failed query: no GPUs."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return []
    try:
        done = subprocess.run(
            [binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    readings = []
    for line in done.stdout.splitlines():
        fields = [_number(part) for part in line.split(",")]
        if len(fields) != 4:
            continue
        index, used, total, busy = fields
        if index is None:
            continue
        reading: dict[str, float] = {"index": index}
        if used is not None:
            reading["mem_used"] = used
            if total:
                reading["mem_used_percent"] = round(100 * used / total, 2)
        if busy is not None:
            reading["utilization"] = busy
        readings.append(reading)
    return readings


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def gpu_metrics(readings: list[dict[str, float]]) -> list[Any]:
    """TorchServe's three GPU metrics, as its own collector names and dimensions them."""
    # TorchServe's own modules: needed to name the metrics, not to read nvidia-smi
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric import Metric

    metrics = []
    names = (
        ("mem_used_percent", "GPUMemoryUtilization", "percent"),
        ("mem_used", "GPUMemoryUsed", "MB"),
        ("utilization", "GPUUtilization", "percent"),
    )
    for reading in readings:
        dimensions = [Dimension("Level", "Host"), Dimension("device_id", int(reading["index"]))]
        for key, name, unit in names:
            if key in reading:
                metrics.append(Metric(name, reading[key], unit, dimensions))
    return metrics


def main() -> None:
    """What TorchServe runs (``system_metrics_cmd``, no arguments): nvidia-smi finds the GPUs."""
    # TorchServe's collector (psutil, the whole ts.metrics package): only when run by it
    from ts.metrics import system_metrics
    from ts.metrics.process_memory_metric import check_process_mem_usage

    def gpu_utilization(num_of_gpu: int) -> None:  # the name TorchServe's loop calls it by
        system_metrics.system_metrics.extend(gpu_metrics(gpu_readings()))

    logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO)
    system_metrics.gpu_utilization = gpu_utilization
    system_metrics.collect_all(system_metrics, 0)
    check_process_mem_usage(sys.stdin)  # the workers' memory, from the PIDs on stdin


if __name__ == "__main__":
    main()
