"""The handler's batch logic with a fake engine: statuses, order, errors, describe."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import FakeEngine, make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.request.errors import OutOfMemory

SETTINGS = {
    "model_path": "/unused",
    "max_new_tokens": 20,
    "max_texts_per_request": 4,
    "max_chars_per_text": 100,
    "max_input_tokens": 150,
}


def run(handler: HunyuanMTHandler, bodies: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    context = handler.context
    set_batch(context, len(bodies))
    out = handler.handle([{"body": body} for body in bodies], context)
    assert len(out) == len(bodies)
    return [(context.get_response_status(i)[0], json.loads(text)) for i, text in enumerate(out)]


@pytest.fixture
def handler(fake_engine: FakeEngine) -> HunyuanMTHandler:
    h = HunyuanMTHandler()
    h.initialize(make_context(SETTINGS))
    return h


def test_one_bad_request_does_not_fail_its_batch(
    handler: HunyuanMTHandler, fake_engine: FakeEngine
) -> None:
    replies = run(
        handler,
        [
            {"text": "hello", "target_lang": "fr", "source_lang": "en"},
            {"text": "x", "target_lang": "klingon"},
            {"text": ["ab", "cd"], "target_lang": "zh"},
            b"\xff not utf-8",
            {"text": "y" * 101, "target_lang": "en"},
        ],
    )
    assert [status for status, _ in replies] == [200, 400, 200, 400, 413]
    assert replies[0][1]["translation"] == "HELLO"
    assert [t["text"] for t in replies[2][1]["translations"]] == ["AB", "CD"]
    assert replies[1][1]["error_type"] == "unsupported_language"
    assert replies[1][1]["request_id"] == "req-1"
    assert replies[4][1]["error_type"] == "payload_too_large"
    assert fake_engine.calls == [3]  # the valid rows of the batch went to the engine at once


def test_max_new_tokens_caps_output(handler: HunyuanMTHandler) -> None:
    [(status, body)] = run(
        handler, [{"text": "abcdefgh", "target_lang": "de", "max_new_tokens": 3}]
    )
    assert status == 200
    item = body["translations"][0]
    assert (item["text"], item["output_tokens"], item["finish_reason"]) == ("ABC", 3, "length")
    assert item["input_tokens"] == body["usage"]["input_tokens"] > 8


def test_prompt_over_the_token_limit_is_413_not_truncated(handler: HunyuanMTHandler) -> None:
    # The English template is ~80 ids in the fake engine: 99 characters pass the character
    # limit (100) but make a prompt over max_input_tokens (150).
    replies = run(
        handler,
        [
            {"text": ["short", "z" * 99], "target_lang": "de"},
            {"text": "z" * 40, "target_lang": "de"},
        ],
    )
    assert [status for status, _ in replies] == [413, 200]
    assert replies[0][1]["error"].startswith("text[1] makes a prompt of")
    assert replies[0][1]["allowed"] == "at most 150 prompt tokens per text"


def test_engine_failure_fails_the_batch_with_json_500(
    handler: HunyuanMTHandler, fake_engine: FakeEngine
) -> None:
    fake_engine.failure = RuntimeError("kernel exploded")
    replies = run(handler, [{"text": "a", "target_lang": "en"}, {"text": "b", "target_lang": "xx"}])
    assert [status for status, _ in replies] == [500, 400]
    assert replies[0][1]["error_type"] == "generation_failed"
    assert "kernel exploded" not in replies[0][1]["error"]
    fake_engine.failure = None
    assert run(handler, [{"text": "a", "target_lang": "en"}])[0][0] == 200  # still serving


def test_out_of_memory_is_507(handler: HunyuanMTHandler, fake_engine: FakeEngine) -> None:
    fake_engine.failure = OutOfMemory("out of memory", allowed="retry")
    [(status, body)] = run(handler, [{"text": "a", "target_lang": "en"}])
    assert (status, body["error_type"]) == (507, "out_of_memory")


def test_all_bad_batch_never_calls_the_engine(
    handler: HunyuanMTHandler, fake_engine: FakeEngine
) -> None:
    replies = run(handler, [{"text": ""}, {}])
    assert [status for status, _ in replies] == [400, 400]
    assert fake_engine.calls == []


def test_describe(handler: HunyuanMTHandler) -> None:
    context = handler.context
    set_batch(context, 1, [{"describe": "True"}])
    [text] = handler.handle([{"body": None}], context)
    described = json.loads(text)
    assert described["engine"]["engine"] == "fake"
    assert described["settings"]["max_new_tokens"] == 20


def test_user_text_is_not_logged_above_debug(
    handler: HunyuanMTHandler, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    run(
        handler,
        [
            {"text": "secret-sentence-42", "target_lang": "fr"},
            {"text": "secret-2", "target_lang": "??"},
        ],
    )
    assert caplog.records  # the handler does log at INFO ...
    assert "secret" not in caplog.text.lower()  # ... but never the text


def test_bad_settings_stop_initialize(fake_engine: FakeEngine) -> None:
    from hymt_serve.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="max_new_tokens"):
        HunyuanMTHandler().initialize(make_context({**SETTINGS, "max_new_tokens": -1}))
