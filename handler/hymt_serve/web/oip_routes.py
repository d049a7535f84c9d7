"""KServe's Open Inference Protocol (v2) REST API on the web front end.

TorchServe 0.12.0 answers ``POST /v2/models/<name>/infer`` (our handler speaks the protocol:
:mod:`hymt_serve.request.oip`), but not the rest of the protocol: ``/v2/models/<name>/ready``
and ``/v2/models/<name>`` are 404s over REST, and ``/v2/health/ready`` (only with
``ts_open_inference_protocol``) says true whatever its workers do. Here every call of the
protocol's REST API is answered, with the truth:

- ``GET /v2/health/live``: ``{"live": true}`` while this front end runs;
- ``GET /v2/health/ready``, ``GET /v2/models/<model>/ready``: 200 when TorchServe says every
  worker of the model is READY and the server is not draining (``hymt drain``), else 503;
  ``{"ready": ...}`` either way;
- ``GET /v2``, ``GET /v2/models/<model>``: server and model metadata (the tensors below);
- ``POST /v2/models/<model>/infer``: with a client key (``Authorization: Bearer <key>``) whose
  character limit counts the texts (refunded when the translation fails), forwarded to
  TorchServe's v2 route with this front end's TorchServe key; JSON or binary tensors.

Errors are ``{"error": ...}`` (the protocol's), with the request API's ``error_type``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import requests
from flask import Flask, Response, jsonify, request

from hymt_serve import __version__
from hymt_serve.ops.launcher import Server, all_ready, describe_model, model_status
from hymt_serve.request import oip
from hymt_serve.request.errors import InvalidRequest, ServiceError
from hymt_serve.request.protocol import decode_body
from hymt_serve.web.fairness import KeyLimits
from hymt_serve.web.keys import ClientKeys, bearer

# (TorchServe URL, body, headers) -> the Flask response of TorchServe's answer.
Relay = Callable[[str, bytes, Mapping[str, str]], Response]
FORWARDED_HEADERS = ("Content-Type", oip.BINARY_HEADER)
INPUTS = [
    {"name": "text", "datatype": "BYTES", "shape": [-1]},
    {"name": "document", "datatype": "BYTES", "shape": [1]},
    {"name": "glossary", "datatype": "BYTES", "shape": [-1, 2]},
    {"name": "preferences", "datatype": "BYTES", "shape": [-1]},
    {"name": "candidates", "datatype": "BYTES", "shape": [-1, -1]},
]
OUTPUT_TYPES = {"input_tokens": "INT64", "output_tokens": "INT64", "format_tags_lost": "INT64"}


def add_oip_routes(
    app: Flask, server: Server, model: str, keys: ClientKeys, relay: Relay, limits: KeyLimits
) -> None:
    """The protocol's routes on ``app`` for ``model`` on TorchServe ``server`` (each client
    key's requests in progress bounded by ``limits``)."""

    @app.get("/v2")
    def server_metadata() -> Any:
        return jsonify(name="hunyuan-mt-torchserve", version=__version__, extensions=[])

    @app.get("/v2/health/live")
    def live() -> Any:
        return jsonify(live=True)

    @app.get("/v2/health/ready")
    def server_ready() -> Any:
        ready = _ready(server, model)
        return jsonify(ready=ready), 200 if ready else 503

    @app.get("/v2/models/<name>/ready")
    def model_ready(name: str) -> Any:
        if name != model:
            return _unknown(name)
        ready = _ready(server, model)
        return jsonify(name=name, ready=ready), 200 if ready else 503

    @app.get("/v2/models/<name>")
    def model_metadata(name: str) -> Any:
        if name != model:
            return _unknown(name)
        return jsonify(
            name=name,
            versions=_versions(server, name),
            platform="torchserve",
            inputs=INPUTS,
            outputs=[
                {"name": output, "datatype": OUTPUT_TYPES.get(output, "BYTES"), "shape": [-1]}
                for output in oip.TEXT_OUTPUTS
            ]
            + [{"name": "document", "datatype": "BYTES", "shape": [1]}],
        )

    @app.post("/v2/models/<name>/infer")
    def infer(name: str) -> Any:
        if name != model:
            return _unknown(name)
        key = keys.find(bearer(request.headers.get("Authorization", "")))
        if key is None:
            return jsonify(error="a client key is required", error_type="unauthorized"), 401
        data = request.get_data()
        try:
            characters = _characters(data, dict(request.headers))
        except ServiceError as error:
            return jsonify(error.body(None)), error.status
        if not keys.reserve(key, characters):
            return jsonify(
                error="the character limit of this key is reached", error_type="quota_exceeded"
            ), 429
        headers = {h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers}
        try:
            with limits.hold(f"key:{key.name}"):
                answer = relay(f"{server.inference_url()}/v2/models/{model}/infer", data, headers)
        except BaseException:
            keys.refund(key, characters)
            raise
        if answer.status_code != 200:
            keys.refund(key, characters)
        return answer


def _ready(server: Server, model: str) -> bool:
    """Every worker READY by TorchServe's describe API, and no drain under way. Unlike ``hymt
    health`` no process is looked at: the front end may run in another container of the pod,
    where TorchServe's process ids name nothing."""
    if server.drain_marker.exists():
        return False
    try:
        return all_ready(model_status(server, model))
    except (requests.RequestException, ValueError, KeyError, IndexError):
        return False


def _versions(server: Server, model: str) -> list[str]:
    """The model's versions as TorchServe's describe API gives them ([] when unknown)."""
    try:
        return [str(entry["modelVersion"]) for entry in describe_model(server, model, "/all")]
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return []


def _unknown(name: str) -> tuple[Response, int]:
    return jsonify(error=f"no model named {name!r} here", error_type="not_found"), 404


def _characters(data: bytes, headers: Mapping[str, str]) -> int:
    """The characters a v2 request asks to translate; InvalidRequest for a malformed one (the
    handler would refuse it the same way)."""
    body: Any = data
    if oip.BINARY_HEADER not in {name.lower() for name in headers}:
        body = decode_body(data)
    fields, call = oip.unwrap(body, dict(headers))
    if call is None:
        raise InvalidRequest(
            "not a v2 inference request: it has no 'inputs'",
            allowed={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": []}]},
            field="inputs",
        )
    return len(fields.get("document", "")) + sum(len(text) for text in fields.get("text", []))
