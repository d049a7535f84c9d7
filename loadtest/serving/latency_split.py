"""Where a request's time goes, from TorchServe's metrics port: the front end's own latency per
request (``ts_inference_latency_microseconds`` over ``ts_inference_requests_total``, and its
queue part) and the handler's wait for the engine (``hymt_generation_latency_seconds``: from
the rows' submission to their results, the engine process's hops included).

With the client's mean latency these split a level's time into the client and HTTP around the
front end, the front end and worker around the handler, and the engine's round trip. The
metrics port needs no token (config.properties keeps it on loopback).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable

# name -> the counter (or histogram sum/count) summed over its label sets
NAMES = (
    "ts_inference_latency_microseconds",
    "ts_inference_requests_total",
    "ts_queue_latency_microseconds",
    "hymt_generation_latency_seconds_sum",
    "hymt_generation_latency_seconds_count",
)
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$")

MetricsSnapshot = Callable[[], dict[str, float]]


def parse(text: str) -> dict[str, float]:
    """The sums of :data:`NAMES` in a Prometheus text page (absent names read 0)."""
    sums = dict.fromkeys(NAMES, 0.0)
    for line in text.splitlines():
        found = _LINE.match(line)
        if found and found.group(1) in sums and found.group(2) != "NaN":
            sums[found.group(1)] += float(found.group(2))
    return sums


def metrics_snapshot(metrics_url: str) -> MetricsSnapshot:
    """A function reading the sums now from ``metrics_url`` (e.g. http://127.0.0.1:8082)."""

    def snapshot() -> dict[str, float]:
        with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as response:
            return parse(response.read().decode("utf-8", errors="replace"))

    return snapshot


def split(
    before: dict[str, float], after: dict[str, float], client_mean_ms: float | None
) -> dict[str, float | None]:
    """Mean milliseconds per request between two snapshots: ``frontend_ms`` (TorchServe's own
    latency, ``frontend_queue_ms`` of it waiting for a worker), ``engine_round_trip_ms`` (the
    handler's wait for the engine), and the differences ``outside_frontend_ms`` (client's mean
    minus the front end's: the client, HTTP and connection) and ``frontend_to_engine_ms``
    (front end minus the engine's round trip: the worker socket, TorchServe's Python, our
    handler's pre- and post-processing)."""
    delta = {name: after[name] - before[name] for name in NAMES}
    requests = delta["ts_inference_requests_total"]
    batches = delta["hymt_generation_latency_seconds_count"]
    frontend = delta["ts_inference_latency_microseconds"] / requests / 1000 if requests else None
    queue = delta["ts_queue_latency_microseconds"] / requests / 1000 if requests else None
    engine = delta["hymt_generation_latency_seconds_sum"] / batches * 1000 if batches else None
    result: dict[str, float | None] = {
        "frontend_ms": frontend,
        "frontend_queue_ms": queue,
        "engine_round_trip_ms": engine,
        "outside_frontend_ms": None,
        "frontend_to_engine_ms": None,
    }
    if frontend is not None and client_mean_ms is not None:
        result["outside_frontend_ms"] = client_mean_ms - frontend
    if frontend is not None and engine is not None:
        result["frontend_to_engine_ms"] = frontend - engine
    return {key: None if value is None else round(value, 3) for key, value in result.items()}
