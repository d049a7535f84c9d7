"""Stop strings end a row in the engine, on a tiny real model (CPU): the row stops generating at
the token that completes the string (fewer tokens generated and counted than without it), on
the fast engine and on transformers' forward, not only cut from the text afterwards."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fakes import make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationResult, GenerationRow, SamplingParams
from hymt_serve.engine.engine import Engine, load_engine

MAX_NEW = 24
PROMPT = [ChatTurn("user", "Write a long story about a cat and a dog.")]
# Sampled with a seed (greedy, the random model repeats one token), sharp enough that the fast
# engine's float differences between batch shapes on the CPU do not change a draw.
SEEDED = SamplingParams(temperature=0.3, top_p=1.0, top_k=0, repetition_penalty=1.5, seed=1)


@pytest.fixture(scope="module", params=["fast", "hf"])
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Engine:
    raw = {"model_path": str(tiny_model_dir), "engine": request.param, "max_new_tokens": MAX_NEW}
    return load_engine(Settings.from_mapping(raw, environ={}))


def without_stop(engine: Engine) -> tuple[GenerationRow, GenerationResult]:
    """A seeded sampled row and its result: the seed decides its tokens in any batch."""
    ids = tuple(engine.encode_chat(PROMPT))
    row = GenerationRow(ids, MAX_NEW, SEEDED)
    [whole] = engine.generate([row])
    assert whole.output_tokens == MAX_NEW, whole  # the random model ran to its length
    return row, whole


@pytest.fixture(scope="module")
def unstopped(engine: Engine) -> tuple[GenerationRow, GenerationResult]:
    """:func:`without_stop` on the module's engine, generated once for the tests that share
    that engine (seeded: the same tokens every time)."""
    return without_stop(engine)


def stop_in_the_middle(engine: Engine, whole: GenerationResult) -> tuple[str, int]:
    """A stop string of two tokens' text that the row first completes at a token of its middle
    third, and that token count."""
    ids = whole.token_ids
    for count in range(MAX_NEW // 3, 2 * MAX_NEW // 3):
        two, prev, full = (engine.decode(ids[:k]) for k in (count - 2, count - 1, count))
        stop = full[len(two) :].strip()
        if len(stop) >= 3 and "\ufffd" not in stop and stop not in prev and stop in full:
            return stop, count
    pytest.skip("the random model's text has no usable stop string")


def test_a_stop_string_ends_the_row_at_the_token_that_completes_it(
    engine: Engine, unstopped: tuple[GenerationRow, GenerationResult]
) -> None:
    row, whole = unstopped
    stop, count = stop_in_the_middle(engine, whole)
    stats = engine.scheduler.stats
    steps_before, ended_before = stats["row_steps"], stats["stop_strings"]
    [stopped] = engine.generate([replace(row, stop=(stop,))])
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == whole.token_ids[:count]  # seeded: the same tokens, fewer
    assert stopped.output_tokens < whole.output_tokens
    assert stats["stop_strings"] == ended_before + 1
    # The row left the batch within a read-back or two of the stop, not at its length.
    assert stats["row_steps"] - steps_before <= count + 2 < MAX_NEW


def test_rows_without_the_string_run_on_beside_a_stopped_row(
    engine: Engine, unstopped: tuple[GenerationRow, GenerationResult]
) -> None:
    row, whole = unstopped
    stop, _ = stop_in_the_middle(engine, whole)
    stopped, plain, other = engine.generate(
        [replace(row, stop=(stop,)), row, replace(row, stop=("never in this text \u2603",))]
    )
    # The row stops where its text first holds the stop string; the rows beside it run on.
    # (Past the stop the others are compared with each other, not with the row alone: a batch
    # of another shape may change a near-tied draw late in a random model's text.)
    assert stopped.finish_reason == "stop" and stopped.output_tokens < MAX_NEW
    assert stop in engine.decode(stopped.token_ids)
    assert stop not in engine.decode(stopped.token_ids[:-1])
    assert stopped.token_ids == whole.token_ids[: stopped.output_tokens]
    assert plain.token_ids[: stopped.output_tokens] == stopped.token_ids
    assert plain.token_ids == other.token_ids and plain.output_tokens == MAX_NEW
    assert (plain.finish_reason, other.finish_reason) == ("length", "length")


def test_a_streamed_row_sends_no_token_past_the_stop(
    engine: Engine, unstopped: tuple[GenerationRow, GenerationResult]
) -> None:
    row, whole = unstopped
    stop, count = stop_in_the_middle(engine, whole)
    sent: list[int] = []
    future = engine.submit(replace(row, stop=(stop,)), sent.extend)
    engine.run([future])
    assert tuple(sent) == future.result().token_ids == whole.token_ids[:count]


# Through the handler: the chat form's stop reaches the engine.


def test_the_chat_forms_stop_ends_generation_in_the_engine(tiny_model_dir: Path) -> None:
    """The reply is cut before the stop string, and the engine generated fewer tokens than the
    same request without ``stop`` (its steps count them; a cut alone would not change it)."""
    handler = HunyuanMTHandler()
    settings = {"model_path": str(tiny_model_dir), "max_new_tokens": MAX_NEW, "engine": "hf"}
    context = make_context(settings, model_dir=tiny_model_dir)
    handler.initialize(context)
    body: dict[str, Any] = {
        "messages": [{"role": m.role, "content": m.content} for m in PROMPT],
        **{"temperature": SEEDED.temperature, "top_p": 1.0, "top_k": 0, "seed": SEEDED.seed},
        "repetition_penalty": SEEDED.repetition_penalty,
    }
    engine: Engine = handler._service().engine  # type: ignore[attr-defined]
    stats = engine.scheduler.stats

    def serve(fields: dict[str, Any]) -> tuple[dict[str, Any], float]:
        before = stats["row_steps"]
        set_batch(context, 1)
        [text] = handler.handle([{"body": {**body, **fields}}], context)  # type: ignore[misc]
        assert context.get_response_status(0)[0] == 200, text
        return json.loads(text), stats["row_steps"] - before

    whole, whole_steps = serve({})
    assert whole["usage"]["output_tokens"] == MAX_NEW
    _, generated = without_stop(engine)  # the same row, straight to the engine
    stop, count = stop_in_the_middle(engine, generated)
    stopped, stopped_steps = serve({"stop": [stop]})
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and stop not in choice["text"]
    assert whole["choices"][0]["text"].startswith(choice["text"])
    assert stopped["usage"]["output_tokens"] == count < whole["usage"]["output_tokens"]
    assert stopped_steps < whole_steps


def test_the_engine_process_ends_a_row_at_its_stop_string_too(tiny_model_dir: Path) -> None:
    """Async mode: the row crosses to the engine's own process with its stop strings, which
    ends it there (the child returns ids only; the worker decodes and cuts the text)."""
    # a test module's helper (async calls) and how long closing its engine process waits
    from test_async_handler import CLOSE_WAIT_S, one_call

    settings = {"model_path": str(tiny_model_dir), "max_new_tokens": MAX_NEW, "engine": "hf"}
    handler = HunyuanMTHandler()
    frontend = {"asyncCommunication": True}
    context = make_context(settings, tiny_model_dir, batch_size=1, frontend=frontend)
    handler.initialize(context)
    engine = load_engine(Settings.from_mapping(settings, environ={}))  # this process's, alike
    _, whole = without_stop(engine)
    stop, count = stop_in_the_middle(engine, whole)
    body = {
        "messages": [{"role": m.role, "content": m.content} for m in PROMPT],
        **{"temperature": SEEDED.temperature, "top_p": 1.0, "top_k": 0, "seed": SEEDED.seed},
        "repetition_penalty": SEEDED.repetition_penalty,
        "stop": stop,
    }
    try:
        status, _, text = asyncio.run(one_call(handler, context, body, "stop-1"))
        described = handler.describe()["engine"]["scheduler"]
    finally:
        handler._service().engine.close(timeout=CLOSE_WAIT_S)  # type: ignore[attr-defined]
    assert status == 200, text
    choice = json.loads(text)["choices"][0]
    assert (choice["finish_reason"], choice["output_tokens"]) == ("stop", count)
    assert described["stop_strings"] == 1
    assert described["row_steps"] < MAX_NEW
