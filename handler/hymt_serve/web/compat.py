"""The LibreTranslate and DeepL (v2) APIs on the web front end, mapped onto our request API, so
that tools written for those servers translate with Hunyuan-MT unchanged.

- LibreTranslate: ``POST /translate`` (``q`` a string or a list, ``source`` a code or
  ``auto``, ``target``, ``format`` text or html, ``api_key``; with ``auto`` the reply's
  ``detectedLanguage``), ``POST /detect`` (``q``, ``api_key``: ``[{"confidence": 0-100,
  "language"}]``, empty when unsure), ``GET /languages``; errors as ``{"error": "..."}``.
- DeepL v2: ``POST /v2/translate`` (``text`` list, ``target_lang``, ``source_lang``,
  ``tag_handling``, ``context``, ``glossary_id``; ``Authorization: DeepL-Auth-Key ...``),
  ``GET /v2/languages``, ``GET /v2/usage``, and the glossary routes (:mod:`.glossary_routes`,
  with ours under ``/api/glossaries``); regional codes mapped (``EN-US``, ``PT-BR``,
  ``ZH-HANT``, ...); errors as ``{"message": "..."}`` with DeepL's statuses (403 key, 456 quota).

Both take form or JSON bodies and this front end's own keys (:mod:`.keys`). HTML
(``format: html``, ``tag_handling``) is our ``preserve_format: "html"``, for the model families
that have it. LibreTranslate's ``auto`` and DeepL without ``source_lang`` are our ``source_lang:
"auto"``: each text's language is detected (:mod:`hymt_serve.request.detect`) and reported
(DeepL's ``detected_source_language``, empty when detection is unsure).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from hymt_serve.request.detect import detect
from hymt_serve.request.languages import LANGUAGES, Language, lookup
from hymt_serve.web.access import client_name, memory_characters, memory_refund, with_namespace
from hymt_serve.web.bodies import BadBody, fields
from hymt_serve.web.deepl_codes import DEEPL_TARGETS, deepl_language_list
from hymt_serve.web.fairness import BULK_CHUNK, RETRY_AFTER_S, Busy, KeyLimits, Post, fan_out
from hymt_serve.web.glossaries import for_texts, pairs_of, store_of, with_glossary
from hymt_serve.web.glossary_entries import GlossaryError
from hymt_serve.web.glossary_routes import Action, api_glossary_routes, deepl_glossary_routes
from hymt_serve.web.keys import ClientKey, ClientKeys
from hymt_serve.web.torchserve import json_response

# LibreTranslate's code for traditional Chinese.
LIBRE_ALIASES = {"zt": "zh-Hant"}
# DeepL options this server cannot honour (refused); the others it does not know (such as
# split_sentences or preserve_formatting) change nothing here and are accepted.
DEEPL_UNSUPPORTED = ("glossary_ids", "style_id", "translation_memory_id")
STATUS_BY_TYPE = {
    "payload_too_large": 413,
    "server_busy": 503,
    "overloaded": 503,
    "server_unavailable": 502,
}
# Texts one request may carry: they go to TorchServe a few chunks at a time (fairness.fan_out),
# so this only bounds how long one request may take and what it holds in memory.
MAX_TEXTS = 50_000


class CompatError(Exception):
    """An answer in the API's own error shape; ``retry_after`` (seconds) for a busy server."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after

    @classmethod
    def from_busy(cls, busy: Busy) -> CompatError:
        return cls(busy.status, busy.message, busy.retry_after)

    def answer(self, field: str) -> Response:
        """The error as ``{field: message}`` with its status (and Retry-After when set)."""
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return json_response({field: self.message}, self.status, headers)


