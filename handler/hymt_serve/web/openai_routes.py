"""OpenAI's API on the web front end (docs/openai.md): ``GET /v1/models``, ``GET
/v1/models/<id>``, ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Like the LibreTranslate, DeepL and v2 APIs, every call needs a key of the front end's key file,
on loopback too (``access.OWN_KEYS``): ``Authorization: Bearer <key>``, what the SDK's
``api_key`` sends; 401 without one. A completion's characters (its messages or prompt) count
against the key's limit, given back when it fails before it answers or before its stream
starts; it is one of the key's requests in progress (``held``) until then, and holds an
upstream slot until its answer or stream ends (a client that goes away frees it at once:
:class:`.torchserve.Relay`).

What a body may hold, what goes to TorchServe (the request API's chat form), the replies, the
server-sent events and the error bodies are :mod:`hymt_serve.request.openai_api`'s and
:mod:`hymt_serve.request.openai_reply`'s. Every
refusal here is OpenAI's ``{"error": {"message", "type", "param", "code"}}``, the front end's
own included: 401 for the key, 429 for its quota (``x-should-retry: false``: waiting does not
help) or for too many requests in progress, 503 (retry) for a full server, 502 when TorchServe
cannot be reached. A stream's status went out with its first event: an error after that is an
``{"error": ...}`` event, then ``data: [DONE]``.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from hymt_serve.request import openai_api, openai_reply
from hymt_serve.request.openai_api import Call, OpenAIError
from hymt_serve.web.access import (
    QUOTA_REACHED,
    QuotaReached,
    bearer_key,
    counted,
    held,
    memory_refund,
    with_namespace,
)
from hymt_serve.web.fairness import RETRY_AFTER_S, Busy, KeyLimits
from hymt_serve.web.keys import ClientKey, ClientKeys
from hymt_serve.web.memory_front import FastPath
from hymt_serve.web.torchserve import (
    UPSTREAM_ERRORS,
    Relay,
    Streamed,
    TorchServe,
    UpstreamFailed,
    json_response,
)

SSE = "text/event-stream"
NO_KEY = (
    "You didn't provide an API key: send 'Authorization: Bearer <key>' with a key of "
    "hymt web's key file"
)
WRONG_KEY = "Incorrect API key provided: use a key of hymt web's key file"
NOT_A_REPLY = "the model server's reply is not a chat-form reply"
NOT_JSON_LINE = {"error": "the model server sent a line that is not a JSON object"}
Refund = Callable[[Any], int]  # a reply's translation memory characters given back to its key


def openai_routes(
    torchserve: TorchServe,
    model: str,
    keys: ClientKeys,
    limits: KeyLimits,
    fast: FastPath | None = None,
) -> list[BaseRoute]:
    """OpenAI's routes, answered by ``model`` on ``torchserve`` (its name is the one model id;
    each key's requests in progress bounded by ``limits``; ``fast`` says whether the
    translation memory is isolated per key)."""
    served = (model,)
    created = int(time.time())  # the models' "created": when this front end started

    async def openai_models(request: Request) -> Response:
        try:
            _client_key(request, keys)
        except OpenAIError as error:
            return _refusal(error)
        return json_response(openai_api.models_list(served, created))

    async def openai_model(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            _client_key(request, keys)
            if name not in served:
                raise openai_api.model_not_found(name)
        except OpenAIError as error:
            return _refusal(error)
        return json_response(openai_api.model_card(name, created))

    async def complete(request: Request, parse: Callable[[Any, tuple[str, ...]], Call]) -> Response:
        try:
            key = _client_key(request, keys)
            call = parse(await request.body(), served)
            isolated = fast is not None and fast.isolated
            return await _answer(torchserve, model, call, keys, key, limits, isolated)
        except OpenAIError as error:
            return _refusal(error)
        except QuotaReached:
            quota = openai_api.quota_exceeded(QUOTA_REACHED["error"])
            return _refusal(quota, {"x-should-retry": "false"})
        except Busy as busy:
            return _refusal(_busy(busy), {"Retry-After": str(busy.retry_after)})

    async def openai_chat(request: Request) -> Response:
        return await complete(request, openai_api.parse_chat)

    async def openai_completions(request: Request) -> Response:
        return await complete(request, openai_api.parse_completion)

    async def openai_unknown(request: Request) -> Response:
        """Any other ``/v1`` path (embeddings, images, ...): OpenAI's 404 (its 401 without a
        key, as every route but the page's and the probes'), not the page's errors."""
        try:
            _client_key(request, keys)
        except OpenAIError as error:
            return _refusal(error)
        path = f"{request.method} {request.url.path}"
        return _refusal(OpenAIError(404, f"Invalid URL ({path})", code="unknown_url"))

    return [
        Route("/v1/models", openai_models, methods=["GET"]),
        Route("/v1/models/{name}", openai_model, methods=["GET"]),
        Route("/v1/chat/completions", openai_chat, methods=["POST"]),
        Route("/v1/completions", openai_completions, methods=["POST"]),
        Route("/v1/{path:path}", openai_unknown, methods=[*UNKNOWN_METHODS]),
    ]


