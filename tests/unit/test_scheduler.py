"""The scheduler on tiny random models (CPU): rows joining and leaving a running batch, on the
fast runner and on transformers' forward, on a serving thread and stepped by the caller."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import torch
from runner_helpers import scheduler_for
from test_fast_engine import hf_generate, tiny_model
from transformers import PreTrainedModel

from hymt_serve.core.errors import ContextTooLong, EngineFailed, QueueFull
from hymt_serve.core.types import FinishReason, GenerationResult, GenerationRow, SamplingParams
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.hf_forward import HFRunner
from hymt_serve.engine.runners.prefill import PREFILL_TOKENS
from hymt_serve.engine.scheduler.jobs import Readback
from hymt_serve.engine.scheduler.loop import Scheduler
from hymt_serve.request.errors import as_service_error

PROMPTS = (
    (1, 17, 250, 33, 91, 402, 5),
    (1, 300, 12),
    (1, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53),
    (1, 9, 8, 7),
    (1, 500, 501, 502, 503, 504),
    (1, 60, 61),
)
MAX_NEW = (40, 6, 13, 1, 22, 9)


def result(tokens: list[int], finish: FinishReason) -> GenerationResult:
    return GenerationResult(" ".join(map(str, tokens)), tuple(tokens), finish)


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_model()


@pytest.fixture(scope="module")
def expected(model: PreTrainedModel) -> list[list[int]]:
    return [hf_generate(model, p, n) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]


def batcher_for(
    model: PreTrainedModel,
    *,
    slots: int = 4,
    max_waiting: int = 100,
    stop_ids: Sequence[int] = (),
    before_prefill: object = None,
) -> Scheduler:
    """A scheduler over the fast runner, serving on its own thread."""
    fast = build_fast_runner(model, max_batch_size=slots, max_seq_len=64)
    batcher = Scheduler(
        fast,
        stop_ids,
        result,
        max_seq_len=64,
        max_waiting=max_waiting,
        before_prefill=before_prefill,  # type: ignore[arg-type]
    )
    batcher.start()
    return batcher


@pytest.fixture
def batcher(model: PreTrainedModel) -> Iterator[Scheduler]:
    running = batcher_for(model)
    yield running
    running.close()


def wait_for(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_rows_joining_a_running_batch_get_their_own_tokens(
    batcher: Scheduler, expected: list[list[int]]
) -> None:
    first = batcher.submit(GenerationRow(PROMPTS[0], MAX_NEW[0]))
    wait_for(lambda: batcher.stats["steps"] >= 5)
    later = [
        batcher.submit(GenerationRow(p, n)) for p, n in zip(PROMPTS[1:], MAX_NEW[1:], strict=True)
    ]
    results = [f.result(timeout=60) for f in [first, *later]]
    for got, want, new in zip(results, expected, MAX_NEW, strict=True):
        assert list(got.token_ids) == want
        assert len(want) == new and got.finish_reason == "length"
    # Six rows through four slots: the last rows waited for slots that earlier rows left.
    assert batcher.stats["prefill_rows"] == 6 and batcher.stats["finished"] == 6
    assert batcher.describe()["running"] == 0


def test_a_second_wave_reuses_slots_with_fresh_penalty_state(
    batcher: Scheduler, model: PreTrainedModel
) -> None:
    # top_k 1 makes sampling the argmax of the penalised logits: comparable with transformers.
    penalised = SamplingParams(temperature=1.0, top_p=1.0, top_k=1, repetition_penalty=1.3)
    for _ in range(2):
        futures = [
            batcher.submit(GenerationRow(p, n, penalised))
            for p, n in zip(PROMPTS[:4], MAX_NEW[:4], strict=True)
        ]
        for future, prompt, new in zip(futures, PROMPTS, MAX_NEW, strict=False):
            assert list(future.result(timeout=60).token_ids) == hf_generate(
                model, prompt, new, penalty=1.3
            )


def test_stop_tokens_end_a_row_early(model: PreTrainedModel, expected: list[list[int]]) -> None:
    reference = expected[0]
    stop = reference[12]
    cut = reference.index(stop)
    batcher = batcher_for(model, stop_ids=[stop])
    try:
        got = batcher.submit(GenerationRow(PROMPTS[0], MAX_NEW[0])).result(timeout=60)
    finally:
        batcher.close()
    assert list(got.token_ids) == reference[:cut] and got.finish_reason == "stop"


def test_a_row_that_stops_leaves_the_batch_at_the_next_step(
    model: PreTrainedModel, expected: list[list[int]]
) -> None:
    """A stop token (EOS, for a real model) is only known once the host reads the step back:
    the row must not keep its slot, and its caller wait, for several more steps. On the CPU a
    read-back is there at once, so the row ends with the step that sampled its stop token."""
    reference = expected[0]
    cuts = sorted({reference.index(token) for token in reference[2:14]} - {0, 1})
    assert len(cuts) >= 3  # stops at several steps, not only at one that a period would hit
    for cut in cuts:
        scheduler = scheduler_for(
            build_fast_runner(model, max_batch_size=2, max_seq_len=64), stop_ids=[reference[cut]]
        )
        future = scheduler.submit(GenerationRow(PROMPTS[0], MAX_NEW[0]))
        scheduler.run([future])
        assert list(future.result().token_ids) == reference[:cut]
        # token 0 comes from the prompt's pass, token t from decode step t
        assert scheduler.stats["steps"] == cut, f"stop sampled at step {cut}"


@pytest.fixture
def host_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read-backs as on a GPU whose steps the host has run ahead of: never there when the host
    looks, so it waits for one only when it must (on the CPU they are there at once)."""
    monkeypatch.setattr(Readback, "ready", lambda self: False)


