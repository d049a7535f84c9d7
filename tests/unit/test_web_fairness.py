"""The front end's fair sharing of TorchServe (hymt_serve.web.fairness): bounded fan-out, the
front-end-wide upstream slots, per-client limits. Fake posts on one event loop, no server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hymt_serve.web import fairness
from hymt_serve.web.fairness import Busy, KeyLimits, Upstream, fan_out

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the front end's loop under uvicorn


class Recorder:
    """A post that records how many calls were in flight at once, and answers from a plan."""

    def __init__(self, answer: Any = None, delay: float = 0.01) -> None:
        self.answer = answer or (lambda body: (200, {"echo": body["i"]}))
        self.delay = delay
        self.in_flight = self.most = self.calls = 0
        self.bulk: list[bool] = []

    async def __call__(
        self, model: str, body: dict[str, Any], *, bulk: bool = False
    ) -> tuple[int, dict[str, Any]]:
        self.bulk.append(bulk)
        self.calls += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        return self.answer(body)  # type: ignore[no-any-return]


async def test_fan_out_keeps_order_and_at_most_a_window_in_flight() -> None:
    post = Recorder()
    bodies = [{"i": i} for i in range(40)]
    answers = await fan_out(post, "m", bodies, window=3)
    assert [answer[1]["echo"] for answer in answers] == list(range(40))
    assert post.most == 3
    assert all(post.bulk)  # several chunks: bulk calls
    await fan_out(post, "m", [{"i": 0}])
    await fan_out(post, "m", [{"i": 0}, {"i": 1}], bulk=False)
    assert post.bulk[40:] == [False, False, False]


async def test_fan_out_stops_sending_after_the_first_error() -> None:
    post = Recorder(lambda body: (400, {"error": "bad"}) if body["i"] == 2 else (200, {}))
    answers = await fan_out(post, "m", [{"i": i} for i in range(200)], window=2)
    assert answers[-1] == (400, {"error": "bad"}) and len(answers) == 3
    assert post.calls < 10  # not the 200 that were asked


async def test_fan_out_raises_what_a_call_raised_after_the_answers_before_it() -> None:
    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["i"] == 3:
            raise Busy(503, "full")
        return 200, {}

    post = Recorder(answer)
    with pytest.raises(Busy):
        await fan_out(post, "m", [{"i": i} for i in range(100)], window=2)
    assert post.calls < 10


async def test_fan_out_sends_a_busy_chunk_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fairness, "BUSY_BACKOFF_S", 0.001)
    refusals = {"left": 2}

    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["i"] == 1 and refusals["left"]:
            refusals["left"] -= 1
            return 503, {"error": "full", "error_type": "server_busy"}
        return 200, {"echo": body["i"]}

    answers = await fan_out(Recorder(answer), "m", [{"i": i} for i in range(3)])
    assert [status for status, _ in answers] == [200, 200, 200]
    assert refusals["left"] == 0


async def test_fan_out_gives_up_on_a_chunk_that_stays_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fairness, "BUSY_BACKOFF_S", 0.001)
    busy = (503, {"error": "full", "error_type": "overloaded"})
    post = Recorder(lambda body: busy)
    assert await fan_out(post, "m", [{"i": 0}]) == [busy]
    assert post.calls == 1 + fairness.BUSY_RETRIES


async def _size(size: int | None) -> int | None:
    return size


async def test_upstream_slots_are_three_quarters_of_the_queue_and_never_exceeded() -> None:
    upstream = Upstream(lambda: _size(8), wait_s=5)
    assert await upstream.limit() == 6
    post = Recorder(delay=0.02)

    async def through_upstream(
        model: str, body: dict[str, Any], *, bulk: bool = False
    ) -> tuple[int, dict[str, Any]]:
        async with upstream.slot():
            return await post(model, body)

    # three requests of 20 chunks each, windows of 4: twelve would be in flight without slots
    await asyncio.gather(*(fan_out(through_upstream, "m", [{"i": i}] * 20, 4) for i in range(3)))
    assert post.calls == 60 and post.most == 6
    assert await upstream.counts() == {"in_flight": 0, "bulk": 0, "waiting": 0, "limit": 6}


async def test_calls_wait_for_the_queue_size_being_asked() -> None:
    """The first calls all wait for TorchServe's answer: none goes past the limit it gives."""
    asked = asyncio.Event()

    async def size() -> int:
        await asked.wait()
        return 4

    upstream = Upstream(size, wait_s=5)
    waiting = [asyncio.ensure_future(upstream.acquire()) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in waiting)  # none went ahead on the default
    asked.set()
    await asyncio.sleep(0.05)
    assert sum(task.done() for task in waiting) == 3  # three quarters of 4
    for _ in range(3):
        upstream.release()
    await asyncio.gather(*waiting)
    for _ in range(2):
        upstream.release()


