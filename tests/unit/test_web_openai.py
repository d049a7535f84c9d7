"""The front end's OpenAI routes (web/openai_routes.py) against the stub TorchServe
(tests/web_stub.py): keys, quotas and fairness, what goes to TorchServe, replies, streams and
every kind of refusal in OpenAI's shape. The official SDK against the real stack:
tests/integration/test_openai_client.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2  # what Starlette's test client answers with
import pytest
from starlette.testclient import TestClient
from web_stub import PREDICTIONS, Upstream, client_keys, mimetype, opened, serving, workdir
from werkzeug.wrappers import Request, Response

from hymt_serve.web import fairness
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys
from hymt_serve.web.torchserve import TORCHSERVE_BUSY

USER = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "hunyuan-mt", "messages": USER}
REPLY = {
    "choices": [{"index": 0, "text": "Hallo", "finish_reason": "stop", "output_tokens": 2}],
    "usage": {"input_tokens": 12, "output_tokens": 2},
    "prompt": "chat",
    "request_id": "r1",
}
DELTAS = [{"delta": "Hal", "index": 0, "request_id": "r1"}, {"delta": "lo", "index": 0}]
NDJSON = "application/x-ndjson"
ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/hunyuan-mt"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
]


def ndjson(*lines: Any) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def events(answer: httpx2.Response) -> list[Any]:
    """The data of each server-sent event ("[DONE]" as it is, the rest parsed)."""
    text = answer.text
    assert text.endswith("\n\n")
    found = []
    for event in text.split("\n\n")[:-1]:
        assert event.startswith("data: "), event
        data = event.removeprefix("data: ")
        found.append(data if data == "[DONE]" else json.loads(data))
    return found


def auth(keys: ClientKeys, index: int = 0) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys.keys[index].key}"}


def refusal(answer: httpx2.Response, status: int, kind: str, code: str | None) -> dict[str, Any]:
    """The answer's OpenAI error, checked to be one of ``status``, ``kind`` and ``code``."""
    assert answer.status_code == status, answer.text
    assert mimetype(answer) == "application/json"
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (kind, code), error
    assert error["message"]
    return dict(error)


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json", ("alice", "bob"))  # keys fit in a header


@contextmanager
def front(stub: Upstream, tmp_path: Path, keys: ClientKeys, **options: Any) -> Iterator[TestClient]:
    """The app in front of the ``stub`` TorchServe (``options``: create_app's)."""
    with opened(create_app(workdir(tmp_path, stub.url), client_keys=keys, **options)) as client:
        yield client


@pytest.fixture
def client(upstream: Upstream, tmp_path: Path, keys: ClientKeys) -> Iterator[TestClient]:
    with front(upstream, tmp_path, keys) as client:
        yield client


# --- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    ("headers", "says"),
    [({}, "didn't provide"), ({"Authorization": "Bearer not-a-key-of-this-server"}, "Incorrect"),
     ({"Authorization": "Basic YWxpY2U6c2VjcmV0"}, "Incorrect")],
    ids=["none", "wrong", "other-scheme"],
)  # fmt: skip
def test_every_route_needs_a_key_of_the_key_file_even_on_loopback(
    client: TestClient,
    upstream: Upstream,
    keys: ClientKeys,
    method: str,
    path: str,
    headers: dict[str, str],
    says: str,
) -> None:
    upstream.reply(PREDICTIONS, REPLY)
    body = {**CHAT, "prompt": "Hello"} if method == "POST" else None
    answer = client.request(method, path, json=body, headers=headers)
    error = refusal(answer, 401, "invalid_request_error", "invalid_api_key")
    assert says in error["message"]
    assert not upstream.forwarded() and keys.used(keys.keys[0]) == 0


