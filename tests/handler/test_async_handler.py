"""TorchServe's async mode through the handler with the tiny real model on the fast engine:
requests handled concurrently, one per call (as TorchServe's AsyncService does), must get the
replies the batch path gives, with per-request errors and streams intact."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fakes import GRPC_HEADERS, HTTP_HEADERS, SentParts, make_context, set_batch

import hunyuan_mt_handler
from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.errors import ConfigurationError
from hymt_serve.request import door
from hymt_serve.request.transport import Origin

ASYNC = {"asyncCommunication": True}
BODIES: list[Any] = [
    {"text": "Hello there", "target_lang": "fr"},
    {"text": ["Good night", "See you", "Thanks a lot for the help"], "target_lang": "de"},
    {"text": "x", "target_lang": "klingon"},
    {"text": "你好，世界", "target_lang": "en", "max_new_tokens": 3},
    b"\xff not utf-8",
    {"text": "A much longer sentence to translate into Japanese, please.", "target_lang": "ja"},
    {"text": "Sampled", "target_lang": "es", "sampling": True, "top_k": 5},
    {"text": "y" * 500, "target_lang": "en"},
    {"text": "Bonjour", "target_lang": "en", "source_lang": "fr", "max_new_tokens": 1},
]


CLOSE_WAIT_S = 1.0  # for the engine process to exit on its own before it is killed


def settings(model_dir: Path) -> dict[str, Any]:
    return {
        "model_path": str(model_dir),
        "engine": "fast",
        "max_new_tokens": 12,
        "max_batch_rows": 3,  # fewer slots than rows in flight: rows wait and join later
        "max_chars_per_text": 400,
        # The random model's greedy output, judged but never generated again (a retry is
        # sampled): both paths must give the same replies.
        "target_language_check": "report",
    }


def start(model_dir: Path, **frontend: Any) -> tuple[HunyuanMTHandler, Any]:
    handler = HunyuanMTHandler()
    context = make_context(settings(model_dir), model_dir, batch_size=1, frontend=frontend)
    handler.initialize(context)
    return handler, context


async def one_call(
    handler: HunyuanMTHandler, context: Any, body: Any, request_id: str
) -> tuple[int, str, str]:
    """What TorchServe's async worker does per request: a context copy, one awaited call."""
    own = copy.deepcopy(context)
    set_batch(own, 1)
    own.request_ids = {0: request_id}
    result = handler.handle([{"body": body}], own)
    assert not isinstance(result, list)
    (text,) = await result
    if not text:  # an HTTP reply goes ahead of the final, empty one (the stream's last part)
        parts = door.send_intermediate_predict_response
        assert isinstance(parts, SentParts)
        text = parts.reply(request_id)
        assert text, "neither a final reply nor one sent ahead"
    return own.get_response_status(0)[0], own.get_response_content_type(0), text


async def all_at_once(handler: HunyuanMTHandler, context: Any) -> list[tuple[int, str, str]]:
    calls = [one_call(handler, context, b, f"r{i}") for i, b in enumerate(BODIES)]
    return list(await asyncio.gather(*calls))


@pytest.fixture(scope="module")
def async_handler(tiny_model_dir: Path) -> Any:
    handler, context = start(tiny_model_dir, **ASYNC)
    yield handler, context
    # close() hangs up the pipe, which the worker's reader thread blocked on it would otherwise
    # keep open (Linux keeps the socket open under a pending read): the child sees its end and
    # exits on its own, long before close()'s 30 s.
    engine = handler._service().engine  # type: ignore[attr-defined]
    started = time.monotonic()
    engine.close()
    assert time.monotonic() - started < 10 and engine._process.exitcode == 0


def test_concurrent_requests_match_the_batch_path(
    async_handler: tuple[HunyuanMTHandler, Any], tiny_model_dir: Path
) -> None:
    handler, context = async_handler
    replies = asyncio.run(all_at_once(handler, context))
    sync_handler, sync_context = start(tiny_model_dir)
    set_batch(sync_context, len(BODIES))
    batch = sync_handler.handle([{"body": b} for b in BODIES], sync_context)
    assert isinstance(batch, list)
    statuses = [status for status, _, _ in replies]
    assert statuses == [200, 200, 400, 200, 400, 200, 200, 413, 200]
    assert statuses == [sync_context.get_response_status(i)[0] for i in range(len(BODIES))]
    for i, ((_, content_type, text), expected) in enumerate(zip(replies, batch, strict=True)):
        got, want = json.loads(text), json.loads(expected)
        assert content_type == "application/json"
        assert got["request_id"] == f"r{i}"
        if i == 6:  # sampled: same shape, its own draw
            assert got.keys() == want.keys()
            continue
        got.pop("request_id"), want.pop("request_id")
        assert got == want
    described = handler.describe()["engine"]
    assert described["engine"] == "fast" and described["process"]["pid"]
    assert described["scheduler"]["scheduler"] == "continuous"
    assert described["scheduler"]["slots"] == 3


