"""The glossary routes: DeepL's v2 glossary API and the same objects in our API
(docs/glossaries.md). :func:`.compat.compat_routes` adds both to the app.

- DeepL (v2, ``Authorization: DeepL-Auth-Key ...``; JSON or form bodies; errors
  ``{"message", "detail"}``): ``GET /v2/glossary-language-pairs``, ``POST /v2/glossaries``
  (``name``, ``source_lang``, ``target_lang``, ``entries``, ``entries_format`` tsv or csv) ->
  201 and the glossary, ``GET /v2/glossaries`` -> ``{"glossaries": [...]}``,
  ``GET|DELETE /v2/glossaries/{id}`` (204 for a deletion), ``GET /v2/glossaries/{id}/entries``
  -> TSV (``Accept: text/tab-separated-values``; 415 for another type).
- Ours (JSON; the key as for ``/api/translate``; errors ``{"error", "error_type"}``):
  ``POST|GET /api/glossaries``, ``GET|DELETE /api/glossaries/{id}``,
  ``GET /api/glossaries/{id}/entries`` -> ``{"glossary_id", "entries": [{"source",
  "target"}, ...]}``; ``entries`` may be a JSON list of pairs besides TSV or CSV text.

A glossary id that is not one of the caller's is 404, whoever made it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from hymt_serve.web.bodies import json_object
from hymt_serve.web.glossaries import NOT_FOUND, Glossary, GlossaryStore, api_owner, language_pairs
from hymt_serve.web.glossary_entries import (
    GlossaryError,
    Pair,
    glossary_language,
    parse_entries,
    term_problem,
    to_tsv,
)
from hymt_serve.web.keys import ClientKeys
from hymt_serve.web.torchserve import json_response

# A DeepL route's work once its key and parameters are read: (request, params, owner).
Action = Callable[[Request, dict[str, Any], str], Awaitable[Response]]
TSV = "text/tab-separated-values"
ACCEPTED = (TSV, "text/*", "*/*")


def deepl_glossary_routes(
    store: GlossaryStore, route: Callable[[Action], Callable[[Request], Awaitable[Response]]]
) -> list[BaseRoute]:
    """DeepL's glossary routes; ``route`` makes an endpoint of an action (it reads the DeepL
    key and the parameters, and answers GlossaryError in DeepL's shape)."""

    async def pairs(request: Request, params: dict[str, Any], owner: str) -> Response:
        return json_response({"supported_languages": language_pairs()})

    async def collection(request: Request, params: dict[str, Any], owner: str) -> Response:
        if request.method == "POST":
            return json_response((await create(store, owner, params)).json(), 201)
        return json_response({"glossaries": await listing(store, owner)})

    async def one(request: Request, params: dict[str, Any], owner: str) -> Response:
        glossary_id = request.path_params["glossary_id"]
        if request.method == "DELETE":
            await delete(store, owner, glossary_id)
            return Response(status_code=204)
        return json_response((await get(store, owner, glossary_id)).json())

    async def entries(request: Request, params: dict[str, Any], owner: str) -> Response:
        offered = request.headers.get("Accept") or TSV
        kinds = [part.split(";", 1)[0].strip().lower() for part in offered.split(",")]
        if not any(kind in ACCEPTED for kind in kinds):
            raise GlossaryError(415, "No supported media type specified in Accept header", TSV)
        _, found = await entries_of(store, owner, request.path_params["glossary_id"])
        return Response(to_tsv(found), media_type=f"{TSV}; charset=utf-8")

    return [
        Route("/v2/glossary-language-pairs", route(pairs), name="deepl_glossary_pairs"),
        Route(
            "/v2/glossaries", route(collection), methods=["GET", "POST"], name="deepl_glossaries"
        ),
        Route(
            "/v2/glossaries/{glossary_id}",
            route(one),
            methods=["GET", "DELETE"],
            name="deepl_glossary",
        ),
        Route(
            "/v2/glossaries/{glossary_id}/entries", route(entries), name="deepl_glossary_entries"
        ),
    ]


