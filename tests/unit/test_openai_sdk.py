"""The official openai SDK reads what request/openai_reply.py writes, and sends what
request/openai_api.py accepts.

The SDK's HTTP client gets a transport that answers each call with this module's functions
(the work a ``/v1`` route does, minus TorchServe: the model server's reply is a fixed chat-form
reply). Sync, async, streaming and errors go through the SDK's own parsing and exception
classes; the routes' end-to-end tests run the same SDK against the web front end.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hymt_serve.request import openai_api as api
from hymt_serve.request import openai_reply as reply_api

MODELS = ("hunyuan-mt",)
SENT: list[dict[str, Any]] = []  # the bodies the SDK sent, for the tests to read


def reply_for(call: api.Call) -> dict[str, Any]:
    """The chat-form reply the handler would give: choice i answers "Hallo" + i exclamations."""
    choices = [
        {"index": i, "text": "Hallo" + "!" * i, "finish_reason": "stop", "output_tokens": 2 + i}
        for i in range(call.n)
    ]
    usage = {"input_tokens": 12, "output_tokens": sum(c["output_tokens"] for c in choices)}
    return {"choices": choices, "prompt": "chat", "usage": usage, "request_id": "r"}


def answer(request: httpx2.Request) -> httpx2.Response:
    if request.url.path.endswith("/models"):
        return httpx2.Response(200, json=api.models_list(MODELS, 1_700_000_000))
    body = json.loads(request.content)
    SENT.append(body)
    chat = request.url.path.endswith("/chat/completions")
    parse = api.parse_chat if chat else api.parse_completion
    try:
        call = parse(body, MODELS)
    except api.OpenAIError as error:
        return httpx2.Response(error.status, json=error.body())
    reply = reply_for(call)
    if not call.stream:
        return httpx2.Response(200, json=reply_api.response(call, reply))
    stream = reply_api.Stream(call)
    events = stream.opening()
    for choice in reply["choices"]:
        for piece in (choice["text"][:3], choice["text"][3:]):
            events += stream.event({"delta": piece, "index": choice["index"]})
    events += stream.event(reply)
    headers = {"content-type": "text/event-stream"}
    return httpx2.Response(200, headers=headers, content="".join(events).encode())


@pytest.fixture
def client() -> openai.OpenAI:
    SENT.clear()
    transport = httpx2.MockTransport(answer)
    return openai.OpenAI(
        api_key="k",
        base_url="http://front-end/v1",
        http_client=httpx2.Client(transport=transport),
        max_retries=0,
    )


def test_sync_chat(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="hunyuan-mt",
        messages=[{"role": "user", "content": "Hello"}],
        max_completion_tokens=30,
        temperature=0.2,
        n=2,
        seed=3,
        stop=["\n"],
        extra_body={"target_lang": "de"},
    )
    assert isinstance(reply, ChatCompletion)
    assert [c.message.content for c in reply.choices] == ["Hallo", "Hallo!"]
    assert reply.usage is not None and reply.usage.total_tokens == 12 + 5
    assert SENT[0]["target_lang"] == "de" and SENT[0]["max_completion_tokens"] == 30


def test_sync_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="hunyuan-mt",
            messages=[{"role": "user", "content": "Hello"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hallo"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 2


def test_completions(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="hunyuan-mt", prompt="Say hi", max_tokens=5)
    assert reply.object == "text_completion" and reply.choices[0].text == "Hallo"
    streamed = client.completions.create(model="hunyuan-mt", prompt="Say hi", stream=True)
    assert "".join(c.choices[0].text for c in streamed) == "Hallo"


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["hunyuan-mt"]


@pytest.mark.parametrize(
    ("fields", "kind", "param"),
    [
        ({"model": "gpt-4o"}, openai.NotFoundError, "model"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, openai.BadRequestError,
         "tools"),
        ({"response_format": {"type": "json_object"}}, openai.BadRequestError, "response_format"),
        ({"logprobs": True}, openai.BadRequestError, "logprobs"),
    ],
)  # fmt: skip
def test_errors_raise_the_sdks_exceptions(
    client: openai.OpenAI, fields: dict[str, Any], kind: type[openai.APIStatusError], param: str
) -> None:
    call: dict[str, Any] = {"model": "hunyuan-mt", "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(kind) as caught:
        client.chat.completions.create(**{**call, **fields})
    assert caught.value.param == param


def test_an_error_in_a_stream_raises() -> None:
    def failing(request: httpx2.Request) -> httpx2.Response:
        call = api.parse_chat(json.loads(request.content), MODELS)
        stream = reply_api.Stream(call)
        events = stream.opening() + stream.event({"delta": "Ha", "index": 0})
        events += stream.event({"error": "the engine failed", "error_type": "generation_failed"})
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               content="".join(events).encode())  # fmt: skip

    client = openai.OpenAI(
        api_key="k",
        base_url="http://front-end/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(failing)),
        max_retries=0,
    )
    stream = client.chat.completions.create(
        model="hunyuan-mt", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError, match="the engine failed"):
        list(stream)


def test_async_chat_and_stream() -> None:
    async def main() -> tuple[str | None, str]:
        async def answer_async(request: httpx2.Request) -> httpx2.Response:
            return answer(request)

        client = openai.AsyncOpenAI(
            api_key="k",
            base_url="http://front-end/v1",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answer_async)),
            max_retries=0,
        )
        messages: Any = [{"role": "user", "content": "Hello"}]
        reply = await client.chat.completions.create(model="hunyuan-mt", messages=messages)
        stream = await client.chat.completions.create(
            model="hunyuan-mt", messages=messages, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return reply.choices[0].message.content, text

    assert asyncio.run(main()) == ("Hallo", "Hallo")