@pytest.mark.parametrize("ahead", [False, True], ids=["readback-at-once", "host-ahead"])
def test_a_row_at_its_length_takes_no_step_past_it(
    model: PreTrainedModel, expected: list[list[int]], ahead: bool, request: pytest.FixtureRequest
) -> None:
    """A row leaves the batch with the step that gives it its last token, before the host has
    read that step back: its slot serves the next row at once, its tokens arrive later."""
    if ahead:
        request.getfixturevalue("host_ahead")
    rows = [i for i, new in enumerate(MAX_NEW) if new > 1]  # one token: no decode step at all
    scheduler = scheduler_for(build_fast_runner(model, max_batch_size=4, max_seq_len=64))
    futures = [scheduler.submit(GenerationRow(PROMPTS[i], MAX_NEW[i])) for i in rows]
    scheduler.run(futures)
    assert [list(f.result().token_ids) for f in futures] == [expected[i] for i in rows]
    # a row is in exactly the decode steps that give it tokens 2..max_new
    assert scheduler.stats["row_steps"] == sum(MAX_NEW[i] - 1 for i in rows)


def test_a_failure_fails_the_rows_whose_read_back_was_still_due(
    model: PreTrainedModel, expected: list[list[int]], host_ahead: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    scheduler = scheduler_for(build_fast_runner(model, max_batch_size=4, max_seq_len=64))
    short = scheduler.submit(GenerationRow(PROMPTS[1], 6))
    long = scheduler.submit(GenerationRow(PROMPTS[0], MAX_NEW[0]))

    def failing_step() -> None:
        raise MemoryError("injected")

    with torch.inference_mode():  # as run() steps
        for _ in range(MAX_NEW[0]):
            scheduler.step()
            if scheduler.describe()["running"] == 1:
                break
        assert scheduler.describe()["running"] == 1 and scheduler.stats["steps"] == 5
        assert not short.done()  # out of the batch, its tokens not read back yet
        monkeypatch.setattr(scheduler._runner, "recorded_step", failing_step)
        scheduler.step()
    for future in (short, long):
        with pytest.raises(EngineFailed, match="MemoryError"):
            future.result(timeout=0)
    monkeypatch.undo()  # the next rows are served, from free slots
    after = [scheduler.submit(GenerationRow(p, n)) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    scheduler.run(after)
    assert [list(f.result().token_ids) for f in after] == expected


def test_streamed_tokens_add_up_to_the_result(
    batcher: Scheduler, expected: list[list[int]]
) -> None:
    pieces: list[list[int]] = []
    future = batcher.submit(GenerationRow(PROMPTS[0], MAX_NEW[0]), on_tokens=pieces.append)
    got = future.result(timeout=60)
    assert [t for piece in pieces for t in piece] == list(got.token_ids) == expected[0]
    assert len(pieces) > 1  # delivered as it went, not once at the end


def test_too_many_waiting_rows_are_refused_at_once(model: PreTrainedModel) -> None:
    gate = threading.Event()
    batcher = batcher_for(model, slots=1, max_waiting=2, before_prefill=lambda rows: gate.wait())
    try:
        first = batcher.submit(GenerationRow(PROMPTS[1], 3))
        wait_for(lambda: batcher.describe()["waiting"] == 0)  # taken, held in its prefill
        queued = [batcher.submit(GenerationRow(PROMPTS[1], 3)) for _ in range(2)]
        with pytest.raises(QueueFull) as refused:
            batcher.submit(GenerationRow(PROMPTS[1], 3))
        assert as_service_error(refused.value).status == 503
        gate.set()
        for future in [first, *queued]:
            assert len(future.result(timeout=60).token_ids) == 3
    finally:
        gate.set()
        batcher.close()
    assert batcher.stats["rejected"] == 1


def test_closing_fails_the_running_and_the_waiting_rows(model: PreTrainedModel) -> None:
    """close() ends the serving thread; every row still running or waiting gets an error
    (none is left waiting on its future)."""
    gate = threading.Event()
    batcher = batcher_for(model, slots=1, before_prefill=lambda rows: gate.wait())
    running = batcher.submit(GenerationRow(PROMPTS[1], 40))
    wait_for(lambda: batcher.describe()["waiting"] == 0)  # taken, held in its prefill
    waiting = [batcher.submit(GenerationRow(PROMPTS[0], 40)) for _ in range(2)]
    threading.Timer(0.5, gate.set).start()  # the prefill ends while close() waits
    batcher.close()
    for future in [running, *waiting]:
        assert future.exception(timeout=30) is not None


def test_a_failing_prefill_fails_only_its_rows(
    model: PreTrainedModel, expected: list[list[int]]
) -> None:
    def explode_on_seven(rows: Sequence[GenerationRow]) -> None:
        if any(row.max_new_tokens == 7 for row in rows):
            raise MemoryError("injected")

    batcher = batcher_for(model, before_prefill=explode_on_seven)
    try:
        running = batcher.submit(GenerationRow(PROMPTS[0], MAX_NEW[0]))
        wait_for(lambda: batcher.stats["steps"] >= 3)
        doomed = batcher.submit(GenerationRow(PROMPTS[1], 7))
        with pytest.raises(EngineFailed, match="generation failed: MemoryError"):
            doomed.result(timeout=60)
        assert list(running.result(timeout=60).token_ids) == expected[0]
        after = batcher.submit(GenerationRow(PROMPTS[2], MAX_NEW[2])).result(timeout=60)
        assert list(after.token_ids) == expected[2]
    finally:
        batcher.close()


def test_a_failure_after_the_prefill_fails_the_batch_and_the_thread_goes_on(
    model: PreTrainedModel, expected: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error while the admitted rows join the batch (here: loading the step buffers) fails
    them and the running rows, frees every slot, and the next rows are served."""
    batcher = batcher_for(model, slots=2)
    runner = batcher._runner
    add = runner.add
    calls = {"n": 0}

    def add_failing_second_time(*args: object) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError("injected")
        add(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "add", add_failing_second_time)
    try:
        running = batcher.submit(GenerationRow(PROMPTS[0], MAX_NEW[0]))
        wait_for(lambda: batcher.stats["steps"] >= 3)
        joining = batcher.submit(GenerationRow(PROMPTS[1], MAX_NEW[1]))
        for future in (joining, running):
            with pytest.raises(EngineFailed, match="MemoryError"):
                future.result(timeout=60)
        after = [
            batcher.submit(GenerationRow(p, n))
            for p, n in zip(PROMPTS[2:4], MAX_NEW[2:4], strict=True)
        ]
        assert [list(f.result(timeout=60).token_ids) for f in after] == expected[2:4]
    finally:
        batcher.close()


def test_rows_that_do_not_fit_are_refused_on_submit(batcher: Scheduler) -> None:
    with pytest.raises(ContextTooLong, match="prompt \\+ max_new_tokens is 71") as refused:
        batcher.submit(GenerationRow(PROMPTS[0], 64))
    assert as_service_error(refused.value).status == 413


def test_cancelled_rows_are_skipped(model: PreTrainedModel) -> None:
    gate = threading.Event()
    batcher = batcher_for(model, slots=1, before_prefill=lambda rows: gate.wait())
    try:
        first = batcher.submit(GenerationRow(PROMPTS[1], 3))
        wait_for(lambda: batcher.describe()["waiting"] == 0)
        dropped = batcher.submit(GenerationRow(PROMPTS[2], 5))
        assert dropped.cancel()
        kept = batcher.submit(GenerationRow(PROMPTS[3], 2))
        gate.set()
        assert len(first.result(timeout=60).token_ids) == 3
        assert len(kept.result(timeout=60).token_ids) == 2
    finally:
        gate.set()
        batcher.close()
    assert batcher.stats["prefill_rows"] == 2


def test_the_caller_can_step_until_its_rows_are_done(
    model: PreTrainedModel, expected: list[list[int]]
) -> None:
    """Batch mode and offline use: no serving thread; run() steps on the calling thread and
    streams reach their listener on that thread too."""
    scheduler = scheduler_for(build_fast_runner(model, max_batch_size=4, max_seq_len=64))
    threads: set[int] = set()
    pieces: list[list[int]] = []

    def listen(ids: list[int]) -> None:
        threads.add(threading.get_ident())
        pieces.append(ids)

    futures = [
        scheduler.submit(GenerationRow(p, n), listen if i == 0 else None)
        for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW, strict=True))
    ]
    scheduler.run(futures)
    assert [list(f.result().token_ids) for f in futures] == expected
    assert [t for piece in pieces for t in piece] == expected[0] and len(pieces) > 1
    assert threads == {threading.get_ident()}


@pytest.fixture(scope="module")
def hf_model() -> PreTrainedModel:
    return tiny_model()


def hf_scheduler(model: PreTrainedModel, slots: int = 4, **options: object) -> Scheduler:
    return scheduler_for(HFRunner(model, pad_id=0, max_batch_size=slots), **options)


def test_transformers_runner_gives_transformers_tokens(
    hf_model: PreTrainedModel, expected: list[list[int]]
) -> None:
    """Left-padded prompts of different lengths, rows leaving at different steps, more rows
    than slots (the next batch starts when the last row of the previous one finished)."""
    scheduler = hf_scheduler(hf_model)
    futures = [scheduler.submit(GenerationRow(p, n)) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    scheduler.run(futures)
    assert [list(f.result().token_ids) for f in futures] == expected
    assert scheduler.stats["prefills"] == 2 and scheduler.stats["prefill_rows"] == 6


def test_transformers_runner_starts_every_waiting_row_together(hf_model: PreTrainedModel) -> None:
    """More prompt tokens than the fast runner admits at once: the transformers runner, which
    takes new rows only when idle, still starts them in one batch (not one batch after another)."""
    rows = [GenerationRow(tuple(range(3, 3 + 40)), 4) for _ in range(30)]
    assert sum(len(row.prompt_ids) for row in rows) > PREFILL_TOKENS
    scheduler = hf_scheduler(hf_model, slots=32)
    futures = [scheduler.submit(row) for row in rows]
    scheduler.run(futures)
    assert all(len(f.result().token_ids) == 4 for f in futures)
    assert scheduler.stats["prefills"] == 1 and scheduler.stats["steps"] == 3


def test_transformers_runner_samples_and_penalises_like_the_fast_runner(
    hf_model: PreTrainedModel,
) -> None:
    penalised = SamplingParams(temperature=1.0, top_p=1.0, top_k=1, repetition_penalty=1.3)
    rows = [GenerationRow(PROMPTS[0], 15, penalised), GenerationRow(PROMPTS[2], 15)]
    scheduler = hf_scheduler(hf_model)
    futures = [scheduler.submit(row) for row in rows]
    scheduler.run(futures)
    assert list(futures[0].result().token_ids) == hf_generate(hf_model, PROMPTS[0], 15, 1.3)
    assert list(futures[1].result().token_ids) == hf_generate(hf_model, PROMPTS[2], 15)


def test_transformers_runner_failing_prefill_fails_only_its_row(
    hf_model: PreTrainedModel, expected: list[list[int]]
) -> None:
    """The batch's prefill fails: each row is tried alone; the culprit fails, the first good
    row starts a batch, the others wait for the next one (the runner takes one at a time)."""

    def explode_on_seven(rows: Sequence[GenerationRow]) -> None:
        if any(row.max_new_tokens == 7 for row in rows):
            raise torch.OutOfMemoryError("injected")

    scheduler = hf_scheduler(hf_model, before_prefill=explode_on_seven)
    good = [GenerationRow(p, n) for p, n in zip(PROMPTS[:3], MAX_NEW[:3], strict=True)]
    rows = [GenerationRow(PROMPTS[1], 7), *good]
    futures = [scheduler.submit(row) for row in rows]
    scheduler.run(futures)
    error = futures[0].exception()
    assert error is not None and as_service_error(error).status == 507
    assert [list(f.result().token_ids) for f in futures[1:]] == expected[:3]
