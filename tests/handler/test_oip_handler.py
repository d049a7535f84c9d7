"""KServe v2 (Open Inference Protocol) requests through the handler (batch mode, fake engine):
v2 responses beside request API replies in one batch, errors in their own slots, and every
protocol decoded into one request at the door."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from fakes import GRPC_HEADERS, HTTP_HEADERS, FakeEngine, make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.request import door
from hymt_serve.request.protocol import TranslationRequest
from hymt_serve.request.transport import Origin

SETTINGS = {"model_path": "/unused", "max_new_tokens": 20, "max_texts_per_request": 4}


def v2_text(*texts: str, **parameters: Any) -> dict[str, Any]:
    tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}
    return {"inputs": [tensor], "parameters": parameters}


@pytest.fixture
def handler(fake_engine: FakeEngine) -> HunyuanMTHandler:
    h = HunyuanMTHandler()
    h.initialize(make_context(SETTINGS))
    return h


def run(
    handler: HunyuanMTHandler, bodies: list[Any], headers: list[dict[str, Any]] | None = None
) -> list[tuple[int, dict[str, Any]]]:
    context = handler.context
    set_batch(context, len(bodies), headers)
    out = handler.handle([{"body": body} for body in bodies], context)
    assert len(out) == len(bodies)
    return [(context.get_response_status(i)[0], json.loads(text)) for i, text in enumerate(out)]


def test_v2_and_api_requests_share_a_batch(
    handler: HunyuanMTHandler, fake_engine: FakeEngine
) -> None:
    asked = {**v2_text("abc", target_lang="de"), "id": "mine"}
    asked["outputs"] = [{"name": "translation"}]
    replies = run(
        handler,
        [
            v2_text("hello", "good night", target_lang="fr", source_lang="en"),
            {"text": "hello", "target_lang": "fr", "source_lang": "en"},
            v2_text("x", target_lang="klingon"),
            v2_text("x", target_lang="de", stream=True),
            asked,
        ],
    )
    assert [status for status, _ in replies] == [200, 200, 400, 400, 200]
    (_, first), (_, plain) = replies[0], replies[1]
    outputs = {tensor["name"]: tensor for tensor in first["outputs"]}
    assert outputs["translation"]["data"] == ["HELLO", "GOOD NIGHT"]
    assert outputs["translation"]["shape"] == [2]
    assert outputs["output_tokens"]["data"][0] == plain["translations"][0]["output_tokens"]
    assert first["model_name"] == "hunyuan-mt" and first["id"] == "req-0"
    assert first["parameters"]["source_lang"] == "en"
    assert first["parameters"]["request_id"] == "req-0"
    assert replies[2][1]["error_type"] == "unsupported_language"  # the API's error body
    assert "v2 has no streaming" in replies[3][1]["error"]
    assert replies[4][1]["id"] == "mine"
    assert replies[4][1]["outputs"] == [
        {"name": "translation", "datatype": "BYTES", "shape": [1], "data": ["ABC"]}
    ]
    assert fake_engine.calls == [4]


def test_binary_tensors_from_the_headers_of_their_request(handler: HunyuanMTHandler) -> None:
    texts = ["Grüß Gott", "你好"]
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    tensor = {"name": "text", "datatype": "BYTES", "shape": [2]}
    head = json.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
            "parameters": {"target_lang": "en"},
        }
    ).encode()
    binary = {
        **HTTP_HEADERS,
        "Content-Type": "application/octet-stream",
        "inference-header-content-length": str(len(head)),
    }
    # The same bytes without the header are a request API body that is not JSON.
    replies = run(handler, [bytearray(head + raw)] * 2, [binary, HTTP_HEADERS])
    assert [status for status, _ in replies] == [200, 400]
    assert replies[0][1]["outputs"][0]["data"] == ["GRÜSS GOTT", "你好"]
    assert "not valid JSON" in replies[1][1]["error"]


def test_the_door_decodes_every_protocol_into_the_same_request(
    handler: HunyuanMTHandler,
) -> None:
    """A v2 request, its request API body as JSON and as bytes, and over gRPC: one request
    past the door; only the v2 one keeps what its response needs."""
    plain = {"text": ["hello", "good night"], "target_lang": "fr", "max_new_tokens": 5}
    v2 = v2_text("hello", "good night", target_lang="fr", max_new_tokens=5)
    rows: list[dict[str, Any]] = [
        {"body": v2},
        {"body": plain},
        {"body": json.dumps(plain).encode()},
        {"data": json.dumps(plain).encode()},
    ]
    context = handler.context
    set_batch(context, len(rows), [HTTP_HEADERS] * 3 + [GRPC_HEADERS])
    arrivals = door.decode(rows, context, handler._service().parse)
    assert [arrival.request for arrival in arrivals[1:]] == [arrivals[0].request] * 3
    assert isinstance(arrivals[0].request, TranslationRequest)
    assert arrivals[0].request.texts == ("hello", "good night")
    assert [arrival.call is not None for arrival in arrivals] == [True, False, False, False]
    assert [arrival.origin for arrival in arrivals] == [Origin.HTTP] * 3 + [Origin.GRPC]
