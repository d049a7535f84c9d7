"""The front end's calls to TorchServe: ``POOLS`` HTTP clients (``httpx.AsyncClient``) taken
in turn (kept-alive connections; several small pools, not one large one: httpcore's pool
assigns requests to connections in time that grows with both, which at 128 calls in flight
cost the event loop several ms a call), the
inference key from TorchServe's key file, an upstream slot held for each call
(:mod:`.fairness`), and TorchServe's answers as Starlette responses, its errors as ``{error,
error_type}``.

For a route module, :class:`TorchServe` is the whole upstream:

- ``await torchserve.post(model, body)``: one call, answered ``(status, JSON object)``;
- ``await torchserve.forward(model, body)``: the request API's proxy (a streamed answer relayed
  as it comes, anything else whole);
- ``await torchserve.stream(model, body)``: a streamed call in progress (:class:`Streamed`,
  its ``lines()`` or ``chunks()``), holding its slot until it ends; ``Relay(streamed,
  content)`` sends it (or a rewrite of it, Server-Sent Events say) and closes it whatever
  happens to the client. :class:`UpstreamFailed` says why a call failed before it streamed.

Nothing here holds a thread while it waits: a call in flight, a stream being relayed and a
call waiting for a slot are coroutines on the event loop. TorchServe's key and config files
are read on a worker thread (a read retries while TorchServe rewrites the key file) when they
changed, so a renewed key or a restart on other ports is picked up at the next call.
"""

from __future__ import annotations

import functools
import http.cookiejar
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
import anyio.to_thread
import httpx
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from hymt_serve.ops.launcher import KEY_FILE, KeyFileUnavailable, Server
from hymt_serve.web.fairness import Answer, Upstream

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
CONNECT_S, ANSWER_S = 5.0, 600.0
KEEP_ALIVE = 512  # idle connections kept to TorchServe (a refinement makes seven calls)
POOLS = 16  # HTTP clients the calls take in turn, each keeping KEEP_ALIVE / POOLS idle


class UpstreamFailed(Exception):
    """A call got no answer to relay: ``status`` and the ``{error, error_type}`` ``body``
    (TorchServe's error, or 502 ``server_unavailable`` when it could not be reached)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("error", f"HTTP {status}"))
        self.status, self.body = status, body


class Streamed:
    """A streamed answer of TorchServe in progress (status 2xx). It holds its upstream slot
    until :meth:`aclose`, which ``chunks()`` and ``lines()`` call at their end and
    :class:`Relay` calls when the response ends, however it ends."""

    def __init__(self, response: httpx.Response, release: Callable[[], None]) -> None:
        self.status = response.status_code
        self._response = response
        self._release: Callable[[], None] | None = release

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's bytes as they come."""
        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        finally:
            await self.aclose()

    async def lines(self) -> AsyncIterator[str]:
        """The answer's non-empty lines (one JSON object each: NDJSON) as they come."""
        try:
            async for line in self._response.aiter_lines():
                if line.strip():
                    yield line
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the connection's stream and give the slot back (once; safe to repeat)."""
        release, self._release = self._release, None
        if release is None:
            return
        try:
            with anyio.CancelScope(shield=True):  # also when the client's task is cancelled
                await self._response.aclose()
        finally:
            release()