def api_glossary_routes(store: GlossaryStore, keys: ClientKeys) -> list[BaseRoute]:
    """Our API's glossary routes (``/api/glossaries``), owned as :func:`.api_owner` says."""

    async def collection(request: Request) -> Response:
        try:
            owner = api_owner(request, keys)
            if request.method == "GET":
                return json_response({"glossaries": await listing(store, owner)})
            body = await json_object(request)
            if body is None:
                raise GlossaryError(400, "Send a JSON object with 'Content-Type: application/json'")
            return json_response((await create(store, owner, body)).json(), 201)
        except GlossaryError as error:
            return json_response(error.api_body(), error.status)

    async def one(request: Request) -> Response:
        glossary_id = request.path_params["glossary_id"]
        try:
            owner = api_owner(request, keys)
            if request.method == "DELETE":
                await delete(store, owner, glossary_id)
                return Response(status_code=204)
            return json_response((await get(store, owner, glossary_id)).json())
        except GlossaryError as error:
            return json_response(error.api_body(), error.status)

    async def entries(request: Request) -> Response:
        glossary_id = request.path_params["glossary_id"]
        try:
            _, found = await entries_of(store, api_owner(request, keys), glossary_id)
        except GlossaryError as error:
            return json_response(error.api_body(), error.status)
        listed = [{"source": source, "target": target} for source, target in found]
        return json_response({"glossary_id": glossary_id, "entries": listed})

    return [
        Route("/api/glossaries", collection, methods=["GET", "POST"], name="api_glossaries"),
        Route("/api/glossaries/{glossary_id}", one, methods=["GET", "DELETE"], name="api_glossary"),
        Route("/api/glossaries/{glossary_id}/entries", entries, name="api_glossary_entries"),
    ]


async def create(store: GlossaryStore, owner: str, params: dict[str, Any]) -> Glossary:
    """A new glossary of ``owner`` from a create call's ``params`` (DeepL's fields, or ours
    with ``entries`` as a JSON list); GlossaryError saying what is wrong with them."""
    name = params.get("name")
    problem = term_problem(name) if isinstance(name, str) else "is missing or not a string"
    if problem:
        raise GlossaryError(400, "Missing or invalid argument: name", f"the name {problem}")
    assert isinstance(name, str)
    source = _language(params, "source_lang")
    target = _language(params, "target_lang")
    if source == target:
        raise GlossaryError(
            400,
            "Unsupported glossary source and target language pair",
            f"both are {source}; GET /v2/glossary-language-pairs lists the pairs",
        )
    entries_format = params.get("entries_format") or "tsv"
    # CPU work on up to 10 MiB: off the event loop.
    pairs = await asyncio.to_thread(
        parse_entries, params.get("entries"), entries_format, (source, target)
    )
    return await asyncio.to_thread(store.create, owner, name, source, target, pairs)


async def listing(store: GlossaryStore, owner: str) -> list[dict[str, Any]]:
    return [glossary.json() for glossary in await asyncio.to_thread(store.listing, owner)]


async def get(store: GlossaryStore, owner: str, glossary_id: str) -> Glossary:
    found = await asyncio.to_thread(store.get, owner, glossary_id)
    if found is None:
        raise GlossaryError(404, NOT_FOUND)
    return found


async def entries_of(
    store: GlossaryStore, owner: str, glossary_id: str
) -> tuple[Glossary, tuple[Pair, ...]]:
    found = await asyncio.to_thread(store.entries, owner, glossary_id)
    if found is None:
        raise GlossaryError(404, NOT_FOUND)
    return found


async def delete(store: GlossaryStore, owner: str, glossary_id: str) -> None:
    if not await asyncio.to_thread(store.delete, owner, glossary_id):
        raise GlossaryError(404, NOT_FOUND)


def _language(params: dict[str, Any], name: str) -> str:
    code = params.get(name)
    found = glossary_language(code)
    if found is None:
        detail = f"{code!r} is not a language of this server" if code else "it is missing"
        raise GlossaryError(400, f"Value for '{name}' not supported.", detail)
    return found