def test_a_stream_and_plain_requests_in_flight_together(
    async_handler: tuple[HunyuanMTHandler, Any], sent_parts: SentParts
) -> None:
    handler, context = async_handler
    stream_body = {"text": "Hello there, friend", "target_lang": "ja", "stream": True}

    async def together() -> list[tuple[int, str, str]]:
        calls = [one_call(handler, context, stream_body, "s")]
        calls += [one_call(handler, context, BODIES[0], f"p{i}") for i in range(4)]
        return list(await asyncio.gather(*calls))

    (status, content_type, final), *plain = asyncio.run(together())
    assert status == 200 and content_type == "application/x-ndjson"
    events = sent_parts.events()
    assert {request_id for request_id, _ in events} == {"s"}  # deltas reach the stream only
    deltas = [json.loads(line) for _, line in events]
    assert "".join(d["delta"] for d in deltas) == json.loads(final)["translation"]
    assert all(s == 200 for s, _, _ in plain)


def test_a_document_streams_its_progress_beside_sentences(
    async_handler: tuple[HunyuanMTHandler, Any], sent_parts: SentParts
) -> None:
    """A document of 30 segments (30 rows for 3 slots, with other requests in flight)
    comes back whole: its code untouched, its progress streamed to it alone."""
    handler, context = async_handler
    code = "```\nprint('keep me')\n```\n"
    document = "\n\n".join(f"Paragraph {n} of the page." for n in range(30)) + "\n\n" + code
    body = {"document": document, "format": "markdown", "target_lang": "de", "stream": True}

    async def together() -> list[tuple[int, str, str]]:
        calls = [one_call(handler, context, body, "d")]
        calls += [one_call(handler, context, BODIES[0], f"p{i}") for i in range(4)]
        return list(await asyncio.gather(*calls))

    (status, content_type, final), *plain = asyncio.run(together())
    assert status == 200 and content_type == "application/x-ndjson", final
    reply = json.loads(final)
    assert reply["segments"] == 30 and reply["document"].endswith("\n\n" + code)
    assert reply["document"].count("\n\n") >= 30
    events = sent_parts.events()
    assert {request_id for request_id, _ in events} == {"d"}
    progress = [json.loads(line)["progress"] for _, line in events]
    assert progress[-1] == {"done": 30, "total": 30}
    assert all(s == 200 for s, _, _ in plain)


def test_v2_requests_in_flight_with_api_requests(
    async_handler: tuple[HunyuanMTHandler, Any],
) -> None:
    """A KServe v2 request (Open Inference Protocol) and a document as v2 tensors, beside
    request API requests: the same translations, as output tensors."""
    handler, context = async_handler
    texts = ["Good night", "See you", "Thanks a lot for the help"]
    tensor = {"name": "text", "datatype": "BYTES", "shape": [3, 1], "data": [[t] for t in texts]}
    v2 = {"id": "k-1", "inputs": [tensor], "parameters": {"target_lang": "de"}}
    document = {
        "inputs": [
            {"name": "document", "datatype": "BYTES", "shape": [1], "data": ["One.\n\nTwo."]}
        ],
        "parameters": {"target_lang": "fr", "format": "text"},
    }

    async def together() -> list[tuple[int, str, str]]:
        calls = [one_call(handler, context, v2, "v"), one_call(handler, context, BODIES[1], "p")]
        calls.append(one_call(handler, context, document, "d"))
        return list(await asyncio.gather(*calls))

    (status, content_type, text), (_, _, plain), (doc_status, _, doc) = asyncio.run(together())
    assert status == 200 and content_type == "application/json"
    reply, expected = json.loads(text), json.loads(plain)
    assert reply["id"] == "k-1" and reply["parameters"]["request_id"] == "v"
    translation = next(t for t in reply["outputs"] if t["name"] == "translation")
    assert translation["data"] == [t["text"] for t in expected["translations"]]
    assert reply["parameters"]["output_tokens"] == expected["usage"]["output_tokens"]
    assert doc_status == 200
    [doc_tensor] = json.loads(doc)["outputs"]
    assert doc_tensor["name"] == "document" and doc_tensor["data"][0].count("\n\n") == 1


