"""The front end's fast path through the translation memory (docs/translation-memory.md).

A plain sentence request to ``/api/translate`` (texts, languages, ``max_new_tokens``: nothing
else, source not ``auto``) whose every text the memory holds is answered here, without
TorchServe: the reply the handler would give (its renderer), with ``usage.memory_segments`` and
``usage.memory_characters`` (no model work, nothing billed). Any miss, and any request of
another shape, takes the normal path, where the worker looks its rows up itself.

What this needs of the worker it reads from the handler's describe output (settings, family,
the memory's model identity and database), again every :data:`REFRESH_S`: it parses the body
with the handler's own parser and computes the same :func:`~hymt_serve.request.memory_key.
plain_key` the worker stored. It only answers when the worker's memory is on and in this front
end's database, and only with the entries of the model TorchServe's worker last announced for
this model name (the marker the worker writes at start, read with every lookup): a model that
changed is never answered for from the old one's entries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import anyio.to_thread
from starlette.responses import JSONResponse, Response

from hymt_serve.core.config import Quantization
from hymt_serve.core.settings import SAMPLING_KEYS, Settings, without_password
from hymt_serve.core.types import FinishReason, GenerationResult
from hymt_serve.request.families import PROFILES, Profile
from hymt_serve.request.language_retry import TargetLanguage
from hymt_serve.request.memory import Found, TranslationMemory, connect
from hymt_serve.request.memory_key import CACHE_FIELD, is_plain, marker_key, plain_key
from hymt_serve.request.memory_rows import with_usage
from hymt_serve.request.protocol import TranslationRequest, parse_request
from hymt_serve.request.replies import render_response
from hymt_serve.web.keys import ClientKey
from hymt_serve.web.torchserve import NDJSON, TorchServe

logger = logging.getLogger(__name__)
REFRESH_S = 30.0  # the handler's description is read again this often (and when stale)
PLAIN_FIELDS = frozenset(
    {"text", "source_lang", "src_lang", "target_lang", "tgt_lang", "max_new_tokens", "stream"}
)


@dataclass(frozen=True)
class View:
    """What the fast path knows of the worker: its settings and family, its memory's model
    identity, whether the memory is per key, and whether its language check is on."""

    settings: Settings
    profile: Profile
    model: str
    isolated: bool
    checked: bool


class FastPath:
    """Answers plain requests to ``model`` from the memory in the database at ``url`` (the
    front end's own). :meth:`answer` returns None where the normal path must answer."""

    def __init__(self, torchserve: TorchServe, model: str, url: str) -> None:
        self.torchserve, self.model, self.url = torchserve, model, url
        self.marker = marker_key(model)
        self.view: View | None = None
        self.memory: TranslationMemory | None = None
        self.answered = self.passed = 0  # requests answered here, and passed on
        self._read_at = -REFRESH_S
        self._reading: asyncio.Task[None] | None = None

    async def answer(self, body: dict[str, Any], key: ClientKey | None) -> Response | None:
        """The reply to ``body`` from the memory, or None (any miss, any other request)."""
        self._refresh_when_due()
        if not _plain_body(body):
            return None
        view, memory = self.view, self.memory
        if view is None or memory is None:
            return None
        try:
            request = parse_request(body, view.settings, view.profile)
        except Exception:  # the normal path answers with the handler's own error
            return None
        if not is_plain(request):
            return None
        namespace = key.name if key is not None and view.isolated else ""
        keys = [
            plain_key(view.model, namespace, view.profile.name, request, index)
            for index in range(len(request.texts))
        ]
        current, found = await anyio.to_thread.run_sync(self._lookup, memory, keys)
        if current != view.model:  # the worker loaded another model: read it again
            self._read_at = -REFRESH_S
        if current != view.model or len(found) != len(set(keys)):
            self.passed += 1
            return None
        rows = [found[k] for k in keys]
        if view.checked and any(row.target_language is None for row in rows):
            self.passed += 1
            return None  # kept unchecked: the worker's check judges it
        self.answered += 1
        return _reply(request, rows, view.checked)

    def _lookup(self, memory: TranslationMemory, keys: list[str]) -> tuple[str | None, Any]:
        return memory.current(self.marker), memory.recall_plain(keys)

    def _refresh_when_due(self) -> None:
        due = time.monotonic() - self._read_at >= REFRESH_S
        if due and (self._reading is None or self._reading.done()):
            self._read_at = time.monotonic()
            self._reading = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        """The worker's description read again; the fast path off while it says no memory
        (or another database)."""
        described = await self.torchserve.handler_description(self.model)
        view = _view(described, self.url)
        if view is not None and self.memory is None:
            self.memory = await anyio.to_thread.run_sync(_open, self.url, view.model)
        if view is not None and self.memory is not None:
            self.memory.model = view.model
        self.view = view

    @property
    def isolated(self) -> bool:
        """Whether the worker's memory is isolated per key, as last described (False until
        read: the worker then skips the memory for a request that names no namespace)."""
        self._refresh_when_due()
        return self.view is not None and self.view.isolated

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
        if self.memory is not None:
            await anyio.to_thread.run_sync(self.memory.close)


def _open(url: str, model: str) -> TranslationMemory:
    return TranslationMemory(connect(url), model, max_rows=0, url=url)


def _plain_body(body: dict[str, Any]) -> bool:
    """Cheap first look: only the fields of a plain request, a text, a named source."""
    fields = body.keys() - {CACHE_FIELD}
    if body.get(CACHE_FIELD) is False or not fields <= PLAIN_FIELDS or "text" not in fields:
        return False
    source = body.get("source_lang", body.get("src_lang"))
    return not (isinstance(source, str) and source.strip().lower() == "auto")


def _view(described: dict[str, Any], url: str) -> View | None:
    """The fast path's view of the worker's description; None when its memory is off, in
    another database, or the description cannot be read."""
    memory, family = described.get("memory"), described.get("model_family")
    public = described.get("settings")
    if not (isinstance(memory, dict) and memory.get("enabled") is True):
        return None
    if memory.get("database") != without_password(url):
        return None
    try:
        profile = PROFILES[family["prompt_family"]]  # type: ignore[index]
        settings = _settings(public)
    except Exception as error:  # another version's description: the normal path only
        logger.info("translation memory fast path off: %s", type(error).__name__)
        return None
    checked = settings.checks.target_language_check != "off"
    return View(settings, profile, str(memory["model"]), bool(memory.get("isolation")), checked)


def _settings(public: Any) -> Settings:
    """The worker's settings from their describe view (``Settings.public``)."""
    flat = {k: v for k, v in dict(public).items() if k != "sampling"}
    flat.update({k: v for k, v in dict(public["sampling"]).items() if k in SAMPLING_KEYS})
    if flat.get("quantization") == Quantization.GPTQ_INT4.value:  # a checkpoint's, not a setting
        flat["quantization"] = Quantization.NONE.value
    return Settings.from_mapping(flat, environ={})


def _reply(request: TranslationRequest, rows: list[Found], checked: bool) -> Response:
    """The handler's reply for ``request`` from the memory's ``rows`` (one per text)."""
    results = [
        GenerationResult(row.text, row.token_ids, cast(FinishReason, row.finish_reason))
        for row in rows
    ]
    verdicts: tuple[TargetLanguage, ...] | None = None
    if checked:
        verdicts = tuple("mismatch" if r.target_language == "mismatch" else "ok" for r in rows)
    request_id = str(uuid.uuid4())
    body = render_response(
        request,
        results,
        [row.prompt_tokens for row in rows],
        [row.template for row in rows],
        [None] * len(rows),
        request_id,
        None,
        verdicts,
    )
    characters = sum(len(text) for text in request.texts)
    body = with_usage(body, (len(rows), characters))
    if not request.stream:
        return JSONResponse(body)
    delta = json.dumps({"delta": body["translation"], "request_id": request_id}, ensure_ascii=False)
    content = delta + "\n" + json.dumps(body, ensure_ascii=False) + "\n"
    return Response(content, media_type=NDJSON)
