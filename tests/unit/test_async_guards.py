"""The async-mode guards against TorchServe 0.12.0's per-request costs, on TorchServe's own
Context and metric cache: a copy made by ``copy.deepcopy`` (what ts/async_service.py does for
every request) keeps each request's ids, headers and metric ids apart, as a deep copy does;
and the entry-point print leaves stdout, while every other line stays."""

from __future__ import annotations

import copy
import io
import logging
import sys
from pathlib import Path

import pytest

from hymt_serve.request import async_guards

context_module = pytest.importorskip("ts.context")
metric_cache = pytest.importorskip("ts.metrics.metric_cache_yaml_impl")

METRICS_YAML = Path(__file__).resolve().parents[2] / "configs/metrics.yaml"


def _context() -> object:
    metrics = metric_cache.MetricsCacheYamlImpl(config_file_path=str(METRICS_YAML))
    metrics.initialize_cache()
    return context_module.Context(
        "hunyuan-mt",
        "/tmp/model",
        {"model": {}},
        1,
        None,
        "0.12.0",
        metrics=metrics,
        model_yaml_config={"handler": {}},
    )


def test_a_copy_is_shallow_but_keeps_requests_apart(caplog: pytest.LogCaptureFixture) -> None:
    context = _context()
    async_guards.cheap_context_copies(context)
    async_guards.cheap_context_copies(context)  # once is enough; twice changes nothing
    assert type(context).__mro__[1] is context_module.Context
    first, second = copy.deepcopy(context), copy.deepcopy(context)
    assert isinstance(first, context_module.Context) and first is not context
    assert first.model_yaml_config is context.model_yaml_config  # shared, not copied
    for clone, request in ((first, "r-1"), (second, "r-2")):  # what TorchServe sets
        clone.request_ids = {0: request}
        clone.request_processor = [request]
        clone.metrics.request_ids = {0: request}
    assert context.request_ids is None and context.metrics.request_ids is None
    assert first.get_request_id(0) == "r-1" and second.get_request_id(0) == "r-2"
    assert first.metrics is not second.metrics
    with caplog.at_level(logging.INFO):  # each copy's metric lines carry its own request
        first.metrics.add_time("PredictionTime", 3.0)
        second.metrics.add_time("PredictionTime", 4.0)
    lines = [r.getMessage() for r in caplog.records if "PredictionTime" in r.getMessage()]
    assert len(lines) == 2 and lines[0].endswith(",r-1") and lines[1].endswith(",r-2")


def test_the_entry_point_print_is_dropped_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    async_guards.drop_entry_point_prints()
    async_guards.drop_entry_point_prints()  # not wrapped twice
    print("[METRICS]hymt_requests_total.Count:1|#ModelName:hunyuan-mt")
    print("self._entry_point=<bound method HunyuanMTHandler.handle of <handler>>")
    print("")
    print("a line", "with parts", end="!\n")
    sys.stdout.flush()
    assert out.getvalue() == (
        "[METRICS]hymt_requests_total.Count:1|#ModelName:hunyuan-mt\n\na line with parts!\n"
    )
