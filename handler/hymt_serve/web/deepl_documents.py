"""DeepL's document API (v2) on the web front end: upload a file, poll its status, download the
translation; each file becomes a durable job (:mod:`.jobs_documents`: stored in the database,
resumed after a restart) of document requests of our API (:mod:`hymt_serve.request.
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
Jobs live in the database with their segments' progress: a restart of the front end or of
TorchServe resumes them (docs/jobs.md). Each client key
has at most ``PER_KEY_ACTIVE`` jobs queued or translating and ``PER_KEY_KEPT`` in all (finished
ones count until downloaded or ``KEEP_S`` after they end), and the front end ``MAX_JOBS``; past a
limit an upload gets 429 saying which. Characters count against the key's limit at upload (in
the transaction that stores the job) and are given back once if the translation fails.

The same module registers the batch API's routes (:mod:`.batch_routes`) on the same jobs.
"""

from __future__ import annotations

import asyncio
import base64
import unicodedata
from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.office import OFFICE_FORMATS, opening_text
from hymt_serve.web.batch_routes import batch_routes
from hymt_serve.web.bodies import is_json, json_object
from hymt_serve.web.compat import CompatError, api_params, deepl_client_key, deepl_fields
from hymt_serve.web.glossaries import store_of, with_glossary
from hymt_serve.web.glossary_entries import GlossaryError
from hymt_serve.web.jobs_documents import DocumentJobs
from hymt_serve.web.keys import ClientKeys
from hymt_serve.web.torchserve import json_response

__all__ = ["FORMATS", "MEDIA_TYPES", "DocumentJobs", "content_disposition", "document_routes"]

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


def document_routes(jobs: DocumentJobs, keys: ClientKeys) -> list[BaseRoute]:
    """DeepL's document routes, with the keys and parameters of ``/v2/translate``; and the
    batch API's (``/v1/files``, ``/v1/batches``: :mod:`.batch_routes`), on the same jobs."""

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
            params = {k: v for k, v in form.items() if isinstance(v, str)}
            fields, _ = deepl_fields(params, glossaries=True)
            fields.pop("preserve_format", None)  # a document keeps its format itself
            fields["format"] = kind
            # An Office file's text is not read here: every entry of its glossary goes.
            plain = [text] if kind not in OFFICE_FORMATS else None
            fields = await with_glossary(fields, key.name, store_of(keys), plain)
            document_id, document_key = await jobs.submit(key, filename, text, fields, characters)
        except CompatError as error:
            return error.answer("message")
        except GlossaryError as error:
            return json_response(error.deepl_body(), error.status)
        return json_response({"document_id": document_id, "document_key": document_key})

    async def deepl_document_status(request: Request) -> Response:
        document_id = request.path_params["document_id"]
        try:
            key = await deepl_client_key(request, keys)
            job = await jobs.find(document_id, await _document_key(request), key)
        except CompatError as error:
            return error.answer("message")
        answer: dict[str, Any] = {"document_id": document_id, "status": job.state}
        if job.state == "done":
            answer["billed_characters"] = job.billed
        if job.state == "error":
            answer["error_message"] = job.error
        return json_response(answer)

    async def deepl_document_result(request: Request) -> Response:
        try:
            key = await deepl_client_key(request, keys)
            document_id = request.path_params["document_id"]
            job = await jobs.find(document_id, await _document_key(request), key)
            content = await jobs.take(job)
        except CompatError as error:
            return error.answer("message")
        filename = job.filename or "document"
        return Response(
            content,
            media_type=MEDIA_TYPES[job.fields["format"]],
            headers={"Content-Disposition": content_disposition(filename)},
        )

    return [
        Route("/v2/document", deepl_upload, methods=["POST"]),
        Route("/v2/document/{document_id}", deepl_document_status, methods=["POST"]),
        Route("/v2/document/{document_id}/result", deepl_document_result, methods=["POST"]),
        *batch_routes(jobs.batches, keys),
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
