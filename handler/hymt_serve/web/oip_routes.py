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
  character limit counts the texts (refunded when the translation fails, and by what the
  translation memory served: a 200's ``parameters.memory_characters``), forwarded to
  TorchServe's v2 route with this front end's TorchServe key; JSON or binary tensors.

Errors are ``{"error": ...}`` (the protocol's), with the request API's ``error_type``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from hymt_serve import __version__
from hymt_serve.ops.launcher import all_ready
from hymt_serve.request import oip
from hymt_serve.request.errors import InvalidRequest, ServiceError
from hymt_serve.request.protocol import decode_body
from hymt_serve.web.access import bearer_key, client_name, memory_refund
from hymt_serve.web.fairness import KeyLimits
from hymt_serve.web.keys import ClientKeys
from hymt_serve.web.torchserve import UPSTREAM_ERRORS, TorchServe, json_response

FORWARDED_HEADERS = ("Content-Type", oip.BINARY_HEADER)
INPUTS = [
    {"name": "text", "datatype": "BYTES", "shape": [-1]},
    {"name": "document", "datatype": "BYTES", "shape": [1]},
    {"name": "glossary", "datatype": "BYTES", "shape": [-1, 2]},
    {"name": "preferences", "datatype": "BYTES", "shape": [-1]},
    {"name": "candidates", "datatype": "BYTES", "shape": [-1, -1]},
]
OUTPUT_TYPES = {"input_tokens": "INT64", "output_tokens": "INT64", "format_tags_lost": "INT64"}


def oip_routes(
    torchserve: TorchServe, model: str, keys: ClientKeys, limits: KeyLimits
) -> list[BaseRoute]:
    """The protocol's routes for ``model`` on ``torchserve`` (each client key's requests in
    progress bounded by ``limits``)."""

    async def server_metadata(request: Request) -> Response:
        return json_response(
            {"name": "hunyuan-mt-torchserve", "version": __version__, "extensions": []}
        )

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def server_ready(request: Request) -> Response:
        ready = await _ready(torchserve, model)
        return json_response({"ready": ready}, 200 if ready else 503)

    async def model_ready(request: Request) -> Response:
        name = request.path_params["name"]
        if name != model:
            return _unknown(name)
        ready = await _ready(torchserve, model)
        return json_response({"name": name, "ready": ready}, 200 if ready else 503)

    async def model_metadata(request: Request) -> Response:
        name = request.path_params["name"]
        if name != model:
            return _unknown(name)
        outputs = [
            {"name": output, "datatype": OUTPUT_TYPES.get(output, "BYTES"), "shape": [-1]}
            for output in oip.TEXT_OUTPUTS
        ]
        return json_response(
            {
                "name": name,
                "versions": await _versions(torchserve, name),
                "platform": "torchserve",
                "inputs": INPUTS,
                "outputs": [*outputs, {"name": "document", "datatype": "BYTES", "shape": [1]}],
            }
        )

    async def infer(request: Request) -> Response:
        name = request.path_params["name"]
        if name != model:
            return _unknown(name)
        key = bearer_key(request, keys)
        if key is None:
            return json_response(
                {"error": "a client key is required", "error_type": "unauthorized"}, 401
            )
        data = await request.body()
        try:
            characters = _characters(data, dict(request.headers))
        except ServiceError as error:
            return json_response(error.body(None), error.status)
        if not keys.reserve(key, characters):
            return json_response(
                {"error": "the character limit of this key is reached",
                 "error_type": "quota_exceeded"},
                429,
            )  # fmt: skip
        headers = {h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers}
        try:
            with limits.hold(client_name(key)):
                answer = await torchserve.relay_bytes(f"/v2/models/{model}/infer", data, headers)
        except BaseException:
            keys.refund(key, characters)
            raise
        if answer.status_code != 200:
            keys.refund(key, characters)
        elif b'"memory_characters"' in answer.body:  # usage is flattened into parameters
            with contextlib.suppress(ValueError, AttributeError):  # not a v2 JSON reply
                parameters = json.loads(bytes(answer.body)).get("parameters")
                memory_refund(keys, key, {"usage": parameters})
        return answer

    return [
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", server_ready, methods=["GET"]),
        Route("/v2/models/{name}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{name}", model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
    ]


async def _ready(torchserve: TorchServe, model: str) -> bool:
    """Every worker READY by TorchServe's describe API, and no drain under way. Unlike ``hymt
    health`` no process is looked at: the front end may run in another container of the pod,
    where TorchServe's process ids name nothing."""
    if torchserve.server.drain_marker.exists():
        return False
    try:
        described = await torchserve.describe(model)
        workers = described[0].get("workers", []) if described else []
        return all_ready([str(worker.get("status")) for worker in workers])
    except UPSTREAM_ERRORS:
        return False
    except (ValueError, LookupError, AttributeError):  # not the describe API's answer
        return False


async def _versions(torchserve: TorchServe, model: str) -> list[str]:
    """The model's versions as TorchServe's describe API gives them ([] when unknown)."""
    try:
        described = await torchserve.describe(model, "/all")
        return [str(entry["modelVersion"]) for entry in described]
    except UPSTREAM_ERRORS:
        return []
    except (ValueError, KeyError, TypeError):  # not the describe API's answer
        return []


def _unknown(name: str) -> Response:
    return json_response({"error": f"no model named {name!r} here", "error_type": "not_found"}, 404)


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
