"""OpenAI's chat and completion APIs in and out of the chat form (request/openai_api.py and
openai_reply.py), and the request bodies of translation tools, taken from their sources
(tests/fixtures/openai_tools)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hymt_serve.core.settings import Settings
from hymt_serve.request import openai_api as api
from hymt_serve.request import openai_reply as reply_api
from hymt_serve.request.chat import ChatRequest, parse_body
from hymt_serve.request.errors import Overloaded, PayloadTooLarge, UnsupportedLanguage

MODELS = ("hunyuan-mt",)
USER = [{"role": "user", "content": "Hello"}]
FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "openai_tools").glob("*.json"))
# Limits a deployment serving pyvideotrans's default prompt (about 4,100 characters) sets.
SETTINGS = Settings.from_mapping(
    {"model_path": "/m", "max_new_tokens": 256, "max_chars_per_text": 8000}, environ={}
)


def chat(**fields: Any) -> api.Call:
    return api.parse_chat({"model": "hunyuan-mt", "messages": USER, **fields}, MODELS)


def refused(call: Any, status: int = 400, param: str | None = None) -> api.OpenAIError:
    with pytest.raises(api.OpenAIError) as caught:
        call()
    error = caught.value
    assert error.status == status, error.message
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}
    if param is not None:
        assert error.param == param
    return error


def test_a_chat_body_becomes_the_chat_form() -> None:
    call = chat(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
        max_completion_tokens=64,
        temperature=0.3,
        top_p=0.9,
        n=2,
        stop=["\n"],
        seed=1,
        user="someone",
        metadata={"a": "b"},
        top_k=40,
        target_lang="de",
        frequency_penalty=0,
        response_format={"type": "text"},
        tools=None,
        logprobs=False,
    )
    assert call.forward == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "temperature": 0.3,
        "top_p": 0.9,
        "n": 2,
        "stop": ["\n"],
        "seed": 1,
        "top_k": 40,
        "target_lang": "de",
        "max_tokens": 64,
        "stream": False,
    }
    assert call.kind == "chat" and call.id.startswith("chatcmpl-") and call.n == 2
    assert call.characters == len("Be brief.") + len("Hi") and call.created > 1_700_000_000
    assert not call.stream and not call.include_usage


def test_the_forwarded_form_parses_in_the_handler() -> None:
    request = parse_body(chat(max_tokens=10, temperature=0).forward, SETTINGS)
    assert isinstance(request, ChatRequest)
    assert request.max_new_tokens == 10 and request.sampling is None


def test_bodies_arrive_as_bytes_too() -> None:
    raw = json.dumps({"model": "hunyuan-mt", "messages": USER}).encode()
    assert api.parse_chat(raw, MODELS).forward["messages"] == USER
    refused(lambda: api.parse_chat(b"{not json", MODELS))


def test_the_model_must_be_one_the_server_serves() -> None:
    error = refused(lambda: api.parse_chat({"model": "gpt-4o", "messages": USER}, MODELS), 404)
    assert error.code == "model_not_found" and error.param == "model"
    missing = refused(lambda: api.parse_chat({"messages": USER}, MODELS), param="model")
    assert missing.code == "missing_required_parameter"
    refused(lambda: api.parse_chat({"model": "hunyuan-mt"}, MODELS), param="messages")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": -1}, "presence_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"store": True}, "store"),
        ({"service_tier": "priority"}, "service_tier"),
        ({"logprobs": 0}, "logprobs"),  # JSON 0 is not false
        ({"foo": 1}, "foo"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
        ({"stream": "true"}, "stream"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "x"}]},
         "messages[0].tool_call_id"),
        ({"messages": [{"role": "assistant", "content": "Hi"}]}, "messages"),
    ],
)  # fmt: skip
def test_what_the_model_cannot_honour_is_a_clear_400(fields: dict[str, Any], param: str) -> None:
    error = refused(lambda: chat(**fields), param=param)
    assert error.type == "invalid_request_error" and error.message


def test_stream_options_ask_for_the_usage_chunk() -> None:
    call = chat(stream=True, stream_options={"include_usage": True})
    assert call.stream and call.include_usage and call.forward["stream"] is True


def test_a_completion_body_becomes_a_prompt() -> None:
    call = api.parse_completion(
        {"model": "hunyuan-mt", "prompt": ["Say hi"], "max_tokens": 5, "echo": False}, MODELS
    )
    assert call.kind == "completion" and call.id.startswith("cmpl-")
    assert call.forward == {"prompt": "Say hi", "max_tokens": 5, "stream": False}
    assert call.characters == 6


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
        ({"messages": USER}, "messages"),
    ],
)
def test_completion_options_the_model_cannot_honour(fields: dict[str, Any], param: str) -> None:
    body = {"model": "hunyuan-mt", "prompt": "x", **fields}
    refused(lambda: api.parse_completion(body, MODELS), param=param)


REPLY = {
    "choices": [
        {"index": 0, "text": "Hallo", "finish_reason": "stop", "output_tokens": 2},
        {"index": 1, "text": "Servus", "finish_reason": "length", "output_tokens": 3},
    ],
    "prompt": "chat",
    "usage": {"input_tokens": 11, "output_tokens": 5},
    "request_id": "r-1",
}


def test_a_chat_completion_response() -> None:
    call = chat(n=2)
    body = reply_api.response(call, REPLY)
    assert body == {
        "id": call.id,
        "object": "chat.completion",
        "created": call.created,
        "model": "hunyuan-mt",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hallo", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "Servus", "refusal": None},
                "logprobs": None,
                "finish_reason": "length",
            },
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        "system_fingerprint": None,
    }


def test_the_language_checks_outcome_is_an_extra_field() -> None:
    """A translating chat's reply says what the language check found: the completion carries
    the worst at the top, a stream each choice's on its finish chunk (nothing when unchecked:
    the exact bodies above)."""
    choices = [{**REPLY["choices"][0], "target_language": "retried"},
               {**REPLY["choices"][1], "target_language": "mismatch"}]  # fmt: skip
    checked = {**REPLY, "choices": choices, "target_language": "mismatch"}
    assert reply_api.response(chat(n=2), checked)["target_language"] == "mismatch"
    stream = reply_api.Stream(chat(n=2, stream=True))
    finishes = events(stream.event(checked))[:2]
    assert [c["target_language"] for c in finishes] == ["retried", "mismatch"]
    assert [c["choices"][0]["finish_reason"] for c in finishes] == ["stop", "length"]


def test_a_text_completion_response() -> None:
    call = api.parse_completion({"model": "hunyuan-mt", "prompt": "x"}, MODELS)
    body = reply_api.response(call, {**REPLY, "choices": REPLY["choices"][:1]})
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {"index": 0, "text": "Hallo", "logprobs": None, "finish_reason": "stop"}
    ]


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        (400, {"error": "n must be ...", "error_type": "invalid_request", "field": "n"},
         (400, "invalid_request_error", "n", None)),
        (400, UnsupportedLanguage("x", field="target_lang").body("r"),
         (400, "invalid_request_error", "target_lang", "unsupported_language")),
        (413, PayloadTooLarge("too long", field="messages").body("r"),
         (400, "invalid_request_error", "messages", "context_length_exceeded")),
        (413, b"", (400, "invalid_request_error", None, "context_length_exceeded")),
        (503, Overloaded("busy").body("r"), (503, "server_error", None, "overloaded")),
        (507, json.dumps({"error": "oom", "error_type": "out_of_memory"}).encode(),
         (503, "server_error", None, "out_of_memory")),
        (503, {"code": 503, "type": "ServiceUnavailableException",
               "message": "Model has no worker to serve inference request."},
         (503, "server_error", None, "overloaded")),
        (500, {"error": "boom", "error_type": "generation_failed"},
         (500, "server_error", None, None)),
        (400, {"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed"},
         (500, "server_error", None, None)),
        (404, "not json", (500, "server_error", None, None)),
    ],
)  # fmt: skip
def test_model_server_errors_in_openai_shape(
    status: int, body: Any, want: tuple[int, str, str | None, str | None]
) -> None:
    error = reply_api.error_from_reply(status, body)
    assert (error.status, error.type, error.param, error.code) == want
    assert error.message


def test_the_front_ends_own_errors() -> None:
    assert api.unauthorized().body()["error"]["code"] == "invalid_api_key"
    assert api.unauthorized().status == 401
    quota = api.quota_exceeded("over the key's character limit")
    assert (quota.status, quota.type, quota.code) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
    )
    assert api.rate_limited("slow down").status == 429
    assert api.model_not_found("x").body() == {
        "error": {
            "message": "The model 'x' does not exist.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def events(strings: list[str]) -> list[Any]:
    """The data of server-sent events ("[DONE]" as the string)."""
    out = []
    for event in strings:
        assert event.startswith("data: ") and event.endswith("\n\n")
        data = event[len("data: ") : -2]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_lines(n: int = 1) -> list[dict[str, Any]]:
    """The handler's NDJSON lines for a streamed chat of ``n`` choices."""
    lines = [{"delta": "Hal", "index": 0, "request_id": "r"}]
    if n > 1:
        lines.append({"delta": "Ser", "index": 1, "request_id": "r"})
    lines.append({"delta": "lo", "index": 0, "request_id": "r"})
    reply = {**REPLY, "choices": REPLY["choices"][:n]}
    return [*lines, reply]