def compat_routes(
    post: Post,
    model: str,
    keys: ClientKeys,
    max_texts: Callable[[], Awaitable[int]],
    limits: KeyLimits,
) -> list[BaseRoute]:
    """LibreTranslate's and DeepL's routes, translating with ``model`` (each key's requests in
    progress bounded by ``limits``), and the glossaries' (DeepL's and ours) in ``keys``'
    database."""
    glossaries = store_of(keys)

    async def translate(
        request: Request,
        key: ClientKey,
        texts: list[str],
        fields: dict[str, Any],
        over_quota: CompatError,
    ) -> list[dict[str, Any]]:
        if len(texts) > MAX_TEXTS:
            too_many = (
                f"{len(texts)} texts in one request; at most {MAX_TEXTS}: send them in several"
            )
            raise CompatError(413, too_many)
        fast = request.app.state.fast  # the translation memory isolated per key, or not
        isolated = fast is not None and fast.isolated
        refund = functools.partial(memory_refund, keys, key)
        try:
            with limits.hold(client_name(key)):
                characters = sum(len(text) for text in texts)
                if not keys.reserve(key, characters):
                    raise over_quota
                try:
                    size = await max_texts()
                    named = functools.partial(with_namespace, key=key, isolated=isolated)
                    return await _translate(post, model, texts, fields, size, named, refund)
                except (CompatError, Busy):
                    keys.refund(key, characters)
                    raise
        except Busy as busy:
            raise CompatError.from_busy(busy) from None

    async def libre_translate(request: Request) -> Response:
        try:
            params = await api_params(request)
            key = keys.find(_text_param(params, "api_key"))
            if key is None:
                raise CompatError(403, "Invalid API key")
            q = params.get("q")
            texts = _texts(q, "Invalid request: missing q parameter")
            fields = _libre_languages(params)
            format_ = _text_param(params, "format") or "text"
            if format_ not in ("text", "html"):
                raise CompatError(400, f"{format_} format is not supported")
            if format_ == "html":
                fields["preserve_format"] = "html"
            quota = CompatError(429, "Character limit of this API key reached")
            out = await translate(request, key, texts, fields, quota)
        except CompatError as error:
            return error.answer("error")
        translated = [item["text"] for item in out]
        reply: dict[str, Any] = {
            "translatedText": translated[0] if isinstance(q, str) else translated
        }
        if fields.get("source_lang") == "auto":
            found = [_libre_detected(item.get("detected")) for item in out]
            reply["detectedLanguage"] = found[0] if isinstance(q, str) else found
        return json_response(reply)

    async def libre_detect(request: Request) -> Response:
        try:
            params = await api_params(request)
            if keys.find(_text_param(params, "api_key")) is None:
                raise CompatError(403, "Invalid API key")
            q = _text_param(params, "q")
            if not q:
                raise CompatError(400, "Invalid request: missing q parameter")
        except CompatError as error:
            return error.answer("error")
        found = await anyio.to_thread.run_sync(detect, q)  # CPU work: off the event loop
        if found is None:
            return json_response([])
        return json_response(
            [{"confidence": round(found.confidence * 100, 1), "language": found.language}]
        )

    async def libre_languages(request: Request) -> Response:
        codes = [lang.code for lang in LANGUAGES.values()]
        return json_response(
            [
                {"code": lang.code, "name": lang.english, "targets": codes}
                for lang in LANGUAGES.values()
            ]
        )

    async def deepl_translate(request: Request) -> Response:
        try:
            key = await deepl_client_key(request, keys)
            params = await api_params(request)
            texts = _texts(params.get("text"), "Parameter 'text' not specified.")
            fields, source = deepl_fields(params, glossaries=True)
            fields = await with_glossary(fields, key.name, glossaries, texts)
            out = await translate(request, key, texts, fields, CompatError(456, "Quota Exceeded"))
        except CompatError as error:
            return error.answer("message")
        except GlossaryError as error:
            return json_response(error.deepl_body(), error.status)
        return json_response(
            {
                "translations": [
                    {
                        "detected_source_language": source or _deepl_detected(item.get("detected")),
                        "text": item["text"],
                        "billed_characters": item["billed"],
                    }
                    for item in out
                ]
            }
        )

    async def deepl_languages(request: Request) -> Response:
        try:
            await deepl_client_key(request, keys)
            kind = _text_param(await api_params(request), "type") or "source"
        except CompatError as error:
            return error.answer("message")
        if kind not in ("source", "target"):
            return json_response({"message": "Value for 'type' not supported."}, 400)
        return json_response(deepl_language_list(kind))

    async def deepl_usage(request: Request) -> Response:
        try:
            key = await deepl_client_key(request, keys)
        except CompatError as error:
            return error.answer("message")
        return json_response(
            {"character_count": keys.used(key), "character_limit": key.character_limit}
        )

    def deepl_route(action: Action) -> Callable[[Request], Awaitable[Response]]:
        """An endpoint of a glossary action, with DeepL's key, parameters and errors."""

        async def endpoint(request: Request) -> Response:
            try:
                key = await deepl_client_key(request, keys)
                return await action(request, await api_params(request), key.name)
            except CompatError as error:
                return error.answer("message")
            except GlossaryError as error:
                return json_response(error.deepl_body(), error.status)

        return endpoint

    return [
        *deepl_glossary_routes(glossaries, deepl_route),
        *api_glossary_routes(glossaries, keys),
        Route("/translate", libre_translate, methods=["POST"]),
        Route("/detect", libre_detect, methods=["POST"]),
        Route("/languages", libre_languages, methods=["GET"]),
        Route("/v2/translate", deepl_translate, methods=["POST"]),
        Route("/v2/languages", deepl_languages, methods=["GET", "POST"]),
        Route("/v2/usage", deepl_usage, methods=["GET", "POST"]),
    ]


