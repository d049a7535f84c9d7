"""The front end's calls to TorchServe: one pool of kept-alive connections, the inference key
from TorchServe's key file, an upstream slot held for each call (:mod:`.fairness`), and
TorchServe's answers as Flask responses, its errors as ``{error, error_type}``.
"""

from __future__ import annotations

import functools
import http.cookiejar
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import requests
from flask import Response, jsonify

from hymt_serve.ops.launcher import KeyFileUnavailable, Server, describe_model
from hymt_serve.web.fairness import Answer, Post, Upstream

JSON, NDJSON = "application/json", "application/x-ndjson"
TORCHSERVE_TYPES = {400: "invalid_request", 413: "payload_too_large", 503: "server_busy"}
UNREACHABLE = {
    "error": "the translation server cannot be reached",
    "error_type": "server_unavailable",
}
# TorchServe answers some statuses with an empty body (413 for a body over max_request_size).
EMPTY_BODY_MESSAGES = {
    413: "the request is larger than the server accepts",
    503: "the server is busy",
}
# TorchServe's own 503 (a full job queue, or no live worker) says "use scale workers API":
# advice for its operator, not for a client.
TORCHSERVE_BUSY = "the translation server is busy or restarting: retry in a moment"


def forward(server: Server, upstream: Upstream, url: str, payload: dict[str, Any]) -> Response:
    """POST ``payload`` to ``url`` with the inference key, holding an upstream slot (until
    the end of a streamed answer); the answer as a Flask response."""
    streaming = payload.get("stream") is True
    bulk = isinstance(payload.get("document"), str)  # a document is bulk work (fairness)
    upstream.acquire(bulk)
    try:
        answer = _post_upstream(server, url, payload, streaming)
    except (requests.RequestException, KeyFileUnavailable):
        upstream.release(bulk)
        return json_response(UNREACHABLE, 502)
    if streaming and answer.ok:
        done = functools.partial(upstream.release, bulk)
        return Response(_relay(answer, done), status=answer.status_code, mimetype=NDJSON)
    upstream.release(bulk)
    return _answer(answer)


def relay_bytes(
    server: Server, upstream: Upstream, url: str, data: bytes, headers: Mapping[str, str]
) -> Response:
    """POST ``data`` as it came (with ``headers``) to ``url`` with the inference key."""
    try:
        with upstream.slot():
            answer = _session().post(
                url,
                data=data,
                headers={**headers, **server.headers("inference")},
                timeout=(5, 600),
            )
    except (requests.RequestException, KeyFileUnavailable):
        return json_response(UNREACHABLE, 502)
    return _answer(answer)


def _answer(upstream: requests.Response) -> Response:
    """TorchServe's whole answer as a Flask response (its errors as ``{error, error_type}``)."""
    if not upstream.ok:
        return json_response(_error_body(upstream), upstream.status_code)
    return Response(
        upstream.content,
        status=upstream.status_code,
        content_type=upstream.headers.get("Content-Type") or JSON,
    )


def json_response(body: dict[str, Any], status: int) -> Response:
    response = jsonify(body)
    response.status_code = status
    return response


@functools.cache
def _session() -> requests.Session:
    """One connection pool to TorchServe for every thread (urllib3's pool is thread-safe):
    kept-alive connections instead of a new one per call (a refinement makes seven)."""
    session = requests.Session()
    # Shared by every client's calls: never keep a cookie between them.
    session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=512)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _post_upstream(
    server: Server, url: str, payload: dict[str, Any], stream: bool = False
) -> requests.Response:
    """POST ``payload`` as JSON to ``url`` with the inference key (raises RequestException)."""
    return _session().post(
        url,
        data=json.dumps(payload, ensure_ascii=False).encode("utf-8"),
        headers={"Content-Type": JSON, **server.headers("inference")},
        stream=stream,
        timeout=(5, 600),
    )


def poster(server: Server, upstream: Upstream) -> Post:
    """A call of one model's predictions (not streamed) that answers (status, JSON object),
    holding an upstream slot (raises Busy when none comes)."""

    def post(model: str, body: dict[str, Any], *, bulk: bool = False) -> Answer:
        url = f"{server.inference_url()}/predictions/{model}"
        try:
            with upstream.slot(bulk):
                answer = _post_upstream(server, url, body)
        except (requests.RequestException, KeyFileUnavailable):
            return 502, UNREACHABLE
        if not answer.ok:
            return answer.status_code, _error_body(answer)
        try:
            reply = answer.json()
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            return 502, {"error": f"{model} answered no JSON object", "error_type": "server_error"}
        return 200, reply

    return post


def _relay(upstream: requests.Response, done: Callable[[], None]) -> Iterator[bytes]:
    """The streamed answer's bytes as they come; ``done`` at its end (or the client's)."""
    try:
        yield from upstream.iter_content(chunk_size=None)
    finally:
        upstream.close()
        done()


def _error_body(upstream: requests.Response) -> dict[str, Any]:
    """Our JSON errors pass through; TorchServe's own ({code, type, message}) and empty or
    non-JSON bodies become ``{error, error_type}`` (for the same status)."""
    status = upstream.status_code
    try:
        body = upstream.json()
    except ValueError:
        body = None
    finally:
        upstream.close()
    if isinstance(body, dict) and "error_type" in body:
        return body
    message = body.get("message") if isinstance(body, dict) else None
    if status == 503:
        message = TORCHSERVE_BUSY
    return {
        "error": message or EMPTY_BODY_MESSAGES.get(status, f"HTTP {status}"),
        "error_type": TORCHSERVE_TYPES.get(status, "server_error"),
    }


def queue_size(server: Server, model: str) -> int | None:
    """The model's job queue size from TorchServe's describe API; None when it cannot say."""
    try:
        status = describe_model(server, model, timeout=2)[0]["jobQueueStatus"]
        return int(status["remainingCapacity"]) + int(status["pendingRequests"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