def test_where_keys_are_required_everywhere_the_refusal_is_still_openais(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    """Off loopback (require_keys) the OpenAI routes check their keys themselves (OWN_KEYS):
    a client without one gets OpenAI's 401, not the page API's."""
    upstream.reply(PREDICTIONS, REPLY)
    with front(upstream, tmp_path, keys, require_keys=True) as client:
        for method, path in ROUTES:
            answer = client.request(method, path, json=CHAT)
            refusal(answer, 401, "invalid_request_error", "invalid_api_key")
        allowed = client.post("/v1/chat/completions", json=CHAT, headers=auth(keys))
    assert allowed.status_code == 200 and keys.used(keys.keys[0]) == len("Hello")


def test_models_are_listed_with_a_key(client: TestClient, keys: ClientKeys) -> None:
    listed = client.get("/v1/models", headers=auth(keys)).json()
    assert listed["object"] == "list"
    [card] = listed["data"]
    assert card["id"] == "hunyuan-mt" and card["object"] == "model" and card["owned_by"]
    assert card["created"] <= time.time()
    one = client.get("/v1/models/hunyuan-mt", headers=auth(keys))
    assert one.status_code == 200 and one.json() == card
    other = client.get("/v1/models/gpt-4o", headers=auth(keys))
    assert refusal(other, 404, "invalid_request_error", "model_not_found")["param"] == "model"


def test_other_v1_paths_get_openais_404(client: TestClient, keys: ClientKeys) -> None:
    """Clients probe /v1/embeddings and the like: they read OpenAI's error shape (401 without
    a key, then 404)."""
    for method, path in [
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/vector_stores"),
        ("POST", "/v1/x/y"),
    ]:
        answer = client.request(method, path, json={})
        refusal(answer, 401, "invalid_request_error", "invalid_api_key")
        answer = client.request(method, path, json={}, headers=auth(keys))
        error = refusal(answer, 404, "invalid_request_error", "unknown_url")
        assert error["message"] == f"Invalid URL ({method} {path})"
    # the routes it serves are not shadowed
    assert client.get("/v1/models", headers=auth(keys)).status_code == 200


# --- completions, whole -------------------------------------------------------------------------


def test_a_chat_completion_goes_as_the_chat_form_and_counts_its_characters(
    client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, REPLY)
    body = {
        **CHAT,
        "messages": [{"role": "system", "content": "Be brief."}, *USER],
        "max_completion_tokens": 30,
        "temperature": 0.2,
        "seed": 3,
        "target_lang": "de",
        "user": "someone",
    }
    answer = client.post("/v1/chat/completions", json=body, headers=auth(keys))
    assert answer.status_code == 200 and mimetype(answer) == "application/json"
    reply = answer.json()
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["model"] == "hunyuan-mt"
    assert reply["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hallo", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert reply["usage"] == {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
    [forwarded] = upstream.forwarded()
    assert forwarded.json() == {
        "messages": [{"role": "system", "content": "Be brief."}, *USER],
        "temperature": 0.2,
        "seed": 3,
        "target_lang": "de",
        "max_tokens": 30,
        "stream": False,
    }
    assert forwarded.headers["Authorization"] == "Bearer inference-key"
    assert keys.used(keys.keys[0]) == len("Be brief.") + len("Hello")
    assert keys.used(keys.keys[1]) == 0


def test_a_completion(client: TestClient, upstream: Upstream, keys: ClientKeys) -> None:
    upstream.reply(PREDICTIONS, REPLY)
    body = {"model": "hunyuan-mt", "prompt": ["Say hi"], "max_tokens": 5, "n": 1}
    answer = client.post("/v1/completions", json=body, headers=auth(keys))
    reply = answer.json()
    assert reply["object"] == "text_completion" and reply["id"].startswith("cmpl-")
    assert [choice["text"] for choice in reply["choices"]] == ["Hallo"]
    assert upstream.forwarded()[0].json() == {
        "prompt": "Say hi",
        "n": 1,
        "max_tokens": 5,
        "stream": False,
    }
    assert keys.used(keys.keys[0]) == len("Say hi")


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, None, None),
        ("/v1/chat/completions", b"", 400, None, None),
        ("/v1/chat/completions", {"model": "hunyuan-mt"}, 400, "missing_required_parameter",
         "messages"),
        ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400,
         "unsupported_parameter", "tools"),
        ("/v1/chat/completions", {**CHAT, "temprature": 1}, 400, "unknown_parameter",
         "temprature"),
        ("/v1/chat/completions", {**CHAT, "model": "gpt-4o"}, 404, "model_not_found", "model"),
        ("/v1/completions", {"model": "hunyuan-mt", "prompt": [1, 2]}, 400, None, "prompt"),
        ("/v1/completions", {"model": "hunyuan-mt", "prompt": "x", "echo": True}, 400,
         "unsupported_parameter", "echo"),
    ],
)  # fmt: skip
def test_a_bad_body_is_refused_before_torchserve_and_counts_nothing(
    client: TestClient,
    upstream: Upstream,
    keys: ClientKeys,
    path: str,
    body: Any,
    status: int,
    code: str | None,
    param: str | None,
) -> None:
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    headers = {**auth(keys), "Content-Type": "application/json"}
    answer = client.post(path, headers=headers, **sent)
    assert refusal(answer, status, "invalid_request_error", code)["param"] == param
    assert not upstream.forwarded() and keys.used(keys.keys[0]) == 0