def test_a_chat_stream_role_first_deltas_finish_reason_usage_done() -> None:
    call = chat(stream=True, stream_options={"include_usage": True}, n=2)
    stream = reply_api.Stream(call)
    sent = stream.opening()
    for line in stream_lines(2):
        sent += stream.event(line)
    assert stream.finished and stream.event({"delta": "late"}) == []
    data = events(sent)
    assert data[-1] == "[DONE]"
    chunks = data[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == call.id for c in chunks)
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}
    ] * 2
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]
    contents = [
        (c["choices"][0]["index"], c["choices"][0]["delta"].get("content")) for c in chunks[2:5]
    ]
    assert contents == [(0, "Hal"), (1, "Ser"), (0, "lo")]
    finishes = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in chunks[5:7]]
    assert finishes == [(0, "stop"), (1, "length")]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "total_tokens": 16,
    }


def test_a_stream_without_usage_has_no_usage_key() -> None:
    stream = reply_api.Stream(chat(stream=True))
    data = events(stream.opening() + [e for line in stream_lines() for e in stream.event(line)])
    assert all("usage" not in c for c in data[:-1]) and len(data) == 5


def test_a_completion_stream() -> None:
    call = api.parse_completion({"model": "hunyuan-mt", "prompt": "x", "stream": True}, MODELS)
    stream = reply_api.Stream(call)
    assert stream.opening() == []
    data = events([e for line in stream_lines() for e in stream.event(line)])
    assert [c["choices"][0]["text"] for c in data[:-1]] == ["Hal", "lo", ""]
    assert data[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(c["object"] == "text_completion" for c in data[:-1])


def test_a_stream_that_fails_or_breaks_ends_with_an_error_event() -> None:
    stream = reply_api.Stream(chat(stream=True))
    failed = events(stream.event({"error": "boom", "error_type": "generation_failed"}))
    assert failed[0]["error"]["type"] == "server_error" and failed[-1] == "[DONE]"
    assert stream.broken() == []
    cut = reply_api.Stream(chat(stream=True))
    cut.event({"delta": "a", "index": 0})
    assert events(cut.broken())[0]["error"]["message"].startswith("the model server's stream")
    bad = reply_api.Stream(chat(stream=True))
    refusal = events(bad.event({"error": "no", "error_type": "unsupported_language"}))
    assert refusal[0]["error"]["code"] == "unsupported_language"


def test_models() -> None:
    assert api.models_list(["hunyuan-mt"], 1_700_000_000) == {
        "object": "list",
        "data": [
            {"id": "hunyuan-mt", "object": "model", "created": 1_700_000_000, "owned_by": "tencent"}
        ],
    }


# The tools' own request bodies and ways of reading the reply.


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_a_tools_request_is_accepted_and_mapped(path: Path) -> None:
    fixture = json.loads(path.read_text())
    assert {"repository", "commit", "files", "where"} <= set(fixture["source"])
    expect = fixture["expect"]
    call = api.parse_chat(fixture["request"], MODELS)
    assert (call.kind, call.stream) == (expect["kind"], expect["stream"])
    request = parse_body(call.forward, SETTINGS)
    assert isinstance(request, ChatRequest)
    assert [list(turn) for turn in request.turns] == expect["turns"]
    assert request.max_new_tokens == SETTINGS.limits.max_new_tokens  # none asks for fewer
    if expect["greedy"]:
        assert request.sampling is None
    else:
        assert request.sampling is not None
        assert request.sampling.temperature == expect["temperature"]
    translation = expect["translation"]
    if translation is None:
        assert request.translation is None
        return
    assert request.translation is not None
    assert request.translation.texts == (translation["text"],)
    assert request.translation.source is not None
    assert request.translation.source.code == translation["source"]
    assert request.translation.target.code == translation["target"]


def fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES[0].parent / f"{name}.json").read_text()))


