"""gRPC against a real TorchServe with real gRPC clients (stubs generated from our protos).

TorchServe 0.12.0 took its worker down for good on a streamed request over unary Predictions
and on any StreamPredictions2 call whose client half-closed early; StreamPredictions without
"stream" ended with INTERNAL "Worker died.". Each case here runs against the live server and
then checks that the same worker process still answers over HTTP and that the front end logged
no "Stream is already completed".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests
from conftest import MODEL
from grpc_clients import GrpcClient, compile_protos

from hymt_serve.ops.launcher import Server, model_workers

pytestmark = pytest.mark.integration
BODY = {"text": "Good morning.", "target_lang": "fr", "max_new_tokens": 4}


@pytest.fixture(scope="module")
def client(server: Server, tmp_path_factory: pytest.TempPathFactory) -> GrpcClient:
    return GrpcClient(server, compile_protos(tmp_path_factory.mktemp("stubs")))


@pytest.fixture
def same_worker(server: Server) -> Iterator[None]:
    """After the test: the same worker processes, READY, answering HTTP; no front-end wedge."""
    before = _pids(server)
    yield
    response = requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json=BODY,
        headers=server.headers("inference"),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert _pids(server) == before
    log = (server.log_dir / "ts_log.log").read_text(encoding="utf-8", errors="replace")
    assert "Stream is already completed" not in log


def _pids(server: Server) -> list[Any]:
    workers = model_workers(server, MODEL)
    assert workers and all(w["status"] == "READY" for w in workers), workers
    return sorted(w["pid"] for w in workers)


def _http(server: Server, body: Any) -> dict[str, Any]:
    response = requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json=body,
        headers=server.headers("inference"),
        timeout=60,
    )
    return dict(response.json())


def test_unary_predictions_answers_the_whole_translation(
    client: GrpcClient, same_worker: None
) -> None:
    reply = client.predict(BODY)
    assert isinstance(reply["translation"], str)
    assert reply["translations"][0]["output_tokens"] <= 4
    assert reply["request_id"]


def test_unary_predictions_with_stream_is_a_clear_400(
    client: GrpcClient, same_worker: None
) -> None:
    for _ in range(3):  # the audit's wedge took one request
        reply = client.predict({**BODY, "stream": True})
        assert reply["error_type"] == "invalid_request" and reply["field"] == "stream"
        assert "over HTTP" in reply["error"]


def test_stream_predictions_ends_cleanly_with_the_reply(
    client: GrpcClient, same_worker: None
) -> None:
    messages = client.stream(BODY)  # raised INTERNAL "Worker died." before
    assert len(messages) == 1 and isinstance(messages[0]["translation"], str)
    refused = client.stream({**BODY, "stream": True})
    assert len(refused) == 1 and refused[0]["field"] == "stream"


@pytest.mark.parametrize("keep_open", [False, True])
def test_stream_predictions2_never_takes_the_worker_down(
    client: GrpcClient, same_worker: None, keep_open: bool
) -> None:
    """TorchServe 0.12.0 fails the call itself (UNKNOWN) for a model without sequence
    batching; the handler sends nothing back, so nothing reaches a call already closed."""
    with pytest.raises(grpc.RpcError) as caught:
        client.stream2({**BODY, "stream": True}, keep_open=keep_open)
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    if not keep_open:  # TorchServe's own answer to a missing sequenceId
        refused = client.stream2(BODY, keep_open=False, sequence_id="")
        assert refused and all("sequenceId" in m.status.message for m in refused)


@pytest.mark.parametrize(
    "body",
    [
        {"text": "hi", "target_lang": "xx"},
        {"text": "hi", "target_lang": "fr", "source_lang": "fr"},
        {"text": ["a"] * 100, "target_lang": "fr"},
        {"text": "hi", "target_lang": "fr", "max_new_tokens": 10**40},
        {"text": "hi", "target_lang": "fr", "sampling": True, "top_p": [[[[[[[[[[1]]]]]]]]]]},
        {"text": "hi", "target_language": "fr"},
        [1, 2, 3],
    ],
    ids=["language", "same", "too-many", "huge-int", "deep", "unknown-field", "not-object"],
)
def test_bad_input_gets_the_same_error_body_as_over_http(
    client: GrpcClient, server: Server, body: Any
) -> None:
    over_grpc, over_http = client.predict(body), _http(server, body)
    assert over_grpc.pop("request_id") and over_http.pop("request_id")
    assert over_grpc == over_http


def test_undecodable_bodies_and_missing_data_key_are_400s(
    client: GrpcClient, same_worker: None
) -> None:
    for raw in (b"\xff\xfe", b"{", b"[" * 5000, b"{}" * 3):
        assert client.predict(raw)["error_type"] == "invalid_request"
    reply = client.predict(b"hello", key="text")
    assert reply["field"] == "input" and "'data'" in reply["error"]


def test_management_describe_over_grpc(client: GrpcClient) -> None:
    described = client.describe()
    assert described[0]["modelName"] == MODEL
    assert described[0]["workers"][0]["status"] == "READY"