# --- TorchServe's and the handler's refusals ----------------------------------------------------

BUSY = 'Model "hunyuan-mt" has no worker to serve inference request. Please use scale workers API.'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("status", "reply", "answered", "kind", "code", "param"),
    [
        (400, {"error": "'xx' is not a supported language", "error_type": "unsupported_language",
               "field": "target_lang"}, 400, "invalid_request_error", "unsupported_language",
         "target_lang"),
        (400, {"error": "temperature must be in [0, 2], got 5", "error_type": "invalid_request",
               "field": "temperature"}, 400, "invalid_request_error", None, "temperature"),
        (413, {"error": "the conversation has 5000 characters; at most 4000",
               "error_type": "payload_too_large", "field": "messages"}, 400,
         "invalid_request_error", "context_length_exceeded", "messages"),
        (413, b"", 400, "invalid_request_error", "context_length_exceeded", None),
        (503, {"code": 503, "type": "ServiceUnavailableException", "message": BUSY}, 503,
         "server_error", "overloaded", None),
        (503, {"error": "too many tokens waiting", "error_type": "overloaded"}, 503,
         "server_error", "overloaded", None),
        (507, {"error": "out of GPU memory", "error_type": "out_of_memory"}, 503, "server_error",
         "out_of_memory", None),
        (500, {"error": "generation failed", "error_type": "generation_failed"}, 500,
         "server_error", None, None),
    ],
)  # fmt: skip
def test_refusals_of_torchserve_and_the_handler_are_openais_and_given_back(
    client: TestClient,
    upstream: Upstream,
    keys: ClientKeys,
    stream: bool,
    status: int,
    reply: Any,
    answered: int,
    kind: str,
    code: str | None,
    param: str | None,
) -> None:
    upstream.reply(PREDICTIONS, reply, status)
    body = {**CHAT, "stream": stream, "target_lang": "xx"}
    answer = client.post("/v1/chat/completions", json=body, headers=auth(keys))
    error = refusal(answer, answered, kind, code)  # JSON even when a stream was asked for
    assert error["param"] == param
    assert "scale" not in error["message"]
    if status == 503 and not isinstance(reply, bytes) and "code" in reply:
        assert error["message"] == TORCHSERVE_BUSY
    if answered == 503:
        assert answer.headers["Retry-After"]
    assert keys.used(keys.keys[0]) == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_torchserve_out_of_reach_is_a_502(tmp_path: Path, keys: ClientKeys, stream: bool) -> None:
    with opened(create_app(workdir(tmp_path, "http://127.0.0.1:9"), client_keys=keys)) as client:
        body = {**CHAT, "stream": stream}
        answer = client.post("/v1/chat/completions", json=body, headers=auth(keys))
    error = refusal(answer, 502, "server_error", "server_unavailable")
    assert "cannot be reached" in error["message"]
    assert keys.used(keys.keys[0]) == 0


