"""The web front end's app against a stub TorchServe (tests/web_stub.py): no TorchServe.
The page's proxy, its configuration and refinement."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_stub import DESCRIBE, MODEL, PREDICTIONS, Upstream, mimetype, opened, workdir
from web_stub import response as stub_response
from werkzeug.wrappers import Request, Response

from hymt_serve.web.app import create_app
from hymt_serve.web.torchserve import TORCHSERVE_BUSY


@pytest.fixture
def client(upstream: Upstream, tmp_path: Path) -> Iterator[TestClient]:
    with opened(create_app(workdir(tmp_path, upstream.url), MODEL)) as client:
        yield client


def _lines(data: bytes) -> list[Any]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


STREAMED = [{"delta": "Bon", "request_id": "r1"}, {"translation": "Bonjour", "request_id": "r1"}]
NDJSON = "".join(json.dumps(line) + "\n" for line in STREAMED).encode()


# --- /api/translate: a faithful proxy -------------------------------------------------------


def test_a_single_text_streams_by_default_with_every_field_forwarded(
    client: TestClient, upstream: Upstream
) -> None:
    upstream.reply(PREDICTIONS, NDJSON, mimetype="application/x-ndjson")
    sent = {
        "text": "Hello",
        "src_lang": "en",
        "tgt_lang": "fr",
        "max_new_tokens": 12,
        "sampling": True,
        "temperature": 0.5,
    }
    response = client.post("/api/translate", json=sent)
    assert response.status_code == 200
    assert mimetype(response) == "application/x-ndjson"
    assert _lines(response.content) == STREAMED
    [forwarded] = upstream.forwarded()
    assert forwarded.json() == {**sent, "stream": True}
    assert forwarded.headers["Authorization"] == "Bearer inference-key"
    assert forwarded.headers["Content-Type"] == "application/json"


def test_a_list_of_texts_is_forwarded_as_is_and_answered_with_the_upstream_json(
    client: TestClient, upstream: Upstream
) -> None:
    answer = {"translations": [{"text": "Bonjour"}, {"text": "Salut"}], "target_lang": "fr"}
    upstream.reply(PREDICTIONS, answer)
    sent = {"text": ["Hello", "Hi"], "target_lang": "fr", "max_new_tokens": 8}
    response = client.post("/api/translate", json=sent)
    assert (response.status_code, mimetype(response)) == (200, "application/json")
    assert response.json() == answer
    assert upstream.forwarded()[0].json() == sent  # no "stream" added


def test_stream_false_from_the_client_is_kept(client: TestClient, upstream: Upstream) -> None:
    answer = {"translation": "Bonjour", "usage": {"input_tokens": 20, "output_tokens": 2}}
    upstream.reply(PREDICTIONS, answer)
    sent = {"text": "Hello", "target_lang": "fr", "stream": False}
    response = client.post("/api/translate", json=sent)
    assert (response.status_code, mimetype(response)) == (200, "application/json")
    assert response.json() == answer
    assert upstream.forwarded()[0].json() == sent


def test_stream_true_with_a_list_gets_the_handlers_own_error(
    client: TestClient, upstream: Upstream
) -> None:
    error = {"error": "stream needs a single text", "error_type": "invalid_request"}
    upstream.reply(PREDICTIONS, error, status=400)
    sent = {"text": ["a", "b"], "target_lang": "fr", "stream": True}
    response = client.post("/api/translate", json=sent)
    assert (response.status_code, response.json()) == (400, error)
    assert upstream.forwarded()[0].json() == sent


def test_unknown_fields_reach_the_handler_and_its_error_passes_through_unchanged(
    client: TestClient, upstream: Upstream
) -> None:
    error = {
        "error": "unknown field 'target_language'",
        "error_type": "invalid_request",
        "field": "target_language",
        "allowed": {"fields": ["text", "target_lang"]},
        "request_id": "r2",
    }
    upstream.reply(PREDICTIONS, error, status=400)
    sent = {"text": "Hello", "target_language": "fr"}
    response = client.post("/api/translate", json=sent)
    assert (response.status_code, response.json()) == (400, error)
    assert upstream.forwarded()[0].json() == {**sent, "stream": True}


@pytest.mark.parametrize(
    ("status", "torchserve_body", "error_type"),
    [
        (
            503,
            {"code": 503, "type": "ServiceUnavailableException", "message": "queue full"},
            "server_busy",
        ),
        (
            400,
            {"code": 400, "type": "InvalidKeyException", "message": "Token is not valid"},
            "invalid_request",
        ),
        (
            500,
            {"code": 500, "type": "InternalServerException", "message": "worker died"},
            "server_error",
        ),
    ],
)
def test_torchserve_errors_are_mapped(
    client: TestClient, upstream: Upstream, status: int, torchserve_body: Any, error_type: str
) -> None:
    upstream.reply(PREDICTIONS, torchserve_body, status=status)
    response = client.post("/api/translate", json={"text": "Hello", "target_lang": "fr"})
    assert response.status_code == status
    # TorchServe's 503 advises its operator to scale workers: a client is told to retry
    message = TORCHSERVE_BUSY if status == 503 else torchserve_body["message"]
    assert response.json() == {"error": message, "error_type": error_type}


@pytest.mark.parametrize("stream", [True, False])
def test_an_empty_413_becomes_a_json_error(
    client: TestClient, upstream: Upstream, stream: bool
) -> None:
    upstream.reply(PREDICTIONS, b"", status=413)
    body = {"text": "x" * 100, "target_lang": "fr", "stream": stream}
    response = client.post("/api/translate", json=body)
    assert (response.status_code, mimetype(response)) == (413, "application/json")
    error = response.json()
    assert error["error_type"] == "payload_too_large"
    assert error["error"]


def test_a_non_json_upstream_error_becomes_a_json_error(
    client: TestClient, upstream: Upstream
) -> None:
    upstream.reply(PREDICTIONS, b"<html>Bad Gateway</html>", status=502, mimetype="text/html")
    response = client.post("/api/translate", json={"text": ["a"], "target_lang": "fr"})
    assert response.status_code == 502
    assert response.json()["error_type"] == "server_error"


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        ('["Hello"]', "application/json"),
        ('"Hello"', "application/json"),
        ("{not json", "application/json"),
        ('{"text": "Hello", "target_lang": "fr"}', "text/plain"),
        ("[" * 100_000, "application/json"),
    ],
    ids=["list", "string", "broken", "not-json-content-type", "deeply-nested"],
)
def test_a_body_that_is_not_a_json_object_is_a_400_without_forwarding(
    client: TestClient, upstream: Upstream, data: str, content_type: str
) -> None:
    response = client.post("/api/translate", content=data, headers={"Content-Type": content_type})
    assert response.status_code == 400
    assert response.json()["error_type"] == "invalid_request"
    assert not upstream.forwarded()


def test_an_unreachable_server_is_a_502(tmp_path: Path) -> None:
    with opened(create_app(workdir(tmp_path, "http://127.0.0.1:9"), MODEL)) as client:
        response = client.post("/api/translate", json={"text": "Hello", "target_lang": "fr"})
    assert response.status_code == 502
    assert response.json()["error_type"] == "server_unavailable"


# --- /api/config ------------------------------------------------------------------------------


def _described(engine: dict[str, Any], max_chars: int = 1234, as_string: bool = True) -> Any:
    metadata: Any = {"engine": engine, "settings": {"max_chars_per_text": max_chars}}
    return [
        {"modelName": MODEL, "customizedMetadata": json.dumps(metadata) if as_string else metadata}
    ]


@pytest.mark.parametrize("as_string", [True, False])
def test_config_says_demo_model_from_one_describe_call(
    client: TestClient, upstream: Upstream, as_string: bool
) -> None:
    upstream.reply(DESCRIBE, _described({"engine": "hf", "random_weights": True}, 777, as_string))
    config = client.get("/api/config").json()
    assert (config["demo_model"], config["max_chars"], config["model"]) == (True, 777, MODEL)
    assert len(config["languages"]) == 38
    [described] = upstream.forwarded(DESCRIBE)  # one management request, not one per field
    assert described.headers["Authorization"] == "Bearer management-key"


def test_config_gives_the_page_the_handlers_file_limits(
    client: TestClient, upstream: Upstream
) -> None:
    """The page checks a file's size against the handler's own limits before it sends it (an
    Office file's in base64), and the defaults while the handler does not say."""
    described = _described({"engine": "hf"})
    metadata = json.loads(described[0]["customizedMetadata"])
    metadata["settings"].update(max_document_bytes=5000, max_office_bytes=7000)
    described[0]["customizedMetadata"] = json.dumps(metadata)
    upstream.reply(DESCRIBE, described)
    config = client.get("/api/config").json()
    assert (config["max_document_bytes"], config["max_office_bytes"]) == (5000, 7000)
    upstream.reply(DESCRIBE, _described({"engine": "hf"}))
    config = client.get("/api/config").json()
    assert (config["max_document_bytes"], config["max_office_bytes"]) == (1_048_576, 4_194_304)


@pytest.mark.parametrize(
    ("family", "features"),
    [
        (
            {"model_family": "HY-MT1.5", "features": ["glossary", "context"]},
            ["glossary", "context"],
        ),
        ({"model_family": "Hunyuan-MT-7B", "features": []}, []),
        ({"features": ["glossary", "teleport"]}, ["glossary"]),
        ("nonsense", []),
        (None, []),
    ],
)
def test_config_lists_the_model_familys_features(
    client: TestClient, upstream: Upstream, family: Any, features: list[str]
) -> None:
    described = _described({"engine": "hf"})
    metadata = json.loads(described[0]["customizedMetadata"])
    if family is not None:
        metadata["model_family"] = family
    described[0]["customizedMetadata"] = json.dumps(metadata)
    upstream.reply(DESCRIBE, described)
    config = client.get("/api/config").json()
    assert config["features"] == features
    expected = family.get("model_family") if isinstance(family, dict) else None
    assert config["family"] == expected


@pytest.mark.parametrize(
    "engine", [{"engine": "hf", "random_weights": False}, {"engine": "hf"}], ids=["false", "absent"]
)
def test_config_says_no_demo_model_for_a_real_model(
    client: TestClient, upstream: Upstream, engine: dict[str, Any]
) -> None:
    upstream.reply(DESCRIBE, _described(engine))
    config = client.get("/api/config").json()
    assert (config["demo_model"], config["max_chars"]) == (False, 1234)


@pytest.mark.parametrize(
    "described",
    [None, [], [{"customizedMetadata": "not json"}], [{"customizedMetadata": "[1]"}]],
    ids=["no-reply", "empty", "bad-json", "not-an-object"],
)
def test_config_falls_back_when_describe_is_unreadable(
    client: TestClient, upstream: Upstream, described: Any
) -> None:
    if described is not None:
        upstream.reply(DESCRIBE, described)
    config = client.get("/api/config").json()
    assert (config["demo_model"], config["max_chars"]) == (False, 4000)


# --- static files -----------------------------------------------------------------------------


def test_favicon_is_an_image(client: TestClient) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert mimetype(response).startswith("image/")
    assert b"<svg" in response.content
    page = client.get("/").text
    assert 'rel="icon"' in page


def test_the_page_has_a_hidden_demo_notice(client: TestClient) -> None:
    page = client.get("/").text
    assert 'id="demo-notice"' in page and "random weights" in page


# --- /api/refine: two models behind one endpoint ---------------------------------------------

CHIMERA_PREDICTIONS = "/predictions/chimera"


def test_refine_is_off_unless_a_chimera_model_is_named(
    client: TestClient, upstream: Upstream
) -> None:
    response = client.post("/api/refine", json={"text": "x", "target_lang": "en"})
    assert response.status_code == 404 and "--refine-model" in response.json()["error"]
    upstream.reply(DESCRIBE, _described({"engine": "hf"}))
    assert client.get("/api/config").json()["refine"] is False
    assert not upstream.forwarded()


def test_refine_calls_both_models_with_the_inference_key(
    upstream: Upstream, tmp_path: Path
) -> None:
    app = create_app(workdir(tmp_path, upstream.url), MODEL, refine_model="chimera")
    with opened(app) as client:
        _refine_through_both_models(client, upstream)


def _refine_through_both_models(client: TestClient, upstream: Upstream) -> None:
    counter = iter(range(100))

    def candidate(_request: Request) -> Response:
        body = {
            "translations": [{"text": f"c{next(counter) % 2}", "finish_reason": "stop"}],
            "usage": {"input_tokens": 3, "output_tokens": 2},
        }
        return stub_response(json.dumps(body).encode(), 200, "application/json")

    upstream.replies[PREDICTIONS] = candidate
    refined = {"translations": [{"text": "best", "candidates": ["c0", "c1"]}], "usage": {}}
    upstream.reply(CHIMERA_PREDICTIONS, refined)
    body = {"text": "x", "source_lang": "en", "target_lang": "fr"}
    response = client.post("/api/refine", json=body)
    assert response.status_code == 200 and response.json()["translation"] == "best"
    assert len(upstream.forwarded()) == 6
    [chimera] = upstream.forwarded(CHIMERA_PREDICTIONS)
    # Which request got which scripted text depends on arrival order: compare as a set.
    [candidates] = chimera.json()["candidates"]
    assert sorted(candidates) == ["c0", "c1"]
    assert chimera.headers["Authorization"] == "Bearer inference-key"
    upstream.reply(CHIMERA_PREDICTIONS, {"code": 503, "type": "x", "message": "no worker"}, 503)
    failed = client.post("/api/refine", json=body)
    assert failed.status_code == 503 and failed.json()["error"] == TORCHSERVE_BUSY
    assert client.post("/api/refine", content="nope").status_code == 400
