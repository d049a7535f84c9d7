"""The KServe v2 API on the web front end: client keys, character limits and their refund,
forwarding to TorchServe, readiness; against the stub TorchServe (no TorchServe)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_stub import MODEL, Upstream, opened, workdir

from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys

INFER = f"/v2/models/{MODEL}/infer"
V2 = {
    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["abcd", "ef"]}],
    "parameters": {"target_lang": "de"},
}
ANSWER = {"model_name": MODEL, "id": "1", "outputs": []}


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return ClientKeys.open(tmp_path / "keys" / "web_keys.json", character_limit=10)


@pytest.fixture
def v2_client(upstream: Upstream, tmp_path: Path, keys: ClientKeys) -> Iterator[TestClient]:
    server = workdir(tmp_path, upstream.url)
    (tmp_path / "keys").mkdir(exist_ok=True)
    with opened(create_app(server, MODEL, client_keys=keys)) as client:
        yield client


def post(client: TestClient, keys: ClientKeys, body: Any = V2, **headers: str) -> Any:
    auth = {"Authorization": f"Bearer {keys.keys[0].key}", **headers}
    headers = {"Content-Type": "application/json", **auth}
    return client.post(INFER, content=json.dumps(body), headers=headers)


def test_inference_is_forwarded_with_torchserves_key_and_counted(
    v2_client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(INFER, ANSWER)
    answer = post(v2_client, keys)
    assert answer.status_code == 200 and answer.json() == ANSWER
    [seen] = upstream.forwarded(INFER)
    assert seen.headers["Authorization"] == "Bearer inference-key"
    assert seen.json() == V2 and seen.headers["Content-Type"] == "application/json"
    assert keys.used(keys.keys[0]) == 6


def test_binary_tensors_go_through_with_their_header(
    v2_client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(INFER, ANSWER)
    raw = len(b"abc").to_bytes(4, "little") + b"abc"
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"target_lang": "de"},
        }
    ).encode()
    answer = v2_client.post(
        INFER,
        content=head + raw,
        headers={
            "Authorization": f"Bearer {keys.keys[0].key}",
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        },
    )
    assert answer.status_code == 200
    [seen] = upstream.forwarded(INFER)
    assert seen.body == head + raw
    assert seen.headers["Inference-Header-Content-Length"] == str(len(head))
    assert keys.used(keys.keys[0]) == 3


def test_keys_limits_and_refunds(
    v2_client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    wrong = v2_client.post(INFER, json=V2, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "client key" in wrong.json()["error"]
    upstream.reply(INFER, {"error": "bad", "error_type": "invalid_request"}, status=400)
    refused = post(v2_client, keys)
    assert refused.status_code == 400 and refused.json()["error"] == "bad"
    assert keys.used(keys.keys[0]) == 0  # refunded
    upstream.reply(INFER, ANSWER)
    assert post(v2_client, keys).status_code == 200
    over = post(v2_client, keys)  # 6 + 6 characters > the limit of 10
    assert over.status_code == 429 and over.json()["error_type"] == "quota_exceeded"
    assert len(upstream.forwarded(INFER)) == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": "abc", "target_lang": "de"}, "not a v2 inference request"),
        ({**V2, "parameters": {"target_lang": "de", "stream": True}}, "v2 has no streaming"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_malformed_requests_are_refused_here(
    v2_client: TestClient, upstream: Upstream, keys: ClientKeys, body: Any, message: str
) -> None:
    answer = post(v2_client, keys, body)
    assert answer.status_code == 400 and message in answer.json()["error"]
    assert not upstream.forwarded(INFER)


def test_readiness_follows_the_workers_and_the_drain(
    v2_client: TestClient, upstream: Upstream, tmp_path: Path
) -> None:
    workers = [{"id": "9000", "status": "READY", "pid": 1}]
    upstream.reply(f"/models/{MODEL}", [{"modelName": MODEL, "workers": workers}])
    upstream.reply(f"/models/{MODEL}/all", [{"modelVersion": "1.0"}])
    assert v2_client.get("/v2/health/live").json() == {"live": True}
    assert v2_client.get("/v2/health/ready").json() == {"ready": True}
    assert v2_client.get(f"/v2/models/{MODEL}/ready").status_code == 200
    assert v2_client.get("/v2/models/other/ready").status_code == 404
    assert v2_client.get(f"/v2/models/{MODEL}").json()["versions"] == ["1.0"]
    (tmp_path / "draining").write_text("")
    answer = v2_client.get(f"/v2/models/{MODEL}/ready")
    assert answer.status_code == 503 and answer.json()["ready"] is False
    (tmp_path / "draining").unlink()
    upstream.reply(f"/models/{MODEL}", [{"modelName": MODEL, "workers": []}])
    assert v2_client.get("/v2/health/ready").status_code == 503
