"""The handler with the header maps TorchServe 0.12.0 gives gRPC requests (seen on a running
server): what each gRPC method may carry, in a mixed batch, without a server."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from fakes import (
    GRPC_HEADERS,
    GRPC_SEQUENCE_HEADERS,
    HTTP_HEADERS,
    FakeEngine,
    make_context,
    set_batch,
)

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.request.transport import Origin, origin

SETTINGS = {"model_path": "/unused", "max_new_tokens": 20, "max_chars_per_text": 100}
ONE = {"text": "hello", "target_lang": "fr"}


@pytest.fixture
def handler(fake_engine: FakeEngine) -> HunyuanMTHandler:
    h = HunyuanMTHandler()
    h.initialize(make_context(SETTINGS))
    return h


def run(
    handler: HunyuanMTHandler, rows: list[dict[str, Any]], headers: list[dict[str, Any]]
) -> tuple[list[str], Any, list[Any]]:
    context = handler.context
    set_batch(context, len(rows), headers)
    sent: list[Any] = []
    with mock.patch("hymt_serve.request.door.send_intermediate_predict_response") as intermediate:
        out = handler.handle(rows, context)
        sent = intermediate.call_args_list
    assert isinstance(out, list) and len(out) == len(rows)
    return out, context, sent


def test_the_three_header_shapes() -> None:
    assert origin(HTTP_HEADERS) is Origin.HTTP
    assert origin(GRPC_HEADERS) is Origin.GRPC
    assert origin(GRPC_SEQUENCE_HEADERS) is Origin.GRPC_SEQUENCE
    assert origin({"body": {"content-type": "application/json"}, "Host": "x"}) is Origin.HTTP


def test_grpc_replies_are_marked_last_and_never_streamed(handler: HunyuanMTHandler) -> None:
    rows = [
        {"data": json.dumps(ONE).encode()},
        {"data": json.dumps({**ONE, "stream": True}).encode()},
        {"body": ONE},
    ]
    out, context, sent = run(handler, rows, [GRPC_HEADERS, GRPC_HEADERS, HTTP_HEADERS])
    assert json.loads(out[0])["translation"] == "HELLO"
    refused = json.loads(out[1])
    assert context.get_response_status(1)[0] == 400 and refused["field"] == "stream"
    assert [context.get_response_headers(i).get("ts_stream_next") for i in (0, 1)] == [
        "false",
        "false",
    ]
    assert "ts_stream_next" not in context.get_response_headers(2)  # HTTP as it was
    assert sent == []  # no delta ever went to a gRPC call


def test_stream_predictions2_gets_no_reply_and_no_work(
    handler: HunyuanMTHandler, fake_engine: FakeEngine
) -> None:
    rows = [{"data": json.dumps(ONE).encode()}, {"body": ONE}]
    out, context, _ = run(handler, rows, [GRPC_SEQUENCE_HEADERS, HTTP_HEADERS])
    assert list(context.request_ids) == [1]  # TorchServe encodes replies for these only
    assert json.loads(out[1])["translation"] == "HELLO"
    assert fake_engine.calls == [1]


def test_a_grpc_input_without_data_is_a_400_naming_the_key(handler: HunyuanMTHandler) -> None:
    out, context, _ = run(handler, [{"text": b"hello", "target_lang": b"fr"}], [GRPC_HEADERS])
    reply = json.loads(out[0])
    assert context.get_response_status(0)[0] == 400
    assert reply["field"] == "input" and "'data'" in reply["error"]