async def deepl_client_key(request: Request, keys: ClientKeys) -> ClientKey:
    """The request's DeepL key (``Authorization: DeepL-Auth-Key ...`` or ``auth_key``);
    CompatError 403 when it is not one of ``keys``."""
    header = request.headers.get("Authorization", "")
    offered = (
        header.removeprefix("DeepL-Auth-Key ") if header.startswith("DeepL-Auth-Key ") else None
    )
    key = keys.find(offered or _text_param(await api_params(request), "auth_key"))
    if key is None:
        raise CompatError(403, "Authorization failure, check auth_key")
    return key


async def api_params(request: Request) -> dict[str, Any]:
    """The request's parameters (:func:`.bodies.fields`); CompatError 400 when unreadable."""
    try:
        return await fields(request)
    except BadBody as error:
        raise CompatError(400, str(error)) from None


def _texts(value: Any, missing: str) -> list[str]:
    """A string or a non-empty list of strings, as a list; CompatError(400, missing) else."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise CompatError(400, missing)
    return texts


def _text_param(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    return value if isinstance(value, str) else None


def _libre_languages(params: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, ours in (("source", "source_lang"), ("target", "target_lang")):
        code = _text_param(params, name)
        if code is None:
            raise CompatError(400, f"Invalid request: missing {name} parameter")
        if name == "source" and code == "auto":
            fields[ours] = "auto"
            continue
        language = lookup(LIBRE_ALIASES.get(code, code))
        if language is None:
            raise CompatError(400, f"{code} is not supported")
        fields[ours] = language.code
    return fields


def deepl_fields(
    params: dict[str, Any], glossaries: bool = False
) -> tuple[dict[str, Any], str | None]:
    """Our request fields for DeepL's parameters, and the source code DeepL would report.
    ``glossaries``: the caller resolves a ``glossary_id`` (kept in the fields for
    :func:`.glossaries.with_glossary`); refused otherwise."""
    refused = DEEPL_UNSUPPORTED if glossaries else ("glossary_id", *DEEPL_UNSUPPORTED)
    for name in refused:
        if name in params:
            raise CompatError(400, f"Parameter '{name}' is not supported by this server.")
    formality = _text_param(params, "formality") or "default"
    if formality not in ("default", "prefer_more", "prefer_less"):
        raise CompatError(400, "Value for 'formality' not supported.")
    target = _deepl_language(_text_param(params, "target_lang"), "target_lang")
    if target is None:
        raise CompatError(400, "Value for 'target_lang' not supported.")
    fields: dict[str, Any] = {"target_lang": target.code}
    source_code = _text_param(params, "source_lang")
    if source_code:
        source = _deepl_language(source_code, "source_lang")
        if source is None:
            raise CompatError(400, "Value for 'source_lang' not supported.")
        fields["source_lang"] = source.code
    else:
        fields["source_lang"] = "auto"
    tags = _text_param(params, "tag_handling")
    if tags is not None:
        if tags not in ("html", "xml"):
            raise CompatError(400, "Value for 'tag_handling' not supported.")
        fields["preserve_format"] = "html"
    context = _text_param(params, "context")
    if context:
        fields["context"] = context
    if "glossary_id" in params:
        fields["glossary_id"] = params["glossary_id"]
    return fields, source_code.upper() if source_code else None


def _libre_detected(detected: dict[str, Any] | None) -> dict[str, Any]:
    """LibreTranslate's ``detectedLanguage`` (confidence 0-100) from our ``detected``."""
    if not detected:
        return {"confidence": 0.0, "language": ""}
    return {"confidence": round(detected["confidence"] * 100, 1), "language": detected["language"]}


