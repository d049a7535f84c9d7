"""Who may call the front end, and what a client key's call counts (docs/front-end.md).

Every route is one of three kinds, by its name:

- ``ALWAYS_OPEN``: the page, its files and the probes (a kubelet sends no key);
- ``OWN_KEYS``: APIs that check their own kind of client key whatever the address
  (LibreTranslate's ``api_key``, DeepL's ``DeepL-Auth-Key``, v2's and OpenAI's bearer key):
  the route itself calls :func:`bearer_key` or its API's equivalent;
- every other route (the page's ``/api/*``, the language and model lists): open on loopback;
  where keys are required (``require_keys``), :class:`KeyCheck` refuses it without an
  ``Authorization: Bearer <key>`` of the key file (401 ``NEEDS_KEY``) before the route runs,
  and the route reads the key with :func:`client_key`.

What a route does with a key (plain context managers: they never await, so they hold across
the awaits of the block and let go even when the request is cancelled):

- ``limits.hold(client_name(key))`` (:class:`.fairness.KeyLimits`): one request in progress of
  that key, 429 past ``--requests-per-key``; :func:`held` does nothing without a key;
- :func:`counted`: the characters counted against the key's limit (``QuotaReached`` past it),
  given back unless the block reports a 200; :func:`memory_refund` then gives back those the
  reply says its translation memory served (``usage.memory_characters``: no model work, not
  billed), and :func:`with_namespace` names the key to the memory (isolation per key).

A new route module names its routes, adds any own-key ones to ``OWN_KEYS``, and calls these.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from hymt_serve.request.memory_key import NAMESPACE_FIELD
from hymt_serve.web.fairness import KeyLimits
from hymt_serve.web.keys import ClientKey, ClientKeys, bearer
from hymt_serve.web.torchserve import json_response

# Open whoever asks: the page and its files, and the probes (a kubelet sends no key).
ALWAYS_OPEN = frozenset({"page", "favicon", "static", "live", "server_ready", "model_ready"})
# Routes that check their API's own client key whatever the address (LibreTranslate, DeepL, v2,
# OpenAI).
OWN_KEYS = frozenset(
    {
        "libre_translate",
        "libre_detect",
        "deepl_translate",
        "deepl_languages",
        "deepl_usage",
        "deepl_upload",
        "deepl_document_status",
        "deepl_document_result",
        "deepl_glossary_pairs",
        "deepl_glossaries",
        "deepl_glossary",
        "deepl_glossary_entries",
        "infer",
        "openai_models",
        "openai_model",
        "openai_chat",
        "openai_completions",
        "openai_unknown",
        "openai_file_upload",
        "openai_file_list",
        "openai_file",
        "openai_file_delete",
        "openai_file_content",
        "openai_batch_create",
        "openai_batch_list",
        "openai_batch",
        "openai_batch_cancel",
    }
)
QUOTA_REACHED = {
    "error": "the character limit of this key is reached",
    "error_type": "quota_exceeded",
}
NEEDS_KEY = {
    "error": "this server needs a client key: send 'Authorization: Bearer <key>' "
    "(a key of hymt web's key file)",
    "error_type": "unauthorized",
}
STATE_KEY = "client_key"  # where KeyCheck leaves the key it found, in the request's state


class QuotaReached(Exception):
    """The client key's character limit would be passed (429 ``quota_exceeded``)."""


class KeyCheck:
    """ASGI middleware: where ``keys`` are required, a request for any route but
    ``ALWAYS_OPEN`` and ``OWN_KEYS`` ones (unknown paths included) needs a bearer key of
    ``keys``: 401 without one, else the key goes to the request's state (:func:`client_key`).
    ``keys`` None: everything passes (loopback)."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute], keys: ClientKeys | None) -> None:
        self.app, self.routes, self.keys = app, routes, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys is not None:
            name = self._route_name(scope)
            if name not in ALWAYS_OPEN and name not in OWN_KEYS:
                key = self.keys.find(bearer(Headers(scope=scope).get("Authorization", "")))
                if key is None:
                    await json_response(NEEDS_KEY, 401)(scope, receive, send)
                    return
                scope.setdefault("state", {})[STATE_KEY] = key
        await self.app(scope, receive, send)

    def _route_name(self, scope: Scope) -> str | None:
        """The name of the route the router will pick for ``scope`` (None: no route)."""
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return getattr(route, "name", None)
        return None


def client_key(request: Request) -> ClientKey | None:
    """The bearer key :class:`KeyCheck` found for this request; None where keys are not
    required."""
    found: Any = request.scope.get("state", {}).get(STATE_KEY)
    return found if isinstance(found, ClientKey) else None


def bearer_key(request: Request, keys: ClientKeys) -> ClientKey | None:
    """The request's ``Authorization: Bearer <key>`` key if it is one of ``keys``."""
    return keys.find(bearer(request.headers.get("Authorization", "")))


def client_name(key: ClientKey) -> str:
    """The name ``KeyLimits`` counts ``key``'s requests under."""
    return f"key:{key.name}"


def held(limits: KeyLimits, key: ClientKey | None) -> AbstractContextManager[None]:
    """One request in progress for ``key`` (Busy 429 past its limit); nothing counted without
    a key (on loopback the front end cannot tell its clients apart)."""
    return limits.hold(client_name(key)) if key is not None else nullcontext()


def memory_characters(body: Any) -> int:
    """The characters a reply says its translation memory served (``usage.memory_characters``,
    0 when absent): they cost no model work and are not billed."""
    usage = body.get("usage") if isinstance(body, Mapping) else None
    found = usage.get("memory_characters") if isinstance(usage, Mapping) else None
    return found if isinstance(found, int) and not isinstance(found, bool) and found > 0 else 0


def memory_refund(keys: ClientKeys | None, key: ClientKey | None, body: Any) -> int:
    """Give ``key`` back the characters the reply ``body`` served from the translation memory
    (after a 200 whose characters were counted); returns them. Nothing without a key."""
    characters = memory_characters(body)
    if characters and keys is not None and key is not None:
        keys.refund(key, characters)
    return characters


def with_namespace(body: dict[str, Any], key: ClientKey | None, isolated: bool) -> dict[str, Any]:
    """A request API body as it goes to TorchServe. Where the translation memory is isolated
    per key (``isolated``: the handler says so), its ``cache_namespace`` is ``key``'s name (""
    without a key); elsewhere it has none. A client's own is always dropped: it would read
    another key's memory."""
    rest = {name: value for name, value in body.items() if name != NAMESPACE_FIELD}
    return {**rest, NAMESPACE_FIELD: key.name if key else ""} if isolated else rest


@contextmanager
def counted(keys: ClientKeys | None, key: ClientKey | None, characters: int) -> Iterator[list[int]]:
    """Count ``characters`` against ``key`` (QuotaReached past its limit); given back
    unless the block appends a 200 to the list it gets. Nothing counted without a key."""
    outcome: list[int] = []
    if key is None or keys is None:
        yield outcome
        return
    if not keys.reserve(key, characters):
        raise QuotaReached()
    try:
        yield outcome
    finally:
        if outcome != [200]:
            keys.refund(key, characters)