def test_subtitle_edit_reads_the_first_content_key() -> None:
    """Subtitle Edit takes the value of the first "content" key in the reply's JSON text."""
    call = api.parse_chat(fixture("subtitleedit")["request"], MODELS)
    text = json.dumps(reply_api.response(call, REPLY))
    first = text.index('"content"')
    assert json.loads("{" + text[first:].split(",", 1)[0] + "}") == {"content": "Hallo"}


def test_zotero_reads_the_stream_its_own_way() -> None:
    """zotero-pdf-translate splits the body on "data:", JSON-parses each piece (skipping what
    does not parse, such as [DONE]) and appends delta.content until a finish_reason."""
    call = api.parse_chat(fixture("zotero-pdf-translate")["request"], MODELS)
    stream = reply_api.Stream(call)
    body = "".join(stream.opening() + [e for line in stream_lines() for e in stream.event(line)])
    result = ""
    for piece in body.split("data:"):
        if not piece.strip():
            continue
        try:
            obj = json.loads(piece)
        except ValueError:
            continue
        choice = obj["choices"][0]
        result += choice["delta"].get("content") or ""
        if choice.get("finish_reason") is not None:
            break
    assert result == "Hallo"


def test_pyvideotrans_reads_finish_reason_and_the_tagged_text() -> None:
    call = api.parse_chat(fixture("pyvideotrans")["request"], MODELS)
    assert call.forward["max_tokens"] == 32768 and call.forward["temperature"] == 0.1
    body = reply_api.response(call, REPLY)
    assert body["choices"][0]["finish_reason"] == "stop"  # "length" makes it raise
    assert body["choices"][0]["message"]["content"] == "Hallo"


def test_a_refusal_names_the_limit_it_passed() -> None:
    body = PayloadTooLarge(
        "the messages hold 4155 characters", field="messages", allowed="at most 4000 characters"
    ).body("r")
    error = reply_api.error_from_reply(413, body)
    assert error.message == "the messages hold 4155 characters (allowed: at most 4000 characters)"