UNKNOWN_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def _client_key(request: Request, keys: ClientKeys) -> ClientKey:
    """The request's bearer key; OpenAIError 401 when it is missing or not one of ``keys``."""
    key = bearer_key(request, keys)
    if key is None:
        given = request.headers.get("Authorization", "").strip()
        raise openai_api.unauthorized(WRONG_KEY if given else NO_KEY)
    return key


async def _answer(
    torchserve: TorchServe,
    model: str,
    call: Call,
    keys: ClientKeys,
    key: ClientKey,
    limits: KeyLimits,
    isolated: bool,
) -> Response:
    """``call`` sent to ``model``: the whole response, or the stream once it has begun.
    Raises OpenAIError for a refusal (its characters given back), QuotaReached, Busy."""
    refund = functools.partial(memory_refund, keys, key)
    with held(limits, key), counted(keys, key, call.characters) as outcome:
        send = _streamed if call.stream else _whole
        answer = await send(
            torchserve, model, call, with_namespace(call.forward, key, isolated), refund
        )
        outcome.append(answer.status_code)
        return answer


async def _whole(
    torchserve: TorchServe, model: str, call: Call, forward: dict[str, Any], refund: Refund
) -> Response:
    status, reply = await torchserve.post(model, forward)
    if status != 200:
        raise _upstream_error(status, reply)
    refund(reply)  # the characters its translation memory served: not billed
    try:
        return json_response(openai_reply.response(call, reply))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise OpenAIError(500, NOT_A_REPLY, kind="server_error") from error


async def _streamed(
    torchserve: TorchServe, model: str, call: Call, forward: dict[str, Any], refund: Refund
) -> Response:
    try:
        streamed = await torchserve.stream(model, forward)
    except UpstreamFailed as failed:
        raise _upstream_error(failed.status, failed.body) from None
    headers = {"Cache-Control": "no-cache"}
    return Relay(streamed, _events(streamed, call, refund), SSE, headers)


async def _events(streamed: Streamed, call: Call, refund: Refund) -> AsyncIterator[str]:
    """The server-sent events for TorchServe's NDJSON lines, ending in ``data: [DONE]``
    however TorchServe's stream ends; the reply's memory characters given back at its line."""
    stream = openai_reply.Stream(call)
    for event in stream.opening():
        yield event
    try:
        async for line in streamed.lines():
            parsed = _line(line)
            if "usage" in parsed:
                refund(parsed)
            for event in stream.event(parsed):
                yield event
            if stream.finished:
                break
    except UPSTREAM_ERRORS:
        pass  # TorchServe's connection broke: broken() below says so
    for event in stream.broken():
        yield event


def _line(line: str) -> Mapping[str, Any]:
    """One NDJSON line of TorchServe's stream (a line that is not a JSON object: an error)."""
    try:
        parsed = json.loads(line)
    except ValueError:
        return NOT_JSON_LINE
    return parsed if isinstance(parsed, dict) else NOT_JSON_LINE


def _upstream_error(status: int, body: Mapping[str, Any]) -> OpenAIError:
    """TorchServe's or the handler's refusal (``{error, error_type}``: :mod:`.torchserve`) as
    OpenAI's; TorchServe out of reach stays a 502."""
    if body.get("error_type") == "server_unavailable":
        message = str(body.get("error") or "the model server cannot be reached")
        return OpenAIError(502, message, kind="server_error", code="server_unavailable")
    return openai_reply.error_from_reply(status, body)


def _busy(busy: Busy) -> OpenAIError:
    """The front end's own "not now": too many requests of this key (429), or no upstream
    slot came (503)."""
    if busy.status == 429:
        return openai_api.rate_limited(busy.message)
    return OpenAIError(503, busy.message, kind="server_error", code="overloaded")


def _refusal(error: OpenAIError, headers: Mapping[str, str] | None = None) -> Response:
    """``error`` answered; a 503 says when to try again."""
    if headers is None and error.status == 503:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    return json_response(error.body(), error.status, headers)
