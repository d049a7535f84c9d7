"""Custom Prometheus metrics: declared once here, registered in ``initialize``, updated per batch.

TorchServe exports a model metric only when ``metrics.yaml`` (``metrics_config``) lists it under
``model_metrics``; ``configs/metrics.yaml`` does, and a unit test keeps it equal to
:data:`DECLARED`. Latencies are in seconds because Prometheus histograms use its default buckets.

Every update a handler makes is a line the worker prints for TorchServe's front end to parse:
at hundreds of requests a second, nine lines per request were the largest share of the
worker's CPU after TorchServe's own work. So the counters and gauges of a busy worker are
summed (counters) or kept (gauges, their last value) and sent at most every
:data:`FLUSH_INTERVAL_S` seconds; the first update after a quiet second goes at once. Errors
and latency observations (histogram buckets) are sent as they come.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

FLUSH_INTERVAL_S = 1.0

BASE_DIMENSIONS = ("ModelName", "Level")
ENGINE_DIMENSIONS = ("Engine", "Attention", "Dtype", "Device", "Quantization")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # "counter" | "gauge" | "histogram", as TorchServe's MetricTypes values
    unit: str
    dimensions: tuple[str, ...] = BASE_DIMENSIONS


DECLARED: tuple[MetricSpec, ...] = (
    MetricSpec("hymt_requests_total", "counter", "Count"),
    MetricSpec("hymt_texts_total", "counter", "Count"),
    MetricSpec("hymt_errors_total", "counter", "Count", (*BASE_DIMENSIONS, "ErrorType")),
    MetricSpec("hymt_batches_total", "counter", "Count"),
    MetricSpec("hymt_batch_rows", "gauge", "Count"),
    MetricSpec("hymt_batch_requests", "gauge", "Count"),
    MetricSpec("hymt_input_tokens_total", "counter", "Count"),
    MetricSpec("hymt_output_tokens_total", "counter", "Count"),
    MetricSpec("hymt_generation_latency_seconds", "histogram", "Seconds"),
    MetricSpec("hymt_output_tokens_per_second", "gauge", "Count"),
    MetricSpec("hymt_engine_info", "gauge", "Count", (*BASE_DIMENSIONS, *ENGINE_DIMENSIONS)),
)


class Recorder(Protocol):
    """What the service reports; :class:`TorchServeRecorder` sends it to TorchServe."""

    def requests(self, count: int) -> None: ...
    def error(self, error_type: str) -> None: ...
    def batch(self, *, requests: int, rows: int) -> None: ...
    def generation(self, *, seconds: float, input_tokens: int, output_tokens: int) -> None: ...


class NullRecorder:
    """Records nothing (used when the handler runs outside TorchServe)."""

    def requests(self, count: int) -> None:
        pass

    def error(self, error_type: str) -> None:
        pass

    def batch(self, *, requests: int, rows: int) -> None:
        pass

    def generation(self, *, seconds: float, input_tokens: int, output_tokens: int) -> None:
        pass


def _registered(cache: Any, spec: MetricSpec, kind: Any) -> Any:
    """The metric TorchServe already made from metrics.yaml, or a new one with this spec."""
    try:
        return cache.get_metric(spec.name, kind)
    except Exception:  # TorchServe raises its MetricsCacheKeyError when not declared
        return cache.add_metric_to_cache(
            metric_name=spec.name,
            unit=spec.unit,
            dimension_names=list(spec.dimensions),
            metric_type=kind,
        )


class TorchServeRecorder:
    """Sends metrics through TorchServe's metric cache (``context.metrics``); counters and
    gauges at most every ``interval_s`` seconds (module docstring)."""

    def __init__(
        self,
        cache: Any,
        model_name: str,
        interval_s: float = FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        self._model = model_name
        self._metrics = {
            spec.name: _registered(cache, spec, MetricTypes(spec.kind)) for spec in DECLARED
        }
        self._interval, self._clock = interval_s, clock
        self._changed = threading.Condition()
        self._pending: dict[str, float] = {}  # counters: their sum; gauges: their last value
        self._last_flush = -math.inf
        self._flusher: threading.Thread | None = None  # started with the first wait

    def _emit(self, name: str, value: float, *extra: str) -> None:
        self._metrics[name].add_or_update(value, [self._model, "Model", *extra])

    def _add(self, name: str, value: float, gauge: bool = False) -> None:
        """Update a counter (``value`` added) or a gauge (``value`` kept) without labels beyond
        the model's: at once after a quiet interval, else with the next flush."""
        with self._changed:
            self._pending[name] = value if gauge else self._pending.get(name, 0.0) + value
            due = self._clock() >= self._last_flush + self._interval
            if not due:
                if self._flusher is None:
                    self._flusher = threading.Thread(
                        target=self._flush_when_due, name="hymt-metrics", daemon=True
                    )
                    self._flusher.start()
                self._changed.notify()
        if due:
            self.flush()

    def flush(self) -> None:
        """Send the counters and gauges updated since the last flush."""
        with self._changed:
            pending = self._take()
        self._send(pending)

    def _take(self) -> dict[str, float]:
        pending, self._pending = self._pending, {}
        self._last_flush = self._clock()
        return pending

    def _send(self, pending: dict[str, float]) -> None:
        for name, value in pending.items():
            self._emit(name, value)

    def _flush_when_due(self) -> None:
        """The flusher thread: whenever updates wait, send them once their interval is up."""
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                wait = self._last_flush + self._interval - self._clock()
                pending = self._take() if wait <= 0 else None
            if pending is None:
                time.sleep(wait)
            else:
                self._send(pending)

    def engine_info(self, info: dict[str, str]) -> None:
        """Expose the engine's choices (attention kernel, dtype, ...) as a constant gauge."""
        labels = [str(info.get(dim.lower(), "unknown")) for dim in ENGINE_DIMENSIONS]
        self._emit("hymt_engine_info", 1, *labels)

    def requests(self, count: int) -> None:
        self._add("hymt_requests_total", count)

    def error(self, error_type: str) -> None:
        self._emit("hymt_errors_total", 1, error_type)

    def batch(self, *, requests: int, rows: int) -> None:
        self._add("hymt_batches_total", 1)
        self._add("hymt_batch_requests", requests, gauge=True)
        self._add("hymt_batch_rows", rows, gauge=True)
        self._add("hymt_texts_total", rows)

    def generation(self, *, seconds: float, input_tokens: int, output_tokens: int) -> None:
        self._emit("hymt_generation_latency_seconds", seconds)
        self._add("hymt_input_tokens_total", input_tokens)
        self._add("hymt_output_tokens_total", output_tokens)
        if seconds > 0:
            self._add("hymt_output_tokens_per_second", output_tokens / seconds, gauge=True)
