"""The front end's calls to TorchServe: one ``aiohttp.ClientSession`` (kept-alive connections;
its C parser and connection pool cost the event loop a fraction of httpx's: see
docs/front-end.md), the inference key from TorchServe's key file, an upstream slot held for
each call (:mod:`.fairness`), and TorchServe's answers as Starlette responses, its errors as
``{error, error_type}``.

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

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import anyio
import anyio.to_thread
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from hymt_serve.ops.launcher import KEY_FILE, Server
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
CONNECT_S, ANSWER_S = 5.0, 600.0  # to connect; the longest wait for the next bytes of an answer
IDLE_S = 30.0  # how long an idle kept-alive connection to TorchServe stays open
# What a call to TorchServe raises when it gets no answer: refused, broken, timed out, or
# TorchServe's key file unreadable (KeyFileUnavailable is an OSError).
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


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

    def __init__(self, response: aiohttp.ClientResponse, release: Callable[[], None]) -> None:
        self.status = response.status
        self._response = response
        self._release: Callable[[], None] | None = release

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's bytes as they come."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        finally:
            await self.aclose()

    async def lines(self) -> AsyncIterator[str]:
        """The answer's non-empty lines (one JSON object each: NDJSON) as they come. Split
        here, not by aiohttp's ``readline``, which refuses a line over 128 KiB (a document's
        last line carries the whole translation)."""
        pending = b""
        async for chunk in self.chunks():
            *whole, pending = (pending + chunk).split(b"\n")
            for line in whole:
                if line.strip():
                    yield line.decode("utf-8")
        if pending.strip():
            yield pending.decode("utf-8")

    async def aclose(self) -> None:
        """Close the connection's stream and give the slot back (once; safe to repeat). An
        answer read to its end leaves its connection kept alive; one cut short closes it."""
        release, self._release = self._release, None
        if release is None:
            return
        try:
            self._response.release()
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
        self._session: aiohttp.ClientSession | None = None
        self._where: dict[str, tuple[tuple[int, ...], tuple[str, dict[str, str]]]] = {}

    def open(self) -> None:
        self._session = aiohttp.ClientSession(
            # the upstream slots bound the calls in flight: no second bound here
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_S),
            timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_S, sock_read=ANSWER_S),
            # shared by every client's calls: never keep a cookie between them
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # TorchServe is on this host or in this pod: never via a proxy
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("TorchServe.open() was not called (the app's lifespan does)")
        return self._session

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
                status, _, content = await self._call(f"/predictions/{model}", body)
            except UPSTREAM_ERRORS:
                return 502, UNREACHABLE
        if not _success(status):
            return status, _error_body(status, content)
        try:
            reply = json.loads(content)
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
                answer = await self._call(f"/predictions/{model}", payload)
            except UPSTREAM_ERRORS:
                return json_response(UNREACHABLE, 502)
        return _answer(*answer)

    async def stream(self, model: str, payload: dict[str, Any], *, bulk: bool = False) -> Streamed:
        """``payload`` to ``model``'s predictions, its answer streamed: a :class:`Streamed`
        holding an upstream slot until it is closed. Raises Busy when no slot comes and
        UpstreamFailed when TorchServe cannot be reached or refuses."""
        await self.upstream.acquire(bulk)
        try:
            answer = await self._post(f"/predictions/{model}", payload)
        except UPSTREAM_ERRORS as error:
            self.upstream.release(bulk)
            raise UpstreamFailed(502, UNREACHABLE) from error
        except BaseException:
            self.upstream.release(bulk)
            raise
        if not _success(answer.status):
            try:
                content = await _read(answer)
            except UPSTREAM_ERRORS:
                content = b""
            finally:
                self.upstream.release(bulk)
            raise UpstreamFailed(answer.status, _error_body(answer.status, content))
        return Streamed(answer, functools.partial(self.upstream.release, bulk))

    async def relay_bytes(self, path: str, data: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``data`` as it came (with ``headers``) to ``path`` of the inference API, with
        the inference key; the whole answer (errors as JSON)."""
        try:
            async with self.upstream.slot():
                base, auth = await self.where()
                answer = await _read_whole(
                    self.session.post(f"{base}{path}", data=data, headers={**headers, **auth})
                )
        except UPSTREAM_ERRORS:
            return json_response(UNREACHABLE, 502)
        return _answer(*answer)

    async def describe(
        self, model: str, suffix: str = "", timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """TorchServe's describe API for ``model`` (``suffix``: ``/all``, ``?customized=true``);
        [] unless it answers 200. Raises UPSTREAM_ERRORS (KeyFileUnavailable among them) and
        ValueError for a body that is not JSON."""
        base, auth = await self.where("management")
        status, _, content = await _read_whole(
            self.session.get(
                f"{base}/models/{model}{suffix}",
                headers=auth,
                timeout=aiohttp.ClientTimeout(total=timeout),
            )
        )
        return list(json.loads(content)) if status == 200 else []

    async def handler_description(self, model: str) -> dict[str, Any]:
        """The handler's describe output for ``model`` (``{engine, model_family, settings}``);
        {} when it cannot be read."""
        try:
            described = await self.describe(model, "?customized=true")
            metadata = described[0]["customizedMetadata"]
            if isinstance(metadata, str):
                metadata = json.loads(metadata)
        except UPSTREAM_ERRORS:
            return {}
        except (ValueError, LookupError, TypeError):  # not the describe API's answer
            return {}
        return metadata if isinstance(metadata, dict) else {}

    async def queue_size(self, model: str) -> int | None:
        """``model``'s job queue size from the describe API; None when it cannot say."""
        try:
            status = (await self.describe(model, timeout=2))[0]["jobQueueStatus"]
            return int(status["remainingCapacity"]) + int(status["pendingRequests"])
        except UPSTREAM_ERRORS:
            return None
        except (ValueError, LookupError, TypeError):  # not the describe API's answer
            return None

    async def _post(self, path: str, payload: dict[str, Any]) -> aiohttp.ClientResponse:
        """POST ``payload`` as JSON to ``path`` of the inference API with the inference key:
        the answer, its body not read yet (raises UPSTREAM_ERRORS)."""
        base, auth = await self.where()
        return await self.session.post(
            f"{base}{path}",
            data=json.dumps(payload, ensure_ascii=False).encode("utf-8"),
            headers={"Content-Type": JSON, **auth},
        )

    async def _call(self, path: str, payload: dict[str, Any]) -> Whole:
        """:meth:`_post`, its answer read whole."""
        return await _read_whole(self._post(path, payload))


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


# An answer read whole: (status, Content-Type, body).
Whole = tuple[int, str, bytes]


async def _read_whole(sending: Awaitable[aiohttp.ClientResponse]) -> Whole:
    """The answer of the call ``sending``, read whole, its connection kept alive."""
    answer = await sending
    content = await _read(answer)
    return answer.status, answer.headers.get("Content-Type") or JSON, content


async def _read(answer: aiohttp.ClientResponse) -> bytes:
    """``answer``'s whole body; its connection released however the read ends."""
    try:
        return await answer.read()
    finally:
        answer.release()


def _success(status: int) -> bool:
    return 200 <= status < 300


def _answer(status: int, media_type: str, content: bytes) -> Response:
    """TorchServe's whole answer as a response (its errors as ``{error, error_type}``)."""
    if not _success(status):
        return json_response(_error_body(status, content), status)
    return Response(content, status_code=status, media_type=media_type)


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return JSONResponse(body, status, headers)


def _error_body(status: int, content: bytes) -> dict[str, Any]:
    """Our JSON errors pass through; TorchServe's own ({code, type, message}) and empty or
    non-JSON bodies become ``{error, error_type}`` (for the same status)."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and "error_type" in body:
        return body
    message = body.get("message") if isinstance(body, dict) else None
    if status == 503:
        message = TORCHSERVE_BUSY
    return {
        "error": message or EMPTY_BODY_MESSAGES.get(status, f"HTTP {status}"),
        "error_type": TORCHSERVE_TYPES.get(status, "server_error"),
    }