def _deepl_detected(detected: dict[str, Any] | None) -> str:
    """DeepL's ``detected_source_language`` from our ``detected``: a source is ZH whatever its
    script; empty when detection was unsure."""
    if not detected:
        return ""
    return "ZH" if detected["language"] == "zh-Hant" else str(detected["language"]).upper()


def _deepl_language(code: str | None, name: str) -> Language | None:
    if not code:
        raise CompatError(400, f"Parameter '{name}' not specified.")
    upper = code.upper()
    if upper in DEEPL_TARGETS:
        return LANGUAGES[DEEPL_TARGETS[upper][0]]
    return lookup(code)


async def _translate(
    post: Post,
    model: str,
    texts: Sequence[str],
    fields: dict[str, Any],
    max_texts: int,
    named: Callable[[dict[str, Any]], dict[str, Any]],
    refund: Callable[[Any], int],
) -> list[dict[str, Any]]:
    """Our API's translation items for ``texts`` (``text``, ``billed`` characters, and
    ``detected`` with ``auto``): one request of at most ``max_texts``, or bulk chunks of at most
    ``BULK_CHUNK`` (:mod:`.fairness`); each body as ``named`` makes it (the memory's namespace).
    Once every chunk answered 200, ``refund`` gives back what the memory served (not before: a
    failed chunk refunds the whole request)."""
    size = max_texts if len(texts) <= max_texts else min(max_texts, BULK_CHUNK)
    chunks = [list(texts[i : i + size]) for i in range(0, len(texts), size)]
    bodies = [named({**fields, "text": chunk, "stream": False}) for chunk in chunks]
    if "glossary" in fields:  # each chunk takes the terms that occur in its own texts
        pairs = pairs_of(fields["glossary"])
        for body in bodies:
            body["glossary"] = for_texts(pairs, body["text"])
    answers = await fan_out(post, model, bodies)
    for status, answer in answers:
        if status != 200:
            message = str(answer.get("error") or f"HTTP {status}")
            kind = answer.get("error_type", "")
            code = STATUS_BY_TYPE.get(kind, status if status < 500 else 500)
            raise CompatError(code, message, RETRY_AFTER_S if code == 503 else None)
    out: list[dict[str, Any]] = []
    for (_, answer), chunk in zip(answers, chunks, strict=True):
        refund(answer)
        # Which texts the memory served, where the reply tells: none, or the whole chunk.
        whole = memory_characters(answer) == sum(len(text) for text in chunk)
        out += [
            {**item, "billed": 0 if whole else len(text)}
            for item, text in zip(answer["translations"], chunk, strict=True)
        ]
    return out
