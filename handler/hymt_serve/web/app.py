"""The web front end: serves the page and forwards translations to TorchServe.

The TorchServe inference key stays on this server (read from the key file at each call, so a
renewed key is picked up); the browser never sees it. ``/api/translate`` is a proxy of the
request API: the JSON object the browser sent is forwarded whole, so TorchServe's and the
handler's own answers (errors included) reach the browser. A single text is streamed unless the
client says otherwise: the page receives TorchServe's newline-delimited JSON as it is generated.

Who may call what (:mod:`.access`): the page itself and the health probes are open. The
LibreTranslate, DeepL, v2 inference and OpenAI APIs always ask for a client key (each in its
API's own way). Everything else (the page's ``/api/*``, the language and model lists) is open
when the front end listens on loopback only, and asks for a client key (``Authorization: Bearer
<key>``, characters counted against its limit) when ``require_keys`` (``hymt web`` sets it for
any other address). Every call to TorchServe holds an upstream slot, and each client key's
requests in progress are bounded (:mod:`.fairness`).

The app is a Starlette (ASGI) app, served by uvicorn (``hymt web``): every request, and every
stream relayed from TorchServe, is a coroutine on one event loop, not a thread. Its lifespan
opens the HTTP client to TorchServe and, at the end, closes it and cancels the DeepL document
jobs in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from hymt_serve.ops.launcher import Server
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.web.access import (
    QUOTA_REACHED,
    KeyCheck,
    QuotaReached,
    client_key,
    counted,
    held,
    memory_refund,
    with_namespace,
)
from hymt_serve.web.bodies import json_object
from hymt_serve.web.compat import compat_routes
from hymt_serve.web.deepl_documents import DocumentJobs, document_routes
from hymt_serve.web.fairness import Busy, KeyLimits, Upstream
from hymt_serve.web.glossaries import api_owner, store_of, with_glossary
from hymt_serve.web.glossary_entries import GlossaryError
from hymt_serve.web.keys import ClientKey, ClientKeys
from hymt_serve.web.memory_front import FastPath
from hymt_serve.web.oip_routes import oip_routes
from hymt_serve.web.openai_routes import openai_routes
from hymt_serve.web.refine import refine
from hymt_serve.web.torchserve import TorchServe, json_response

STATIC = Path(__file__).with_name("static")
DEFAULT_MAX_CHARS = 4000
DEFAULT_MAX_DOCUMENT_BYTES = 1_048_576
DEFAULT_MAX_OFFICE_BYTES = 4_194_304  # the handler's default max_office_bytes
DEFAULT_MAX_TEXTS = 16
# The family features the page has controls for.
PAGE_FEATURES = (
    "glossary",
    "context",
    "preserve_format",
    "style",
    "preferences",
    "delimiters",
    "data_format",
)
NOT_JSON = {
    "error": "send a JSON object with the header 'Content-Type: application/json'",
    "error_type": "invalid_request",
}
# Starlette's own refusals (no such route, a method the route lacks), as JSON.
HTTP_ERROR_TYPES = {404: "not_found", 405: "method_not_allowed"}


def create_app(
    server: Server,
    model: str = "hunyuan-mt",
    refine_model: str | None = None,
    client_keys: ClientKeys | None = None,
    *,
    require_keys: bool = False,
    upstream: Upstream | None = None,
    limits: KeyLimits | None = None,
) -> Starlette:
    """The app for the page of TorchServe ``server`` serving ``model`` (and, for
    ``/api/refine``, the Hunyuan-MT-Chimera model named ``refine_model``); with
    ``client_keys``, also the LibreTranslate, DeepL, v2 and OpenAI APIs (:mod:`.compat`,
    :mod:`.oip_routes`, :mod:`.openai_routes`). ``require_keys``: every route but
    ``access.ALWAYS_OPEN`` needs a client key (``client_keys`` required then). ``upstream``: the
    slots of the calls to TorchServe (by default sized from ``model``'s job queue); ``limits``:
    each key's requests in progress. The app's state holds the pieces a route module needs:
    ``torchserve``, ``limits``, ``client_keys``."""
    if require_keys and client_keys is None:
        raise ValueError("require_keys needs client_keys")
    limits = limits or KeyLimits()
    torchserve = TorchServe(server)
    torchserve.upstream = upstream or Upstream(functools.partial(torchserve.queue_size, model))
    fast: FastPath | None = None
    if client_keys is not None:  # the translation memory's fast path, in the keys' database
        url = client_keys.store.engine.url.render_as_string(hide_password=False)
        fast = FastPath(torchserve, model, url)
    routes = _page_routes(torchserve, model, refine_model, client_keys, limits, fast)
    jobs: DocumentJobs | None = None
    if client_keys is not None:
        max_texts = _max_texts(torchserve, model)
        routes += compat_routes(torchserve.post, model, client_keys, max_texts, limits)
        jobs = DocumentJobs(torchserve.post, model, client_keys, fast)
        routes += document_routes(jobs, client_keys)
        routes += oip_routes(torchserve, model, client_keys, limits)
        routes += openai_routes(torchserve, model, client_keys, limits, fast)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        torchserve.open()
        if jobs is not None:
            await jobs.open()
        try:
            yield
        finally:
            if jobs is not None:
                await jobs.close()
            await torchserve.close()
            if fast is not None:
                await fast.close()
            if client_keys is not None:
                # The usage counted since the last turn, written on a worker thread (the
                # database call blocks).
                await asyncio.to_thread(client_keys.close)

    app = Starlette(
        routes=routes,
        middleware=[Middleware(KeyCheck, routes, client_keys if require_keys else None)],
        exception_handlers={
            QuotaReached: _quota_reached,
            Busy: _busy,
            HTTPException: _http_error,
        },
        lifespan=lifespan,
    )
    app.state.torchserve, app.state.limits, app.state.client_keys = torchserve, limits, client_keys
    app.state.fast = fast  # the translation memory's fast path (None without keys)
    return app


def _page_routes(
    torchserve: TorchServe,
    model: str,
    refine_model: str | None,
    client_keys: ClientKeys | None,
    limits: KeyLimits,
    fast: FastPath | None,
) -> list[BaseRoute]:
    """The page, its files and its API (``/api/*``); a plain request all of whose texts the
    translation memory holds is answered by ``fast`` without TorchServe."""

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def favicon(request: Request) -> Response:
        # Browsers ask for /favicon.ico whatever the page links; the SVG serves both.
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    async def config(request: Request) -> Response:
        languages = [
            {"code": lang.code, "english": lang.english, "chinese": lang.chinese}
            for lang in LANGUAGES.values()
        ]
        described = await torchserve.handler_description(model)
        return json_response(
            {
                "languages": languages,
                "max_chars": _setting(described, "max_chars_per_text", DEFAULT_MAX_CHARS),
                "max_document_bytes": _setting(
                    described, "max_document_bytes", DEFAULT_MAX_DOCUMENT_BYTES
                ),
                "max_office_bytes": _setting(
                    described, "max_office_bytes", DEFAULT_MAX_OFFICE_BYTES
                ),
                "demo_model": _demo_model(described),
                "model": model,
                "family": _family(described),
                "features": _features(described),
                "refine": refine_model is not None,
            }
        )

    async def translate(request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return json_response(NOT_JSON, 400)
        key = client_key(request)
        try:  # a stored glossary's terms in the handler's glossary field (web/glossaries.py)
            owner = api_owner(request, client_keys)
            glossaries = store_of(client_keys) if client_keys is not None else None
            body = await with_glossary(body, owner, glossaries)
        except GlossaryError as error:
            return json_response(error.api_body(), error.status)
        body = _with_default_stream(body)
        if fast is not None and (served := await fast.answer(body, key)) is not None:
            return served  # from the memory: no model work, nothing counted
        with held(limits, key), counted(client_keys, key, _characters(body)) as outcome:
            isolated = fast is not None and fast.isolated
            answer = await torchserve.forward(model, with_namespace(body, key, isolated))
            outcome.append(answer.status_code)
        return _refunding(answer, client_keys, key)

    async def refine_translation(request: Request) -> Response:
        """Candidates from the translation model, refined by Chimera (:mod:`.refine`)."""
        if refine_model is None:
            return json_response(
                {
                    "error": "refinement is not enabled: start hymt web with --refine-model NAME",
                    "error_type": "not_found",
                },
                404,
            )
        body = await json_object(request)
        if body is None:
            return json_response(NOT_JSON, 400)
        key = client_key(request)
        with held(limits, key), counted(client_keys, key, _characters(body)) as outcome:
            status, answer = await refine(body, torchserve.post, model, refine_model)
            outcome.append(status)
        if status == 200:  # the share of its calls the memory answered (web/refine.py)
            memory_refund(client_keys, key, answer)
        return json_response(answer, status)

    return [
        Route("/", page, methods=["GET"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        Route("/api/config", config, methods=["GET"]),
        Route("/api/translate", translate, methods=["POST"]),
        Route("/api/refine", refine_translation, methods=["POST"]),
    ]


def _refunding(answer: Response, keys: ClientKeys | None, key: ClientKey | None) -> Response:
    """``answer``, the characters its translation memory served given back to ``key`` once
    known: at once for a whole answer, at the end of a stream (its last line's usage)."""
    if answer.status_code != 200 or key is None:
        return answer
    if isinstance(answer, StreamingResponse):
        answer.body_iterator = _watching(answer.body_iterator, keys, key)
    elif b'"memory_characters"' in answer.body:
        memory_refund(keys, key, json.loads(bytes(answer.body)))
    return answer


async def _watching(
    chunks: AsyncIterable[Any], keys: ClientKeys | None, key: ClientKey
) -> AsyncIterator[Any]:
    """``chunks`` passed on; the last line's memory characters refunded after the last."""
    tail = b""
    async for chunk in chunks:
        yield chunk
        data = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        lines = (tail + data).rstrip(b"\n").rsplit(b"\n", 1)
        tail = lines[-1] + (b"\n" if data.endswith(b"\n") else b"")
    if b'"memory_characters"' in tail:
        with contextlib.suppress(ValueError):  # not a reply line: nothing to refund
            memory_refund(keys, key, json.loads(tail))


def _max_texts(torchserve: TorchServe, model: str) -> Callable[[], Awaitable[int]]:
    """The handler's texts per request, read once it answers (16 until then)."""
    known: dict[str, int] = {}

    async def max_texts() -> int:
        if "max_texts" not in known:
            settings = (await torchserve.handler_description(model)).get("settings")
            if isinstance(settings, dict) and "max_texts_per_request" in settings:
                known["max_texts"] = int(settings["max_texts_per_request"])
        return known.get("max_texts", DEFAULT_MAX_TEXTS)

    return max_texts


async def _quota_reached(request: Request, error: Exception) -> Response:
    return json_response(QUOTA_REACHED, 429)


async def _busy(request: Request, error: Exception) -> Response:
    assert isinstance(error, Busy)
    return json_response(error.body(), error.status, {"Retry-After": str(error.retry_after)})


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    kind = HTTP_ERROR_TYPES.get(error.status_code, "invalid_request")
    return json_response(
        {"error": error.detail, "error_type": kind}, error.status_code, error.headers
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (hymt web's --host) listens on this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def _with_default_stream(body: dict[str, Any]) -> dict[str, Any]:
    """The browser's request ``body`` as it goes to TorchServe: unchanged, except that a single
    text streams when the client did not choose (``"stream": true`` added)."""
    if "stream" not in body and isinstance(body.get("text"), str):
        return {**body, "stream": True}
    return body


def _characters(body: dict[str, Any]) -> int:
    """The characters a request API body asks to translate (its texts and its document)."""
    text, document = body.get("text"), body.get("document")
    texts = [text] if isinstance(text, str) else text if isinstance(text, list) else []
    count = sum(len(item) for item in texts if isinstance(item, str))
    return count + (len(document) if isinstance(document, str) else 0)


def _setting(described: dict[str, Any], name: str, default: int) -> int:
    """A limit from the handler's settings in ``described``, or ``default``."""
    try:
        return int(described["settings"][name])
    except (KeyError, TypeError, ValueError):
        return default


def _family(described: dict[str, Any]) -> str | None:
    """The loaded model family's name ("HY-MT1.5", ...) from ``described``; None when unknown."""
    family = described.get("model_family")
    title = family.get("model_family") if isinstance(family, dict) else None
    return title if isinstance(title, str) else None


def _features(described: dict[str, Any]) -> list[str]:
    """The request fields beyond the basics that the loaded model family supports and the page
    offers (PAGE_FEATURES), from ``described``; none when unknown."""
    family = described.get("model_family")
    features = family.get("features") if isinstance(family, dict) else None
    if not isinstance(features, list):
        return []
    return [name for name in features if name in PAGE_FEATURES]


def _demo_model(described: dict[str, Any]) -> bool:
    """Whether ``described`` says the engine serves the random-weight demo model (False when
    unknown)."""
    engine = described.get("engine")
    return isinstance(engine, dict) and engine.get("random_weights") is True
