"""Streaming over HTTP chunked from a real TorchServe, beside plain requests."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import pytest
import requests

from hymt_serve.ops.launcher import Server

pytestmark = pytest.mark.integration
MODEL = "hunyuan-mt"


def post(server: Server, body: dict[str, Any], stream: bool) -> tuple[int, str, list[str]]:
    response = requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json=body,
        headers=server.headers("inference"),
        timeout=120,
        stream=stream,
    )
    lines = [line for line in response.iter_lines(decode_unicode=True) if line]
    return response.status_code, response.headers.get("Content-Type", ""), lines


def test_stream_sends_deltas_then_the_usual_response(server: Server) -> None:
    status, content_type, lines = post(
        server, {"text": "今天天气很好。", "target_lang": "en", "stream": True}, stream=True
    )
    assert status == 200 and content_type.startswith("application/x-ndjson")
    *deltas, final = [json.loads(line) for line in lines]
    assert len(deltas) >= 2
    assert "".join(d["delta"] for d in deltas) == final["translation"]
    assert final["usage"]["output_tokens"] == 16
    assert all("\ufffd" not in d["delta"] for d in deltas)


def test_plain_requests_in_the_same_batch_are_unaffected(server: Server) -> None:
    bodies = [
        {"text": "Good morning", "target_lang": "fr", "stream": True},
        {"text": "Good evening", "target_lang": "de"},
        {"text": ["一", "二"], "target_lang": "en"},
    ]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda b: post(server, b, stream=bool(b.get("stream"))), bodies))
    assert [r[0] for r in results] == [200, 200, 200]
    assert [r[1].split(";")[0] for r in results] == [
        "application/x-ndjson",
        "application/json",
        "application/json",
    ]
    assert json.loads("".join(results[1][2]))["translations"][0]["output_tokens"] == 16
    assert len(json.loads("".join(results[2][2]))["translations"]) == 2


def test_stream_of_several_texts_is_refused(server: Server) -> None:
    status, _, lines = post(
        server, {"text": ["a", "b"], "target_lang": "en", "stream": True}, stream=False
    )
    assert status == 400 and json.loads("".join(lines))["field"] == "stream"
