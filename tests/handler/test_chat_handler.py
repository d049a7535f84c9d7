"""The chat form through the handler with a fake engine: choices, stop strings, streams,
translations of the last user message, and refusals, each in its own slot of a batch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import FakeEngine, SentParts, make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.types import GenerationRow, OnTokens
from hymt_serve.request import openai_api, openai_reply

USER = [{"role": "user", "content": "hello there"}]


def serve(bodies: list[Any], **settings: Any) -> tuple[list[Any], list[int], Any]:
    handler = HunyuanMTHandler()
    context = make_context({"model_path": "/m", "max_new_tokens": 64, **settings})
    handler.initialize(context)
    set_batch(context, len(bodies))
    out = handler.handle([{"body": body} for body in bodies], context)
    assert isinstance(out, list)
    statuses = [context.get_response_status(i)[0] for i in range(len(bodies))]
    return [json.loads(text) for text in out], statuses, context


def test_chat_and_plain_requests_share_a_batch(fake_engine: FakeEngine) -> None:
    bodies = [
        {"messages": [{"role": "system", "content": "be nice"}, *USER], "n": 2},
        {"text": "plain", "target_lang": "de"},
        {"prompt": "a completion", "max_tokens": 4},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    ]
    out, statuses, _ = serve(bodies)
    assert statuses == [200, 200, 200, 400]
    assert fake_engine.calls == [4]  # two choices, the plain text and the prompt: one batch
    chat = out[0]
    assert [c["text"] for c in chat["choices"]] == ["HELLO THERE"] * 2
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert chat["prompt"] == "chat" and chat["request_id"] == "req-0"
    prompt_tokens = len("[system] be nice [user]\n\nhello there")
    assert chat["usage"] == {"input_tokens": prompt_tokens, "output_tokens": 22}
    assert out[1]["translation"] == "PLAIN"
    assert out[2]["choices"] == [
        {"index": 0, "text": "A CO", "finish_reason": "length", "output_tokens": 4}
    ]
    assert out[3]["error_type"] == "invalid_request" and out[3]["field"] == "messages[0].content[0]"


def test_choices_of_a_seeded_request_get_seeds_of_their_own(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows: list[GenerationRow] = []
    submit = fake_engine.submit

    def recording(row: GenerationRow, on_tokens: OnTokens | None = None) -> Any:
        rows.append(row)
        return submit(row, on_tokens)

    monkeypatch.setattr(fake_engine, "submit", recording)
    serve([{"messages": USER, "n": 3, "temperature": 0.9, "seed": 11, "max_tokens": 500}])
    seeds = [row.sampling.seed for row in rows if row.sampling is not None]
    assert len(set(seeds)) == 3 and seeds[0] == 11
    assert {row.max_new_tokens for row in rows} == {64}  # the server's cap
    assert {row.sampling.temperature for row in rows if row.sampling} == {0.9}


def test_stop_strings_end_the_text_and_count_its_tokens(fake_engine: FakeEngine) -> None:
    out, _, _ = serve([{"messages": [{"role": "user", "content": "one. two. three"}], "stop": "."}])
    assert out[0]["choices"][0] == {
        "index": 0,
        "text": "ONE",
        "finish_reason": "stop",
        "output_tokens": 4,  # "ONE." : through the token that completed the stop string
    }


def test_a_streamed_chat_sends_each_choices_deltas(
    fake_engine: FakeEngine, sent_parts: SentParts
) -> None:
    body = {"messages": [{"role": "user", "content": "ab##cd"}], "n": 2, "stream": True}
    out, statuses, context = serve([body, {"text": "x", "target_lang": "fr", "stream": True}])
    assert statuses == [200, 200]
    lines = [json.loads(line) for request, line in sent_parts.events() if request == "req-0"]
    by_choice = {0: "", 1: ""}
    for line in lines:
        assert set(line) == {"delta", "index", "request_id"}
        by_choice[line["index"]] += line["delta"]
    assert by_choice == {0: "AB##CD", 1: "AB##CD"}
    assert [c["text"] for c in out[0]["choices"]] == ["AB##CD"] * 2
    plain = [json.loads(line) for request, line in sent_parts.events() if request == "req-1"]
    assert all(set(line) == {"delta", "request_id"} for line in plain)
    assert context.get_response_content_type(0) == "application/x-ndjson"


def test_a_streamed_stop_string_never_reaches_the_client(
    fake_engine: FakeEngine, sent_parts: SentParts
) -> None:
    body = {"messages": [{"role": "user", "content": "ab##cd"}], "stream": True, "stop": ["##"]}
    out, _, _ = serve([body])
    deltas = "".join(json.loads(line)["delta"] for _, line in sent_parts.events())
    assert deltas == out[0]["choices"][0]["text"] == "AB"
    assert out[0]["choices"][0]["finish_reason"] == "stop"


def test_our_fields_translate_the_last_user_message(fake_engine: FakeEngine) -> None:
    body = {
        "messages": [{"role": "system", "content": "You translate."}, *USER],
        "target_lang": "de",
        "source_lang": "en",
        "n": 2,
    }
    out, statuses, _ = serve([body])
    assert statuses == [200]
    prompt = (
        "Translate the following segment into German, without additional explanation.\n\n"
        "hello there"
    )
    assert fake_engine.prompts == [prompt, prompt]  # the model card's prompt, no system turn
    reply = out[0]
    assert [c["text"] for c in reply["choices"]] == ["HELLO THERE"] * 2
    assert (reply["prompt"], reply["source_lang"], reply["target_lang"]) == ("en", "en", "de")
    assert reply["usage"]["input_tokens"] == len(prompt)


def test_a_translation_with_auto_source_says_what_was_detected(fake_engine: FakeEngine) -> None:
    body = {"prompt": "Le train part à sept heures.", "target_lang": "en", "source_lang": "auto"}
    out, _, _ = serve([body])
    assert out[0]["detected"]["language"] == "fr" and out[0]["source_lang"] is None


def test_chat_form_errors_have_the_request_apis_body(fake_engine: FakeEngine) -> None:
    bodies = [
        {"messages": USER, "target_lang": "xx"},
        {"messages": USER, "n": 99},
        {"messages": [{"role": "user", "content": "y" * 5000}]},
        {"messages": USER, "max_tokens": -1},
    ]
    out, statuses, _ = serve(bodies)
    assert statuses == [400, 400, 413, 400]
    assert [o["error_type"] for o in out] == [
        "unsupported_language",
        "invalid_request",
        "payload_too_large",
        "invalid_request",
    ]
    # the front end turns them into OpenAI's errors
    errors = [openai_reply.error_from_reply(s, o) for s, o in zip(statuses, out, strict=True)]
    assert [(e.status, e.param) for e in errors] == [
        (400, "target_lang"),
        (400, "n"),
        (400, "messages"),
        (400, "max_tokens"),
    ]
    assert errors[2].code == "context_length_exceeded"


def test_a_prompt_over_the_token_limit_is_a_413(fake_engine: FakeEngine) -> None:
    out, statuses, _ = serve([{"prompt": "z" * 300}], max_input_tokens=64, max_chars_per_text=4000)
    assert statuses == [413] and out[0]["field"] == "prompt"
    assert "prompt of" in out[0]["error"]


def test_the_openai_module_round_trip(fake_engine: FakeEngine) -> None:
    """What a route does: parse the OpenAI body, send call.forward, render the reply."""
    call = openai_api.parse_chat({"model": "hunyuan-mt", "messages": USER, "n": 2}, ["hunyuan-mt"])
    out, statuses, _ = serve([call.forward])
    body = openai_reply.response(call, out[0])
    assert statuses == [200] and body["object"] == "chat.completion"
    assert [c["message"]["content"] for c in body["choices"]] == ["HELLO THERE"] * 2
    assert body["usage"]["completion_tokens"] == 22
