"""The recorder's updates through TorchServe's real metric cache: counters summed and gauges
kept between flushes, errors and latencies sent at once, nothing lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from hymt_serve.request.metrics import TorchServeRecorder

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float, list[str]]]:
    """Every (metric, value, labels) the recorder hands to TorchServe."""
    calls: list[tuple[str, float, list[str]]] = []
    monkeypatch.setattr(
        TorchServeRecorder,
        "_emit",
        lambda self, name, value, *extra: calls.append((name, value, list(extra))),
    )
    return calls


def recorder(interval_s: float, clock: Any = time.monotonic) -> TorchServeRecorder:
    cache = MetricsCacheYamlImpl(config_file_path=str(REPO / "configs/metrics.yaml"))
    cache.initialize_cache()
    return TorchServeRecorder(cache, "hunyuan-mt", interval_s=interval_s, clock=clock)


def test_a_quiet_workers_first_update_goes_at_once_then_they_are_summed(
    sent: list[tuple[str, float, list[str]]],
) -> None:
    clock = Clock()
    metrics = recorder(60.0, clock)  # the timer never fires within this test
    metrics.requests(1)
    assert sent == [("hymt_requests_total", 1, [])]
    for rows in (2, 3, 4):
        metrics.requests(1)
        metrics.batch(requests=1, rows=rows)
    metrics.error("invalid_request")
    metrics.generation(seconds=0.5, input_tokens=10, output_tokens=5)
    assert sent[1:] == [
        ("hymt_errors_total", 1, ["invalid_request"]),
        ("hymt_generation_latency_seconds", 0.5, []),
    ]  # the rest waits for the flush
    del sent[:]
    metrics.flush()
    assert dict((name, value) for name, value, _ in sent) == {
        "hymt_requests_total": 3,
        "hymt_batches_total": 3,
        "hymt_texts_total": 9,
        "hymt_batch_rows": 4,  # a gauge: the last value
        "hymt_batch_requests": 1,
        "hymt_input_tokens_total": 10,
        "hymt_output_tokens_total": 5,
        "hymt_output_tokens_per_second": 10.0,
    }
    clock.now += 61  # a quiet interval later: at once again
    del sent[:]
    metrics.requests(2)
    assert sent == [("hymt_requests_total", 2, [])]


def test_the_timer_flushes_what_waits(sent: list[tuple[str, float, list[str]]]) -> None:
    metrics = recorder(0.2)
    metrics.requests(1)
    metrics.requests(5)
    metrics.requests(7)
    assert sent == [("hymt_requests_total", 1, [])]
    deadline = time.monotonic() + 10
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sent == [("hymt_requests_total", 1, []), ("hymt_requests_total", 12, [])]


def test_updates_reach_torchserves_metric_objects() -> None:
    metrics = recorder(60.0)
    seen: list[tuple[float, list[str]]] = []
    target = metrics._metrics["hymt_texts_total"]
    target.add_or_update = lambda value, labels: seen.append((value, labels))  # type: ignore[method-assign]
    metrics.batch(requests=1, rows=3)  # its first counter goes at once, the texts wait
    assert seen == []
    metrics.flush()
    assert seen == [(3, ["hunyuan-mt", "Model"])]