class Relay(StreamingResponse):
    """``streamed`` sent to the client as it comes (``content``: a rewrite of its lines or
    chunks; its bytes by default), with TorchServe's status; the upstream closed and its slot
    given back when the response ends, the client went away or the relay failed."""

    def __init__(
        self,
        streamed: Streamed,
        content: AsyncIterator[bytes | str] | None = None,
        media_type: str = NDJSON,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        body = streamed.chunks() if content is None else content
        super().__init__(body, streamed.status, headers, media_type)
        self._streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._streamed.aclose()


class TorchServe:
    """This front end's calls to TorchServe ``server``, each holding a slot of ``upstream``.

    ``open()`` makes the HTTP client on the running event loop (the app's lifespan does),
    ``close()`` ends it."""

    def __init__(self, server: Server, upstream: Upstream | None = None) -> None:
        self.server = server
        self.upstream = upstream or Upstream()
        self._clients: list[httpx.AsyncClient] = []
        self._turn = 0
        self._where: dict[str, tuple[tuple[int, ...], tuple[str, dict[str, str]]]] = {}

    def open(self) -> None:
        # Shared by every client's calls: never keep a cookie between them.
        no_cookies = http.cookiejar.CookieJar(
            http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
        )
        self._clients = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(ANSWER_S, connect=CONNECT_S),
                # the upstream slots bound the calls in flight; this only keeps idle ones
                limits=httpx.Limits(
                    max_connections=None, max_keepalive_connections=KEEP_ALIVE // POOLS
                ),
                cookies=no_cookies,
                trust_env=False,  # TorchServe is on this host or in this pod: never via a proxy
            )
            for _ in range(POOLS)
        ]

    async def close(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()

    @property
    def client(self) -> httpx.AsyncClient:
        """The next of the clients, in turn (one call uses one)."""
        if not self._clients:
            raise RuntimeError("TorchServe.open() was not called (the app's lifespan does)")
        self._turn = (self._turn + 1) % len(self._clients)
        return self._clients[self._turn]

    async def where(self, api: str = "inference") -> tuple[str, dict[str, str]]:
        """``api``'s base URL and its key's headers; KeyFileUnavailable while the key file
        stays unreadable. Read again (on a worker thread) only when the config or key file
        changed: a call otherwise costs two ``stat``s on the loop."""
        stamp = _stamp(self.server)
        known = self._where.get(api)
        if known is not None and known[0] == stamp:
            return known[1]
        found = await anyio.to_thread.run_sync(_where, self.server, api)
        self._where[api] = (stamp, found)  # a change during the read makes the next stamp differ
        return found

    async def post(self, model: str, body: dict[str, Any], *, bulk: bool = False) -> Answer:
        """``body`` to ``model``'s predictions, not streamed: (status, JSON object), errors as
        ``{error, error_type}``; Busy when no upstream slot comes (a :class:`.fairness.Post`)."""
        async with self.upstream.slot(bulk):
            try:
                answer = await self._send(f"/predictions/{model}", body)
            except (httpx.HTTPError, KeyFileUnavailable):
                return 502, UNREACHABLE
        if not answer.is_success:
            return answer.status_code, await _error_body(answer)
        try:
            reply = answer.json()
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            return 502, {"error": f"{model} answered no JSON object", "error_type": "server_error"}
        return 200, reply

    async def forward(self, model: str, payload: dict[str, Any]) -> Response:
        """The request API's proxy: ``payload`` to ``model``; a streamed answer relayed as it
        comes (its slot held to its end), any other answer whole, errors as JSON. A document is
        bulk work (:mod:`.fairness`). Raises Busy when no slot comes."""
        bulk = isinstance(payload.get("document"), str)
        if payload.get("stream") is True:
            try:
                return Relay(await self.stream(model, payload, bulk=bulk))
            except UpstreamFailed as failed:
                return json_response(failed.body, failed.status)
        async with self.upstream.slot(bulk):
            try:
                answer = await self._send(f"/predictions/{model}", payload)
            except (httpx.HTTPError, KeyFileUnavailable):
                return json_response(UNREACHABLE, 502)
        return await _answer(answer)

    async def stream(self, model: str, payload: dict[str, Any], *, bulk: bool = False) -> Streamed:
        """``payload`` to ``model``'s predictions, its answer streamed: a :class:`Streamed`
        holding an upstream slot until it is closed. Raises Busy when no slot comes and
        UpstreamFailed when TorchServe cannot be reached or refuses."""
        await self.upstream.acquire(bulk)
        try:
            answer = await self._send(f"/predictions/{model}", payload, stream=True)
        except (httpx.HTTPError, KeyFileUnavailable) as error:
            self.upstream.release(bulk)
            raise UpstreamFailed(502, UNREACHABLE) from error
        except BaseException:
            self.upstream.release(bulk)
            raise
        if not answer.is_success:
            try:
                raise UpstreamFailed(answer.status_code, await _error_body(answer))
            finally:
                self.upstream.release(bulk)
        return Streamed(answer, functools.partial(self.upstream.release, bulk))

    async def relay_bytes(self, path: str, data: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``data`` as it came (with ``headers``) to ``path`` of the inference API, with
        the inference key; the whole answer (errors as JSON)."""
        try:
            async with self.upstream.slot():
                base, auth = await self.where()
                answer = await self.client.post(
                    f"{base}{path}", content=data, headers={**headers, **auth}
                )
        except (httpx.HTTPError, KeyFileUnavailable):
            return json_response(UNREACHABLE, 502)
        return await _answer(answer)

    async def describe(
        self, model: str, suffix: str = "", timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """TorchServe's describe API for ``model`` (``suffix``: ``/all``, ``?customized=true``);
        [] unless it answers 200. Raises httpx's errors, KeyFileUnavailable, and ValueError
        for a body that is not JSON."""
        base, auth = await self.where("management")
        answer = await self.client.get(
            f"{base}/models/{model}{suffix}", headers=auth, timeout=timeout
        )
        return list(answer.json()) if answer.status_code == 200 else []

    async def handler_description(self, model: str) -> dict[str, Any]:
        """The handler's describe output for ``model`` (``{engine, model_family, settings}``);
        {} when it cannot be read."""
        try:
            described = await self.describe(model, "?customized=true")
            metadata = described[0]["customizedMetadata"]
            if isinstance(metadata, str):
                metadata = json.loads(metadata)
        except (httpx.HTTPError, OSError, ValueError, KeyError, IndexError, TypeError):
            return {}
        return metadata if isinstance(metadata, dict) else {}

    async def queue_size(self, model: str) -> int | None:
        """``model``'s job queue size from the describe API; None when it cannot say."""
        try:
            status = (await self.describe(model, timeout=2))[0]["jobQueueStatus"]
            return int(status["remainingCapacity"]) + int(status["pendingRequests"])
        except (httpx.HTTPError, OSError, ValueError, KeyError, IndexError, TypeError):
            return None

    async def _send(
        self, path: str, payload: dict[str, Any], *, stream: bool = False
    ) -> httpx.Response:
        """POST ``payload`` as JSON to ``path`` of the inference API with the inference key
        (raises httpx's errors and KeyFileUnavailable); read whole unless ``stream``."""
        base, auth = await self.where()
        client = self.client
        request = client.build_request(
            "POST",
            f"{base}{path}",
            content=json.dumps(payload, ensure_ascii=False).encode("utf-8"),
            headers={"Content-Type": JSON, **auth},
        )
        return await client.send(request, stream=stream)


def _stamp(server: Server) -> tuple[int, ...]:
    """The config and key files' change times and sizes (0s for one that is missing)."""
    stamp: list[int] = []
    for path in (server.config_path, server.workdir / KEY_FILE):
        try:
            found = path.stat()
            stamp += [found.st_mtime_ns, found.st_size, found.st_ino]
        except OSError:
            stamp += [0, 0, 0]
    return tuple(stamp)


def _where(server: Server, api: str) -> tuple[str, dict[str, str]]:
    """(base URL, headers) of ``api`` on ``server``: reads config.properties and the key file
    (on a worker thread: a half-written key file is read again for up to 2 s)."""
    base = server.inference_url() if api == "inference" else server.management_url()
    return base, server.headers(api)


async def _answer(answer: httpx.Response) -> Response:
    """TorchServe's whole (read) answer as a response (its errors as ``{error, error_type}``)."""
    if not answer.is_success:
        return json_response(await _error_body(answer), answer.status_code)
    return Response(
        answer.content,
        status_code=answer.status_code,
        media_type=answer.headers.get("Content-Type") or JSON,
    )


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return JSONResponse(body, status, headers)


async def _error_body(answer: httpx.Response) -> dict[str, Any]:
    """Our JSON errors pass through; TorchServe's own ({code, type, message}) and empty or
    non-JSON bodies become ``{error, error_type}`` (for the same status). Closes ``answer``."""
    status = answer.status_code
    try:
        await answer.aread()
        body = answer.json()
    except (ValueError, httpx.HTTPError):
        body = None
    finally:
        await answer.aclose()
    if isinstance(body, dict) and "error_type" in body:
        return body
    message = body.get("message") if isinstance(body, dict) else None
    if status == 503:
        message = TORCHSERVE_BUSY
    return {
        "error": message or EMPTY_BODY_MESSAGES.get(status, f"HTTP {status}"),
        "error_type": TORCHSERVE_TYPES.get(status, "server_error"),
    }
