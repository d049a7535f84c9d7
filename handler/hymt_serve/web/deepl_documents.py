"""DeepL's document API (v2) on the web front end: upload a file, poll its status, download the
translation; each file becomes one document request of our API (:mod:`hymt_serve.request.
documents`), run as a task on the event loop, ``WORKERS`` at a time.

- ``POST /v2/document`` (multipart: ``file``, ``target_lang``, ``source_lang``, ``filename``)
  -> ``{"document_id", "document_key"}``; files ``.txt``, ``.md``, ``.html``/``.htm``,
  ``.srt``, ``.xlf``/``.xliff`` (XLIFF 1.2 and 2.x; DeepL reads 2.1 only) and ``.po`` (gettext;
  not one of DeepL's) in UTF-8, and ``.docx``, ``.pptx``, ``.xlsx`` (sent on in base64; the
  characters a reader sees are billed); a file malformed for its format fails in its status,
  as DeepL's do;
- ``POST /v2/document/<id>`` (``document_key``) -> ``{"document_id", "status": "queued" |
  "translating" | "done" | "error", "billed_characters", "error_message"}``;
- ``POST /v2/document/<id>/result`` (``document_key``) -> the translated file, its name in
  ``Content-Disposition`` (RFC 6266: an ASCII ``filename`` and the exact UTF-8 ``filename*``);
  503 while it is not done. The job is forgotten ``DOWNLOADED_KEEP_S`` after its first download
  (DeepL forgets it at once; a download that broke off can be tried again here).

A document id and its key work only with the client key that uploaded it (404 otherwise).
Jobs live in this process's memory: a restart of the front end forgets them. Each client key
has at most ``PER_KEY_ACTIVE`` jobs queued or translating and ``PER_KEY_KEPT`` in all (finished
ones count until downloaded or ``KEEP_S`` after they end), and the front end ``MAX_JOBS``; past a
limit an upload gets 429 saying which. Characters count against the key's limit at upload and
are given back if the translation fails.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
import unicodedata
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.office import OFFICE_FORMATS, opening_text
from hymt_serve.web.bodies import is_json, json_object
from hymt_serve.web.compat import CompatError, api_params, deepl_client_key, deepl_fields
from hymt_serve.web.fairness import Busy, Post
from hymt_serve.web.keys import ClientKey, ClientKeys
from hymt_serve.web.torchserve import json_response

FORMATS = {".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html"}
FORMATS |= {".htm": "html", ".srt": "srt", ".xlf": "xliff", ".xliff": "xliff", ".po": "po"}
MEDIA_TYPES = {"text": "text/plain", "markdown": "text/markdown", "html": "text/html"}
# XLIFF's registered type (XLIFF 2.0, appendix on media type), PO's in shared-mime-info.
MEDIA_TYPES |= {"srt": "application/x-subrip", "xliff": "application/xliff+xml"}
MEDIA_TYPES |= {"po": "text/x-gettext-translation"}
# Office files travel in base64 inside the JSON request (docs/documents.md), under their own
# registered types.
FORMATS |= {".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx"}
_OOXML = "application/vnd.openxmlformats-officedocument."
MEDIA_TYPES |= {"docx": _OOXML + "wordprocessingml.document"}
MEDIA_TYPES |= {"pptx": _OOXML + "presentationml.presentation"}
MEDIA_TYPES |= {"xlsx": _OOXML + "spreadsheetml.sheet"}
MAX_FILE_BYTES = 4 * 1_048_576  # the handler refuses more than its max_document_bytes anyway
MAX_JOBS = 256  # each holds up to MAX_FILE_BYTES twice (the file and its translation)
PER_KEY_ACTIVE = 8
PER_KEY_KEPT = 32
KEEP_S = 3600.0
DOWNLOADED_KEEP_S = 300.0
WORKERS = 4


@dataclass
class _Job:
    key: str  # the document_key
    owner: str  # the client key's name
    filename: str
    characters: int
    status: str = "queued"
    result: bytes = b""
    error: str | None = None
    ended: float | None = None
    downloaded: float | None = None

    def expired(self, now: float) -> bool:
        if self.downloaded is not None:
            return now - self.downloaded > DOWNLOADED_KEEP_S
        return self.ended is not None and now - self.ended > KEEP_S


class DocumentJobs:
    """The uploaded documents and their translations, by document id (used on the event loop
    only: no lock)."""

    def __init__(self, post: Post, model: str, keys: ClientKeys) -> None:
        self._post, self._model, self._keys = post, model, keys
        self._jobs: dict[str, _Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # kept: the loop holds tasks weakly
        self._turns: asyncio.Semaphore | None = None  # WORKERS translating at once

    async def open(self) -> None:
        """Called once the event loop serves, before the first request (the app's lifespan)."""

    async def close(self) -> None:
        """Cancel the translations in progress (the front end stops: jobs live in memory)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def submit(
        self,
        key: ClientKey,
        filename: str,
        text: str,
        fields: dict[str, Any],
        characters: int | None = None,
    ) -> tuple[str, str]:
        """Queue ``text`` (the file's content; an Office file's in base64) for translation:
        (document id, document key); ``characters`` billed (the text's length if not given).
        Raises CompatError (quota, too many jobs)."""
        kind = FORMATS[PurePath(filename).suffix.lower()]
        characters = len(text) if characters is None else characters
        self._forget_old()
        self._check_room(key)
        if not self._keys.reserve(key, characters):
            raise CompatError(456, "Quota for this billing period has been exceeded.")
        document_id = secrets.token_hex(16)
        job = _Job(secrets.token_urlsafe(32), key.name, filename, characters)
        self._jobs[document_id] = job
        body = {**fields, "document": text, "format": kind, "stream": False}
        task = asyncio.get_running_loop().create_task(self._run(job, body, key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return document_id, job.key

    def _check_room(self, key: ClientKey) -> None:
        """CompatError 429 when ``key`` (or the front end) has no room for one more job."""
        mine = [job for job in self._jobs.values() if job.owner == key.name]
        active = sum(job.ended is None for job in mine)
        if active >= PER_KEY_ACTIVE:
            raise CompatError(
                429,
                f"This key has {active} documents in translation (at most {PER_KEY_ACTIVE}): "
                "wait for one to finish.",
            )
        if len(mine) >= PER_KEY_KEPT:
            raise CompatError(
                429,
                f"This key has {len(mine)} documents on the server (at most {PER_KEY_KEPT}): "
                "download the finished ones first.",
            )
        if len(self._jobs) >= MAX_JOBS:
            raise CompatError(429, "Too many documents in progress, try again later.")

    async def _run(self, job: _Job, body: dict[str, Any], key: ClientKey) -> None:
        """Translate, once a turn comes; the status is set last, after what it announces."""
        if self._turns is None:
            self._turns = asyncio.Semaphore(WORKERS)
        async with self._turns:
            await self._translate(job, body, key)

    async def _translate(self, job: _Job, body: dict[str, Any], key: ClientKey) -> None:
        job.status = "translating"
        try:
            status, answer = await self._post(self._model, body, bulk=True)  # bulk work
        except Busy as busy:
            status, answer = busy.status, busy.body()
        except Exception as error:  # a job must end, whatever happened
            status, answer = 500, {"error": f"the translation failed ({type(error).__name__})"}
        job.ended = time.monotonic()
        if status == 200 and isinstance(answer.get("document"), str):
            office = body["format"] in OFFICE_FORMATS
            document = answer["document"]
            job.result = base64.b64decode(document) if office else document.encode("utf-8")
            job.status = "done"
        else:
            job.error = str(answer.get("error") or f"HTTP {status}")
            self._keys.refund(key, job.characters)
            job.status = "error"

    def find(self, document_id: str, document_key: str | None, key: ClientKey) -> _Job:
        """The job, or CompatError 404 (unknown id, the wrong document key, or a job that
        another client key uploaded)."""
        job = self._jobs.get(document_id)
        if (
            job is None
            or not document_key
            or not secrets.compare_digest(job.key, document_key)
            or job.owner != key.name  # a name, not a secret (and may be any text)
        ):
            raise CompatError(404, "Document not found")
        return job

    def take(self, job: _Job) -> bytes:
        """A done job's translation (kept ``DOWNLOADED_KEEP_S`` more, for a retry);
        CompatError 503 before it is done."""
        if job.status != "done":
            raise CompatError(503, "Document translation is not done yet.")
        if job.downloaded is None:
            job.downloaded = time.monotonic()
        return job.result

    def _forget_old(self) -> None:
        now = time.monotonic()
        for document_id, job in list(self._jobs.items()):
            if job.expired(now):
                del self._jobs[document_id]


def document_routes(jobs: DocumentJobs, keys: ClientKeys) -> list[BaseRoute]:
    """DeepL's document routes, with the keys and parameters of ``/v2/translate``."""

    async def deepl_upload(request: Request) -> Response:
        try:
            key = await deepl_client_key(request, keys)
            form = await api_params(request)
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise CompatError(400, "Parameter 'file' not specified.")
            filename = _text(form.get("filename")) or upload.filename or ""
            if PurePath(filename).suffix.lower() not in FORMATS:
                raise CompatError(400, "Invalid file data or unsupported file type.")
            data = await upload.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise CompatError(413, "Document too large.")
            kind = FORMATS[PurePath(filename).suffix.lower()]
            characters = None
            if kind in OFFICE_FORMATS:
                text = base64.b64encode(data).decode("ascii")
                characters = await asyncio.to_thread(_office_characters, text, kind)
            else:
                text = _utf8(data)
            fields, _ = deepl_fields({k: v for k, v in form.items() if isinstance(v, str)})
            fields.pop("preserve_format", None)  # a document keeps its format itself
            document_id, document_key = jobs.submit(key, filename, text, fields, characters)
        except CompatError as error:
            return error.answer("message")
        return json_response({"document_id": document_id, "document_key": document_key})

    async def deepl_document_status(request: Request) -> Response:
        document_id = request.path_params["document_id"]
        try:
            key = await deepl_client_key(request, keys)
            job = jobs.find(document_id, await _document_key(request), key)
        except CompatError as error:
            return error.answer("message")
        answer: dict[str, Any] = {"document_id": document_id, "status": job.status}
        if job.status == "done":
            answer["billed_characters"] = job.characters
        if job.status == "error":
            answer["error_message"] = job.error
        return json_response(answer)

    async def deepl_document_result(request: Request) -> Response:
        try:
            key = await deepl_client_key(request, keys)
            job = jobs.find(request.path_params["document_id"], await _document_key(request), key)
            content = jobs.take(job)
        except CompatError as error:
            return error.answer("message")
        kind = FORMATS[PurePath(job.filename).suffix.lower()]
        return Response(
            content,
            media_type=MEDIA_TYPES[kind],
            headers={"Content-Disposition": content_disposition(job.filename)},
        )

    return [
        Route("/v2/document", deepl_upload, methods=["POST"]),
        Route("/v2/document/{document_id}", deepl_document_status, methods=["POST"]),
        Route("/v2/document/{document_id}/result", deepl_document_result, methods=["POST"]),
    ]


async def _document_key(request: Request) -> str | None:
    if is_json(request):
        body = await json_object(request)
        return _text(body.get("document_key")) if body is not None else None
    return _text((await api_params(request)).get("document_key"))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CompatError(400, "The document is not UTF-8 text.") from None


def _office_characters(text: str, kind: str) -> int:
    """The characters a reader sees in an Office file (what is billed); a file that cannot be
    read counts its size, and fails in its status as DeepL's do."""
    try:
        return len(opening_text(text, kind, MAX_FILE_BYTES))
    except InvalidRequest:
        return len(text) * 3 // 4


def content_disposition(filename: str) -> str:
    """``attachment`` with the file's name (its last part) as RFC 6266 gives it: ``filename``
    in plain ASCII for old clients, ``filename*`` (RFC 5987) with every character."""
    name = "".join(c for c in PurePath(filename).name if c.isprintable()) or "document"
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    fallback = "".join(c if c not in '"\\' else "_" for c in ascii_name).strip() or "document"
    if fallback.startswith("."):  # nothing left of the name but its suffix
        fallback = "document" + fallback
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
