"""Custom Prometheus metrics: declared once here, registered in ``initialize``, updated per batch.

TorchServe exports a model metric only when ``metrics.yaml`` (``metrics_config``) lists it under
``model_metrics``; ``configs/metrics.yaml`` does, and a unit test keeps it equal to
:data:`DECLARED`. Latencies are in seconds because Prometheus histograms use its default buckets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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
    """Sends metrics through TorchServe's metric cache (``context.metrics``)."""

    def __init__(self, cache: Any, model_name: str) -> None:
        from ts.metrics.metric_type_enum import MetricTypes

        self._model = model_name
        self._metrics = {
            spec.name: _registered(cache, spec, MetricTypes(spec.kind)) for spec in DECLARED
        }

    def _emit(self, name: str, value: float, *extra: str) -> None:
        self._metrics[name].add_or_update(value, [self._model, "Model", *extra])

    def engine_info(self, info: dict[str, str]) -> None:
        """Expose the engine's choices (attention kernel, dtype, ...) as a constant gauge."""
        labels = [str(info.get(dim.lower(), "unknown")) for dim in ENGINE_DIMENSIONS]
        self._emit("hymt_engine_info", 1, *labels)

    def requests(self, count: int) -> None:
        self._emit("hymt_requests_total", count)

    def error(self, error_type: str) -> None:
        self._emit("hymt_errors_total", 1, error_type)

    def batch(self, *, requests: int, rows: int) -> None:
        self._emit("hymt_batches_total", 1)
        self._emit("hymt_batch_requests", requests)
        self._emit("hymt_batch_rows", rows)
        self._emit("hymt_texts_total", rows)

    def generation(self, *, seconds: float, input_tokens: int, output_tokens: int) -> None:
        self._emit("hymt_generation_latency_seconds", seconds)
        self._emit("hymt_input_tokens_total", input_tokens)
        self._emit("hymt_output_tokens_total", output_tokens)
        if seconds > 0:
            self._emit("hymt_output_tokens_per_second", output_tokens / seconds)
