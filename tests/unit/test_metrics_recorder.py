"""The handler's metrics (``hymt_serve.request.metrics.TorchServeRecorder``) as TorchServe's
metric cache receives them: in async mode counters and gauges are summed or replaced on the
event loop and sent once a flush interval, histogram observations one by one; without a
running loop (batch mode) every update goes out at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ts.metrics.metric_type_enum")

from hymt_serve.request import metrics


class Cache:
    """TorchServe's metric cache as the recorder uses it: each metric records its updates."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float, list[str]]] = []

    def get_metric(self, name: str, kind: Any) -> Any:
        cache = self

        class Metric:
            def add_or_update(self, value: float, dimensions: list[str]) -> None:
                cache.sent.append((name, value, dimensions))

        return Metric()


def record_three_requests(recorder: metrics.TorchServeRecorder) -> None:
    for n in (3, 5, 7):
        recorder.requests(1)
        recorder.batch(requests=1, rows=n)
        recorder.generation(seconds=0.1 * n, input_tokens=10 * n, output_tokens=n)
    recorder.error("unsupported_language")


def test_async_mode_sends_sums_and_last_values_once_a_flush() -> None:
    cache = Cache()

    async def run() -> list[tuple[str, float, list[str]]]:
        recorder = metrics.TorchServeRecorder(cache, "hunyuan-mt", coalesce=True)
        record_three_requests(recorder)
        before = list(cache.sent)
        await asyncio.sleep(metrics.FLUSH_S + 0.2)
        return before

    before_flush = asyncio.run(run())
    observed = [value for name, value, _ in before_flush]
    assert {name for name, _, _ in before_flush} == {"hymt_generation_latency_seconds"}
    assert observed == pytest.approx([0.3, 0.5, 0.7])  # every observation, as it came
    flushed = {(name, tuple(dims)): value for name, value, dims in cache.sent[3:]}
    model = ("hunyuan-mt", "Model")
    assert flushed == {
        ("hymt_requests_total", model): 3,
        ("hymt_batches_total", model): 3,
        ("hymt_batch_requests", model): 1,
        ("hymt_batch_rows", model): 7,  # a gauge: the last value
        ("hymt_texts_total", model): 15,
        ("hymt_input_tokens_total", model): 150,
        ("hymt_output_tokens_total", model): 15,
        ("hymt_output_tokens_per_second", model): pytest.approx(10.0),
        ("hymt_errors_total", (*model, "unsupported_language")): 1,
    }
    assert len(cache.sent) == 3 + len(flushed)  # one line per metric and label set


def test_without_a_running_loop_every_update_is_sent_at_once() -> None:
    cache = Cache()
    record_three_requests(metrics.TorchServeRecorder(cache, "hunyuan-mt", coalesce=True))
    assert len(cache.sent) == 3 * 9 + 1  # nine updates per request, and the error
    assert [v for n, v, _ in cache.sent if n == "hymt_batch_rows"] == [3, 5, 7]


def test_label_values_survive_the_front_ends_parser() -> None:
    """TorchServe's worker prints ``Name:value`` pairs; the front end keeps a pair only when it
    splits on ``:`` into two, and the metric fails when one is dropped. On a GPU the engine's
    device is ``cuda:0``."""
    from ts.metrics.dimension import Dimension

    cache = Cache()
    recorder = metrics.TorchServeRecorder(cache, "hunyuan-mt")
    info = {"engine": "fast", "attention": "sdpa", "dtype": "bfloat16", "device": "cuda:0"}
    recorder.engine_info({**info, "quantization": "fp8,static|x"})
    ((name, _, values),) = cache.sent
    assert name == "hymt_engine_info"
    names = [*metrics.BASE_DIMENSIONS, *metrics.ENGINE_DIMENSIONS]
    printed = ",".join(str(Dimension(n, v)) for n, v in zip(names, values, strict=True))
    pairs = [pair.split(":") for pair in printed.split(",")]
    assert all(len(pair) == 2 for pair in pairs), printed
    assert dict(pairs)["Device"] == "cuda_0"
    assert "|" not in printed
