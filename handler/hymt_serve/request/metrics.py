"""Custom Prometheus metrics: declared once here, registered in ``initialize``, updated per batch.

TorchServe exports a model metric only when ``metrics.yaml`` (``metrics_config``) lists it under
``model_metrics``; ``configs/metrics.yaml`` does, and a unit test keeps it equal to
:data:`DECLARED`. Latencies are in seconds because Prometheus histograms use its default buckets.

Every update is a line the worker prints for the front end to parse. In async mode the
counters and gauges are coalesced on the worker's event loop and sent at most once every
:data:`FLUSH_S` seconds (sums and last values), which saves the worker and the front end a
parse per update; histogram observations go out one by one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

FLUSH_S = 1.0  # async mode: counters and gauges reach TorchServe at most this much later

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
    # Texts by target language and what the language check found: ok, unsure, retried, mismatch.
    MetricSpec(
        "hymt_target_language_total", "counter", "Count", (*BASE_DIMENSIONS, "Target", "Result")
    ),
    # The translation memory: rows served from it, rows looked up in vain, rows evicted.
    MetricSpec("hymt_memory_hits_total", "counter", "Count"),
    MetricSpec("hymt_memory_misses_total", "counter", "Count"),
    MetricSpec("hymt_memory_evictions_total", "counter", "Count"),
)


class Recorder(Protocol):
    """What the service reports; :class:`TorchServeRecorder` sends it to TorchServe."""

    def requests(self, count: int) -> None: ...
    def error(self, error_type: str) -> None: ...
    def batch(self, *, requests: int, rows: int) -> None: ...
    def generation(self, *, seconds: float, input_tokens: int, output_tokens: int) -> None: ...
    def target_language(self, target: str, result: str, count: int) -> None: ...
    def memory(self, *, hits: int, misses: int, evictions: int) -> None: ...


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

    def target_language(self, target: str, result: str, count: int) -> None:
        pass

    def memory(self, *, hits: int, misses: int, evictions: int) -> None:
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
    """Sends metrics through TorchServe's metric cache (``context.metrics``). With
    ``coalesce``, counters and gauges updated on a running event loop are summed (counters)
    or replaced (gauges) there and sent by one timer on that loop, :data:`FLUSH_S` after the
    first pending update: no thread of its own. Elsewhere every update is sent at once."""

    def __init__(self, cache: Any, model_name: str, *, coalesce: bool = False) -> None:
        # TorchServe's own package: present only where a worker runs this recorder.
        from ts.metrics.metric_type_enum import MetricTypes

        self._model = model_name
        self._metrics = {
            spec.name: _registered(cache, spec, MetricTypes(spec.kind)) for spec in DECLARED
        }
        self._kinds = {spec.name: spec.kind for spec in DECLARED}
        self._coalesce = coalesce
        self._pending: dict[tuple[str, tuple[str, ...]], float] = {}
        self._flush: asyncio.TimerHandle | None = None

    def _emit(self, name: str, value: float, *extra: str) -> None:
        kind = self._kinds[name]
        loop = _running_loop() if self._coalesce and kind != "histogram" else None
        if loop is None:
            self._send(name, value, extra)
            return
        key = (name, extra)
        self._pending[key] = self._pending.get(key, 0) + value if kind == "counter" else value
        if self._flush is None:
            self._flush = loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """Send the coalesced counters and gauges now."""
        self._flush = None
        pending, self._pending = self._pending, {}
        for (name, extra), value in pending.items():
            self._send(name, value, extra)

    def _send(self, name: str, value: float, extra: tuple[str, ...]) -> None:
        labels = [self._model, "Model", *map(label_value, extra)]
        self._metrics[name].add_or_update(value, labels)

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

    def target_language(self, target: str, result: str, count: int) -> None:
        self._emit("hymt_target_language_total", count, target, result)

    def memory(self, *, hits: int, misses: int, evictions: int) -> None:
        self._emit("hymt_memory_hits_total", hits)
        self._emit("hymt_memory_misses_total", misses)
        self._emit("hymt_memory_evictions_total", evictions)


_LABEL_SEPARATORS = str.maketrans(":,|", "___")


def label_value(value: str) -> str:
    """A dimension value TorchServe's front end can read back: ``:``, ``,`` and ``|`` become
    ``_``. The worker prints each dimension as ``Name:value``, comma-separated between ``|#``
    marks, and the front end (0.12.0's ``Metric.parse``) keeps a pair only when it splits on
    ``:`` into exactly two; a dropped pair (``Device:cuda:0``) fails every update of its metric
    ("Incorrect number of labels")."""
    return value.translate(_LABEL_SEPARATORS)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # batch mode: the handler runs on TorchServe's worker thread
        return None
