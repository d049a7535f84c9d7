"""DeepL's document API (v2) on the web front end: upload a file, poll its status, download the
translation; each file becomes one document request of our API (:mod:`hymt_serve.request.
documents`), run on a small pool of threads.

- ``POST /v2/document`` (multipart: ``file``, ``target_lang``, ``source_lang``, ``filename``)
  -> ``{"document_id", "document_key"}``; files ``.txt``, ``.md``, ``.html``/``.htm`` and
  ``.srt`` in UTF-8;
- ``POST /v2/document/<id>`` (``document_key``) -> ``{"document_id", "status": "queued" |
  "translating" | "done" | "error", "billed_characters", "error_message"}``;
- ``POST /v2/document/<id>/result`` (``document_key``) -> the translated file, once (the job is
  forgotten after its download, as DeepL does); 503 while it is not done.

Jobs live in this process's memory (at most ``MAX_JOBS``, each kept ``KEEP_S`` seconds after it
ends): a restart of the front end forgets them. Characters count against the key's limit at
upload and are given back if the translation fails.
"""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from flask import Flask, Response, jsonify, request

from hymt_serve.web.compat import CompatError, deepl_client_key, deepl_fields
from hymt_serve.web.keys import ClientKey, ClientKeys
from hymt_serve.web.refine import Post

FORMATS = {".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html"}
FORMATS |= {".htm": "html", ".srt": "srt"}
MEDIA_TYPES = {"text": "text/plain", "markdown": "text/markdown", "html": "text/html"}
MEDIA_TYPES |= {"srt": "application/x-subrip"}
MAX_FILE_BYTES = 4 * 1_048_576  # the handler refuses more than its max_document_bytes anyway
MAX_JOBS = 256
KEEP_S = 3600.0
WORKERS = 4


@dataclass
class _Job:
    key: str  # the document_key
    owner: str  # the client key's value
    filename: str
    characters: int
    status: str = "queued"
    result: bytes = b""
    error: str | None = None
    ended: float | None = None


class DocumentJobs:
    """The uploaded documents and their translations, by document id."""

    def __init__(self, post: Post, model: str, keys: ClientKeys) -> None:
        self._post, self._model, self._keys = post, model, keys
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="hymt-deepl-document")

    def submit(
        self, key: ClientKey, filename: str, text: str, fields: dict[str, Any]
    ) -> tuple[str, str]:
        """Queue ``text`` (the file's content) for translation: (document id, document key).
        Raises CompatError (quota, too many jobs)."""
        kind = FORMATS[PurePath(filename).suffix.lower()]
        with self._lock:
            self._forget_old()
            if len(self._jobs) >= MAX_JOBS:
                raise CompatError(429, "Too many documents in progress, try again later.")
            if not self._keys.reserve(key, len(text)):
                raise CompatError(456, "Quota for this billing period has been exceeded.")
            document_id = secrets.token_hex(16)
            job = _Job(secrets.token_urlsafe(32), key.key, filename, len(text))
            self._jobs[document_id] = job
        body = {**fields, "document": text, "format": kind, "stream": False}
        self._pool.submit(self._run, job, body, key)
        return document_id, job.key

    def _run(self, job: _Job, body: dict[str, Any], key: ClientKey) -> None:
        """Translate on a pool thread; the status is set last, after what it announces."""
        job.status = "translating"
        try:
            status, answer = self._post(self._model, body)
        except Exception as error:  # a job must end, whatever happened
            status, answer = 500, {"error": f"the translation failed ({type(error).__name__})"}
        job.ended = time.monotonic()
        if status == 200 and isinstance(answer.get("document"), str):
            job.result = answer["document"].encode("utf-8")
            job.status = "done"
        else:
            job.error = str(answer.get("error") or f"HTTP {status}")
            self._keys.refund(key, job.characters)
            job.status = "error"

    def find(self, document_id: str, document_key: str | None) -> _Job:
        """The job, or DocumentError 404 (unknown id, or the wrong key for it)."""
        with self._lock:
            job = self._jobs.get(document_id)
        if job is None or not document_key or not secrets.compare_digest(job.key, document_key):
            raise CompatError(404, "Document not found")
        return job

    def take(self, document_id: str, job: _Job) -> bytes:
        """A done job's translation, forgotten afterwards; DocumentError 503 before."""
        if job.status != "done":
            raise CompatError(503, "Document translation is not done yet.")
        with self._lock:
            self._jobs.pop(document_id, None)
        return job.result

    def _forget_old(self) -> None:
        now = time.monotonic()
        for document_id, job in list(self._jobs.items()):
            if job.ended is not None and now - job.ended > KEEP_S:
                del self._jobs[document_id]


def add_document_routes(app: Flask, jobs: DocumentJobs, keys: ClientKeys) -> None:
    """DeepL's document routes on ``app``, with the keys and parameters of ``/v2/translate``."""

    @app.post("/v2/document")
    def deepl_upload() -> Any:
        try:
            key = deepl_client_key(keys)
            upload = request.files.get("file")
            if upload is None:
                raise CompatError(400, "Parameter 'file' not specified.")
            filename = request.form.get("filename") or upload.filename or ""
            if PurePath(filename).suffix.lower() not in FORMATS:
                raise CompatError(400, "Invalid file data or unsupported file type.")
            data = upload.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise CompatError(413, "Document too large.")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise CompatError(400, "The document is not UTF-8 text.") from None
            fields, _ = deepl_fields(request.form.to_dict())
            fields.pop("preserve_format", None)  # a document keeps its format itself
            document_id, document_key = jobs.submit(key, filename, text, fields)
        except CompatError as error:
            return jsonify(message=error.message), error.status
        return jsonify(document_id=document_id, document_key=document_key)

    @app.post("/v2/document/<document_id>")
    def deepl_document_status(document_id: str) -> Any:
        try:
            deepl_client_key(keys)
            job = jobs.find(document_id, _document_key())
        except CompatError as error:
            return jsonify(message=error.message), error.status
        answer: dict[str, Any] = {"document_id": document_id, "status": job.status}
        if job.status == "done":
            answer["billed_characters"] = job.characters
        if job.status == "error":
            answer["error_message"] = job.error
        return jsonify(answer)

    @app.post("/v2/document/<document_id>/result")
    def deepl_document_result(document_id: str) -> Any:
        try:
            deepl_client_key(keys)
            job = jobs.find(document_id, _document_key())
            content = jobs.take(document_id, job)
        except CompatError as error:
            return jsonify(message=error.message), error.status
        kind = FORMATS[PurePath(job.filename).suffix.lower()]
        return Response(
            content,
            mimetype=MEDIA_TYPES[kind],
            headers={"Content-Disposition": f'attachment; filename="{_safe(job.filename)}"'},
        )


def _document_key() -> str | None:
    body = request.get_json(silent=True) if request.is_json else None
    if isinstance(body, dict):
        value = body.get("document_key")
        return value if isinstance(value, str) else None
    return request.form.get("document_key")


def _safe(filename: str) -> str:
    """A file name fit for a header: its last part, no quotes or line breaks."""
    name = PurePath(filename).name
    return "".join(c for c in name if c.isprintable() and c not in '"\\') or "document"