async def test_bulk_calls_go_one_at_a_time_while_others_are_in_flight() -> None:
    upstream = Upstream(lambda: _size(100), wait_s=5)
    alone = [asyncio.ensure_future(upstream.acquire(True)) for _ in range(20)]
    await asyncio.sleep(0.1)
    assert (await upstream.counts())["bulk"] == fairness.BULK_ALONE  # an idle server: up to 8
    await upstream.acquire()  # another client's call
    for _ in range(fairness.BULK_ALONE):
        upstream.release(True)
    await asyncio.sleep(0.1)
    assert (await upstream.counts())["bulk"] == fairness.BULK_SHARED  # two beside it
    upstream.release()  # the other call ends: bulk fills up again once it stays quiet
    await asyncio.sleep(0.1)
    assert (await upstream.counts())["bulk"] == fairness.BULK_SHARED
    await asyncio.sleep(fairness.QUIET_S + 0.2)
    assert (await upstream.counts())["bulk"] == fairness.BULK_ALONE
    while (await upstream.counts())["in_flight"]:
        upstream.release(True)
        await asyncio.sleep(0.01)
    await asyncio.gather(*alone)
    assert await upstream.counts() == {"in_flight": 0, "bulk": 0, "waiting": 0, "limit": 75}


async def test_upstream_answers_busy_when_no_slot_comes_in_time() -> None:
    upstream = Upstream(lambda: _size(1), wait_s=0.05)
    async with upstream.slot():
        with pytest.raises(Busy) as refused:
            await upstream.acquire()
    assert refused.value.status == 503 and "busy" in refused.value.message
    assert "scale" not in refused.value.message
    await upstream.acquire()  # the slot is free again
    upstream.release()


async def test_a_cancelled_wait_takes_no_slot() -> None:
    upstream = Upstream(lambda: _size(1), wait_s=5)
    await upstream.acquire()
    waiter = asyncio.ensure_future(upstream.acquire())
    await asyncio.sleep(0.02)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    upstream.release()
    assert await upstream.counts() == {"in_flight": 0, "bulk": 0, "waiting": 0, "limit": 1}


async def test_upstream_asks_the_queue_size_again_until_it_is_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fairness, "ASK_EVERY_S", 0.0)
    answers = [None, None, 40]
    upstream = Upstream(lambda: _size(answers.pop(0)))
    assert await upstream.limit() == int(fairness.DEFAULT_QUEUE * fairness.UPSTREAM_SHARE)
    assert await upstream.limit() == int(fairness.DEFAULT_QUEUE * fairness.UPSTREAM_SHARE)
    assert await upstream.limit() == 30 and await upstream.limit() == 30  # known: not asked
    assert answers == []


def test_each_client_has_its_own_limit() -> None:
    limits = KeyLimits(per_key=2)
    with limits.hold("key:a"), limits.hold("key:a"):
        with pytest.raises(Busy) as refused, limits.hold("key:a"):
            pass
        assert refused.value.status == 429 and "at most 2" in refused.value.message
        with limits.hold("key:b"):  # another client is not affected
            pass
    with limits.hold("key:a"), limits.hold("key:a"):  # released when the requests ended
        pass
