"""OpenAI's Files and Batch routes on the web front end (docs/jobs.md), what the official
SDK's ``client.files`` and ``client.batches`` call:

- ``POST /v1/files`` (multipart ``file``, ``purpose`` "batch"), ``GET /v1/files``,
  ``GET /v1/files/<id>``, ``GET /v1/files/<id>/content``, ``DELETE /v1/files/<id>``;
- ``POST /v1/batches`` (``input_file_id``, ``endpoint`` ``/v1/chat/completions`` or
  ``/v1/completions``, ``completion_window`` "24h", ``metadata``), ``GET /v1/batches``
  (``after``, ``limit``), ``GET /v1/batches/<id>``, ``POST /v1/batches/<id>/cancel``.

Keys as on the other ``/v1`` routes (``Authorization: Bearer``); a file or batch is seen only
by the key that made it (404 otherwise). Errors are OpenAI's ``{"error": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from hymt_serve.request import openai_api
from hymt_serve.request.openai_api import OpenAIError
from hymt_serve.web.access import bearer_key
from hymt_serve.web.batches import ENDPOINTS, Batches, parse_lines
from hymt_serve.web.job_store import BATCH, Job, StoredFile
from hymt_serve.web.keys import ClientKey, ClientKeys
from hymt_serve.web.torchserve import json_response

MAX_FILE_BYTES = 200 * 1_048_576  # OpenAI's limit for a batch's input file
WINDOWS = ("24h",)
STATES = {"in_progress": "in_progress", "cancelling": "cancelling"}  # the rest are as stored
TIMES = {"completed": "completed_at", "failed": "failed_at", "cancelled": "cancelled_at"}


def batch_routes(batches: Batches, keys: ClientKeys) -> list[BaseRoute]:
    """The files and batches routes on ``batches``, for the keys of ``keys``."""
    store = batches.store

    async def upload(request: Request) -> Response:
        key = _key(request, keys)
        form = await request.form(max_files=1, max_fields=8)
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch":
            raise OpenAIError(400, "purpose must be 'batch'", param="purpose")
        if not isinstance(upload, UploadFile):
            raise OpenAIError(400, "send the file in the multipart field 'file'", param="file")
        content = await upload.read(MAX_FILE_BYTES + 1)
        if len(content) > MAX_FILE_BYTES:
            raise OpenAIError(413, f"the file is over {MAX_FILE_BYTES} bytes", param="file")
        name = upload.filename or "batch.jsonl"
        file = StoredFile(
            f"file-{secrets.token_hex(12)}", key.name, "batch", name, len(content), time.time()
        )
        await asyncio.to_thread(store.add_file, file, content)
        return json_response(_file(file))

    async def file_list(request: Request) -> Response:
        key = _key(request, keys)
        purpose = request.query_params.get("purpose")
        found = await asyncio.to_thread(store.files, key.name, purpose)
        data = [_file(file) for file in found]
        return json_response({"object": "list", "data": data, "has_more": False})

    async def file_get(request: Request) -> Response:
        return json_response(_file(await _owned_file(request)))

    async def file_content(request: Request) -> Response:
        file = await _owned_file(request)
        content = await asyncio.to_thread(store.file_content, file.id)
        return Response(content, media_type="application/jsonl")

    async def file_delete(request: Request) -> Response:
        file = await _owned_file(request)
        await asyncio.to_thread(store.delete_file, file.id)
        return json_response({"id": file.id, "object": "file", "deleted": True})

    async def _owned_file(request: Request) -> StoredFile:
        key = _key(request, keys)
        file = await asyncio.to_thread(store.file, request.path_params["file_id"])
        if file is None or file.owner != key.name:
            raise OpenAIError(404, "No such File object", param="file_id", code="not_found")
        return file

    async def create(request: Request) -> Response:
        key = _key(request, keys)
        body = _json(await request.body())
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        if endpoint not in ENDPOINTS:
            raise OpenAIError(400, f"endpoint must be one of {list(ENDPOINTS)}", param="endpoint")
        if window not in WINDOWS:
            raise OpenAIError(400, "completion_window must be '24h'", param="completion_window")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise OpenAIError(400, "metadata must be an object", param="metadata")
        file_id = body.get("input_file_id")
        file = await asyncio.to_thread(store.file, file_id) if isinstance(file_id, str) else None
        if file is None or file.owner != key.name or file.purpose != "batch":
            raise OpenAIError(404, "No such File object", param="input_file_id")
        content = await asyncio.to_thread(store.file_content, file.id)
        lines = await asyncio.to_thread(parse_lines, content, endpoint, (batches.model,))
        characters = sum(line.characters for line in lines)
        if keys.used(key) + characters > key.character_limit:
            raise openai_api.quota_exceeded(
                f"the batch's {characters} characters are past this key's limit"
            )
        fields = {"endpoint": endpoint, "completion_window": window, "input_file_id": file.id}
        job = await batches.create(key.name, fields | {"metadata": metadata}, lines)
        return json_response(await _batch(job))

    async def listing(request: Request) -> Response:
        key = _key(request, keys)
        limit = _limit(request.query_params.get("limit", "20"))
        after = request.query_params.get("after")
        found = await asyncio.to_thread(
            store.listing, key.name, BATCH, after=after, limit=limit + 1
        )
        data = [await _batch(job) for job in found[:limit]]
        return json_response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(found) > limit,
            }
        )

    async def retrieve(request: Request) -> Response:
        return json_response(await _batch(await _owned_batch(request)))

    async def cancel(request: Request) -> Response:
        job = await _owned_batch(request)
        if job.ended:
            raise OpenAIError(409, f"Cannot cancel a batch with status '{job.state}'.")
        return json_response(await _batch(await batches.cancel(job)))

    async def _owned_batch(request: Request) -> Job:
        key = _key(request, keys)
        job = await asyncio.to_thread(store.get, request.path_params["batch_id"])
        if job is None or job.kind != BATCH or job.owner != key.name:
            raise OpenAIError(404, "No such Batch object", param="batch_id", code="not_found")
        return job

    async def _batch(job: Job) -> dict[str, Any]:
        done, failed = await asyncio.to_thread(store.item_count, job.id)
        return batch_object(job, done, failed)

    def answered(route: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                return await route(request)  # type: ignore[no-any-return]
            except OpenAIError as error:
                return json_response(error.body(), error.status)

        return endpoint

    return [
        Route("/v1/files", answered(upload), methods=["POST"], name="openai_file_upload"),
        Route("/v1/files", answered(file_list), methods=["GET"], name="openai_file_list"),
        Route("/v1/files/{file_id}", answered(file_get), methods=["GET"], name="openai_file"),
        Route(
            "/v1/files/{file_id}",
            answered(file_delete),
            methods=["DELETE"],
            name="openai_file_delete",
        ),
        Route(
            "/v1/files/{file_id}/content",
            answered(file_content),
            methods=["GET"],
            name="openai_file_content",
        ),
        Route("/v1/batches", answered(create), methods=["POST"], name="openai_batch_create"),
        Route("/v1/batches", answered(listing), methods=["GET"], name="openai_batch_list"),
        Route("/v1/batches/{batch_id}", answered(retrieve), methods=["GET"], name="openai_batch"),
        Route(
            "/v1/batches/{batch_id}/cancel",
            answered(cancel),
            methods=["POST"],
            name="openai_batch_cancel",
        ),
    ]


def batch_object(job: Job, done: int, failed: int) -> dict[str, Any]:
    """The batch as OpenAI's API shows it (``request_counts`` from its stored items)."""
    fields = job.fields
    answer: dict[str, Any] = {
        "id": job.id,
        "object": "batch",
        "endpoint": fields["endpoint"],
        "input_file_id": fields["input_file_id"],
        "completion_window": fields["completion_window"],
        "status": job.state,
        "output_file_id": fields.get("output_file_id"),
        "error_file_id": fields.get("error_file_id"),
        "created_at": int(job.created_at),
        "in_progress_at": int(job.created_at),
        "expires_at": int(job.created_at) + 86_400,
        "metadata": fields.get("metadata"),
        "errors": {"object": "list", "data": [{"message": job.error}]} if job.error else None,
        "request_counts": {"total": job.total or 0, "completed": done - failed, "failed": failed},
    }
    if job.ended_at is not None and job.state in TIMES:
        answer[TIMES[job.state]] = int(job.ended_at)
    return answer


def _file(file: StoredFile) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
    }


def _key(request: Request, keys: ClientKeys) -> ClientKey:
    key = bearer_key(request, keys)
    if key is None:
        raise openai_api.unauthorized("send 'Authorization: Bearer <key>' with a key of hymt web")
    return key


def _json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise OpenAIError(400, "send a JSON object")
    return body


def _limit(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise OpenAIError(400, "limit must be an integer from 1 to 100", param="limit")
    return int(value)
