"""The serving benchmark's latency split from TorchServe's metrics page
(``loadtest/serving/latency_split.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "loadtest/serving"))
from latency_split import parse, split  # noqa: E402

PAGE = """\
# HELP ts_inference_latency_microseconds Cumulative inference duration in microseconds
# TYPE ts_inference_latency_microseconds counter
ts_inference_latency_microseconds{model_name="mt",model_version="v",hostname="a",} 1.25E7
ts_inference_latency_microseconds{model_name="mt",model_version="v",hostname="b",} 5.0E6
ts_inference_requests_total{model_name="mt",model_version="v",hostname="a",} 150.0
ts_inference_requests_total{model_name="mt",model_version="v",hostname="b",} 50.0
ts_queue_latency_microseconds{model_name="mt",model_version="v",hostname="a",} 2000.0
hymt_generation_latency_seconds_bucket{ModelName="hunyuan-mt",Level="Model",le="0.1",} 190.0
hymt_generation_latency_seconds_count{ModelName="hunyuan-mt",Level="Model",} 200.0
hymt_generation_latency_seconds_sum{ModelName="hunyuan-mt",Level="Model",} 15.0
hymt_output_tokens_per_second{ModelName="hunyuan-mt",Level="Model",} NaN
"""


def test_the_page_is_summed_over_label_sets() -> None:
    sums = parse(PAGE)
    assert sums["ts_inference_latency_microseconds"] == pytest.approx(1.75e7)
    assert sums["ts_inference_requests_total"] == 200
    assert sums["ts_queue_latency_microseconds"] == 2000
    assert sums["hymt_generation_latency_seconds_count"] == 200  # not the bucket's 190
    assert sums["hymt_generation_latency_seconds_sum"] == 15


def test_a_level_splits_into_outside_front_end_and_engine() -> None:
    before = parse(PAGE)
    after = dict(before)
    after["ts_inference_requests_total"] += 100
    after["ts_inference_latency_microseconds"] += 100 * 90_000  # 90 ms each in the front end
    after["ts_queue_latency_microseconds"] += 100 * 500
    after["hymt_generation_latency_seconds_count"] += 100
    after["hymt_generation_latency_seconds_sum"] += 100 * 0.082  # 82 ms waiting for the engine
    found = split(before, after, client_mean_ms=93.5)
    assert found == {
        "frontend_ms": 90.0,
        "frontend_queue_ms": 0.5,
        "engine_round_trip_ms": 82.0,
        "outside_frontend_ms": 3.5,
        "frontend_to_engine_ms": 8.0,
    }


def test_a_level_without_requests_splits_into_nothing() -> None:
    page = parse(PAGE)
    assert set(split(page, page, None).values()) == {None}