def test_a_reply_that_is_not_the_chat_forms_is_a_500(
    client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, {"translation": "Hallo"})  # a handler without the chat form
    answer = client.post("/v1/chat/completions", json=CHAT, headers=auth(keys))
    refusal(answer, 500, "server_error", None)
    assert keys.used(keys.keys[0]) == 0


# --- streams ------------------------------------------------------------------------------------


def test_a_stream_is_server_sent_events_ending_in_done(
    client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, ndjson(*DELTAS, REPLY), mimetype=NDJSON)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    answer = client.post("/v1/chat/completions", json=body, headers=auth(keys))
    assert answer.status_code == 200 and mimetype(answer) == "text/event-stream"
    assert answer.headers["Cache-Control"] == "no-cache"
    found = events(answer)
    assert found[-1] == "[DONE]"
    chunks = found[:-1]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hal"},
                      {"content": "lo"}, {}]  # fmt: skip
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 14
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert upstream.forwarded()[0].json() == {"messages": USER, "stream": True}
    assert keys.used(keys.keys[0]) == len("Hello")


def test_a_completion_streams_text_completion_chunks(
    client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, ndjson(*DELTAS, REPLY), mimetype=NDJSON)
    body = {"model": "hunyuan-mt", "prompt": "Say hi", "stream": True}
    found = events(client.post("/v1/completions", json=body, headers=auth(keys)))
    assert found[-1] == "[DONE]"
    assert {chunk["object"] for chunk in found[:-1]} == {"text_completion"}
    assert "".join(chunk["choices"][0]["text"] for chunk in found[:-1]) == "Hallo"
    assert found[-2]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([DELTAS[0], {"error": "the engine failed", "error_type": "generation_failed"}],
         "the engine failed"),
        (DELTAS, "ended before the reply was complete"),
        ([DELTAS[0], "not json"], "not a JSON object"),
    ],
    ids=["error-line", "cut-short", "not-json"],
)  # fmt: skip
def test_a_stream_that_fails_after_it_began_ends_with_an_error_event(
    client: TestClient, upstream: Upstream, keys: ClientKeys, lines: list[Any], message: str
) -> None:
    raw = b"".join(
        line.encode() + b"\n" if isinstance(line, str) else ndjson(line) for line in lines
    )
    upstream.reply(PREDICTIONS, raw, mimetype=NDJSON)
    answer = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth(keys))
    assert answer.status_code == 200  # sent with the first event
    found = events(answer)
    assert found[-1] == "[DONE]"
    error = found[-2]["error"]
    assert error["type"] == "server_error" and message in error["message"]
    assert found[1]["choices"][0]["delta"] == {"content": "Hal"}
    assert keys.used(keys.keys[0]) == len("Hello")  # counted once the stream began


# --- quotas and fair sharing --------------------------------------------------------------------


def test_a_key_past_its_character_limit_gets_429_and_no_retry(
    upstream: Upstream, tmp_path: Path
) -> None:
    upstream.reply(PREDICTIONS, REPLY)
    poor = client_keys(tmp_path / "poor.json", ("carol",), limit=7)
    with front(upstream, tmp_path, poor) as client:
        first = client.post("/v1/chat/completions", json=CHAT, headers=auth(poor))
        assert first.status_code == 200 and poor.used(poor.keys[0]) == 5
        again = client.post("/v1/chat/completions", json=CHAT, headers=auth(poor))
    refusal(again, 429, "insufficient_quota", "insufficient_quota")
    assert again.headers["x-should-retry"] == "false"
    assert len(upstream.forwarded()) == 1 and poor.used(poor.keys[0]) == 5


class Held:
    """A predictions route that answers when ``gate`` opens: whole, or a stream whose first
    line comes at once."""

    def __init__(self, stream: bool) -> None:
        self.gate, self.stream = threading.Event(), stream

    def __call__(self, request: Request) -> Response:
        if not self.stream:
            self.gate.wait(10)
            return Response(json.dumps(REPLY), content_type="application/json")

        def lines() -> Iterator[bytes]:
            yield ndjson(DELTAS[0])
            self.gate.wait(10)
            yield ndjson(DELTAS[1], REPLY)

        return Response(lines(), content_type=NDJSON)