def test_describe_is_answered_in_async_mode(async_handler: tuple[HunyuanMTHandler, Any]) -> None:
    handler, context = async_handler

    async def describe() -> str:
        own = copy.deepcopy(context)
        set_batch(own, 1, [{"describe": "True"}])
        (text,) = await handler.handle([{"body": b""}], own)  # type: ignore[misc]
        return str(text)

    assert json.loads(asyncio.run(describe()))["engine"]["scheduler"]["max_waiting"] == 1024


def test_a_slow_describe_does_not_hold_up_other_requests(
    async_handler: tuple[HunyuanMTHandler, Any],
    monkeypatch: pytest.MonkeyPatch,
    sent_parts: SentParts,
) -> None:
    """The engine process does not answer a describe call (here: the message is lost): a
    translation sent meanwhile is answered at once, the describe call times out on its own.
    (Waiting for the answer on the event loop would hold up every request for up to 30 s.)"""
    handler, context = async_handler
    engine: Any = handler._service().engine
    monkeypatch.setattr(hunyuan_mt_handler, "DESCRIBE_TIMEOUT_S", 3.0)
    monkeypatch.setattr(engine, "_try_send", lambda message: True)  # sent nowhere
    finished: dict[str, float] = {}

    async def describe() -> None:
        own = copy.deepcopy(context)
        set_batch(own, 1, [{"describe": "True"}])
        (text,) = await handler.handle([{"body": b""}], own)  # type: ignore[misc]
        finished["describe"] = loop.time()
        assert own.get_response_status(0)[0] == 503
        assert "did not answer in 3 s" in json.loads(text)["error"]

    async def translate() -> None:
        await asyncio.sleep(0.2)  # the describe call is waiting by now
        monkeypatch.undo()  # the engine answers translations again
        monkeypatch.setattr(hunyuan_mt_handler, "DESCRIBE_TIMEOUT_S", 3.0)
        monkeypatch.setattr(door, "send_intermediate_predict_response", sent_parts)
        status, _, _ = await one_call(handler, context, BODIES[0], "t")
        assert status == 200
        finished["translate"] = loop.time()

    async def both() -> None:
        await asyncio.gather(describe(), translate())

    loop = asyncio.new_event_loop()
    started = loop.time()
    loop.run_until_complete(both())
    loop.close()
    assert finished["translate"] - started < 2.5 < finished["describe"] - started


def test_an_unexpected_failure_is_one_reply_not_an_exception(
    async_handler: tuple[HunyuanMTHandler, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, context = async_handler
    service = handler._service()

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("boom")

    monkeypatch.setattr(service, "generate_async", broken)
    status, _, text = asyncio.run(one_call(handler, context, BODIES[0], "k"))
    assert status == 500
    assert json.loads(text)["error_type"] == "generation_failed"


def test_async_mode_refuses_batches_from_torchserve(tiny_model_dir: Path) -> None:
    handler = HunyuanMTHandler()
    context = make_context(settings(tiny_model_dir), tiny_model_dir, batch_size=4, frontend=ASYNC)
    with pytest.raises(ConfigurationError, match="batchSize: 1"):
        handler.initialize(context)


def test_http_replies_go_ahead_in_parts_and_grpc_replies_stay_whole(
    sent_parts: SentParts,
) -> None:
    """TorchServe's front end forgets an async-mode request only at a stream's last part:
    an HTTP answer goes ahead in parts the socket takes whole (multi-byte characters split
    across parts join again), and the final reply left is empty; a gRPC reply is its call's
    one message, an HTTP stream's final line is its last part already, and an error reply
    goes whole (sent as a stream, a 400 reached the client cut off)."""
    context = make_context(settings(Path(".")), batch_size=4)
    set_batch(context, 4, [HTTP_HEADERS, GRPC_HEADERS, HTTP_HEADERS, HTTP_HEADERS])
    context.set_response_header(2, "ts_stream_next", "true")  # request 2 streamed deltas
    context.set_response_status(400, "Bad Request", 3)
    long_answer = json.dumps({"translation": "长文本" * 6000}, ensure_ascii=False)
    origins = [Origin.HTTP, Origin.GRPC, Origin.HTTP, Origin.HTTP]
    answers = [long_answer, '{"grpc": 1}', '{"last": "line"}\n', '{"error": "x"}']
    left = door.as_last_parts(answers, context, origins)
    assert left == ["", '{"grpc": 1}', '{"last": "line"}\n', '{"error": "x"}']
    parts = [value for request_id, value in sent_parts.sent if request_id == "req-0"]
    assert len(parts) == 4 and all(len(p) <= door.PART_BYTES for p in parts)
    assert sent_parts.reply("req-0") == long_answer
    assert {request_id for request_id, _ in sent_parts.sent} == {"req-0"}