def _wait_until(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_key_with_too_many_requests_in_progress_gets_429(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    held = Held(stream=False)
    upstream.replies[PREDICTIONS] = held
    with front(upstream, tmp_path, keys, limits=fairness.KeyLimits(per_key=1)) as client:
        answers: list[int] = []

        def first() -> None:
            reply = client.post("/v1/chat/completions", json=CHAT, headers=auth(keys))
            answers.append(reply.status_code)

        thread = threading.Thread(target=first)
        thread.start()
        _wait_until(lambda: len(upstream.forwarded()) == 1)
        second = client.post("/v1/chat/completions", json=CHAT, headers=auth(keys))
        other = threading.Thread(
            target=lambda: answers.append(
                client.post("/v1/chat/completions", json=CHAT, headers=auth(keys, 1)).status_code
            )
        )
        other.start()
        _wait_until(lambda: len(upstream.forwarded()) == 2)  # another key is not held back
        held.gate.set()
        thread.join(10)
        other.join(10)
    assert "at most 1" in refusal(second, 429, "requests", "rate_limit_exceeded")["message"]
    assert second.headers["Retry-After"]
    assert answers == [200, 200]
    assert keys.used(keys.keys[0]) == len("Hello")  # the refused one given back


async def _one() -> int:
    return 1


def test_a_stream_holds_its_upstream_slot_until_it_ends(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    """One slot (a job queue of one): while a stream is open, another call waits for it and
    then gets 503 with Retry-After; once the stream ends the next call is answered."""
    held = Held(stream=True)
    upstream.replies[PREDICTIONS] = held
    slots = fairness.Upstream(_one, wait_s=0.3)
    with front(upstream, tmp_path, keys, upstream=slots) as client:
        streamed: list[Any] = []

        def stream() -> None:
            body = {**CHAT, "stream": True}
            reply = client.post("/v1/chat/completions", json=body, headers=auth(keys))
            streamed.extend(events(reply))

        thread = threading.Thread(target=stream)
        thread.start()
        _wait_until(lambda: len(upstream.forwarded()) == 1)
        busy = client.post("/v1/chat/completions", json=CHAT, headers=auth(keys, 1))
        held.gate.set()
        thread.join(10)
        upstream.reply(PREDICTIONS, REPLY)
        after = client.post("/v1/chat/completions", json=CHAT, headers=auth(keys, 1))
    refusal(busy, 503, "server_error", "overloaded")
    assert busy.headers["Retry-After"]
    assert streamed[-1] == "[DONE]" and after.status_code == 200
    assert keys.used(keys.keys[1]) == len("Hello")


def test_a_client_that_goes_away_frees_the_upstream_slot(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    """Under uvicorn, as hymt web serves it: the SSE client closes its connection after the
    first delta; the relay ends and the slot is free while TorchServe still generates."""
    held = Held(stream=True)
    upstream.replies[PREDICTIONS] = held
    app = create_app(workdir(tmp_path, upstream.url), client_keys=keys)
    slots = app.state.torchserve.upstream
    try:
        with serving(app) as url, httpx.Client(timeout=10) as http:
            body = {**CHAT, "stream": True}
            url = f"{url}v1/chat/completions"
            with http.stream("POST", url, json=body, headers=auth(keys)) as answer:
                lines = answer.iter_lines()  # kept: a dropped iterator closes the connection
                data = [line for line in (next(lines) for _ in range(4)) if line]
                delta = json.loads(data[1].removeprefix("data: "))["choices"][0]["delta"]
                assert delta == {"content": "Hal"}
                assert slots._in_flight == 1
            _wait_until(lambda: slots._in_flight == 0)
            assert not held.gate.is_set()  # TorchServe's stream had not ended
    finally:
        held.gate.set()
