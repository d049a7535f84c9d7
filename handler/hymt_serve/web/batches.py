"""OpenAI's Batch API on durable jobs (docs/jobs.md): a batch is a job whose items are the
lines of its input file (``/v1/files``, purpose ``batch``), each a ``/v1/chat/completions``
or ``/v1/completions`` call.

Each line is read by the same functions as the route's (:func:`.openai_api.parse_chat`,
``parse_completion``), its ``forward`` body posted to TorchServe as the route posts it, and its
answer rendered by :func:`.openai_reply.response`; a line's output line is stored as it
arrives (a few arrivals a transaction, :class:`ItemWriter`), and a line stored is never sent
again. At most ``concurrency`` lines are in flight (enough to fill the engine's batch: its
``max_batch_rows``; ``$HYMT_BATCH_CONCURRENCY`` sets it). A line TorchServe did not answer
(restarting, busy) is sent again after a back-off; a line it refused (4xx) goes to the error
file. The batch is billed its lines' characters once, at creation; at its end it gets back the
characters of every line that did not succeed (failed or, when cancelled, never sent), and of
what the translation memory served (a line's reply's ``usage.memory_characters``: its stored
output line keeps only the rest as billed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hymt_serve.request import openai_api, openai_reply
from hymt_serve.request.openai_api import Call, OpenAIError
from hymt_serve.web.access import memory_characters
from hymt_serve.web.fairness import Busy, Post
from hymt_serve.web.job_store import BATCH, Item, Job, JobStore, StoredFile
from hymt_serve.web.jobs import GIVE_UP_S, JobRunner, Patience, error_text, retryable

log = logging.getLogger(__name__)
ENDPOINTS = {"/v1/chat/completions": openai_api.parse_chat}
ENDPOINTS["/v1/completions"] = openai_api.parse_completion
MAX_LINES = 200_000
DEFAULT_CONCURRENCY = 64  # the CPU profile's max_batch_rows; the GPU's is 256
CONCURRENCY_VARIABLE = "HYMT_BATCH_CONCURRENCY"


@dataclass(frozen=True)
class Line:
    """One line of a batch's input: its call, or why it cannot be sent (its error line)."""

    custom_id: str
    call: Call | None
    error: OpenAIError | None = None

    @property
    def characters(self) -> int:
        return self.call.characters if self.call is not None else 0


def parse_lines(content: bytes, endpoint: str, models: Sequence[str]) -> list[Line]:
    """The input file's lines; OpenAIError 400 for a file the batch cannot start with (not
    JSONL, a line without a unique ``custom_id``, another method or endpoint). A line whose
    body the route would refuse is kept with its error (it goes to the error file)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise OpenAIError(
            400, "The input file is not UTF-8 JSONL.", param="input_file_id"
        ) from None
    lines: list[Line] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        request = _json_line(raw, number)
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or custom_id in seen:
            why = "a duplicate" if custom_id in seen else "missing or not a string"
            raise _invalid(f"line {number}: custom_id is {why}")
        seen.add(custom_id)
        if request.get("method") != "POST" or request.get("url") != endpoint:
            raise _invalid(f"line {number}: method must be POST and url {endpoint!r}")
        try:
            call = ENDPOINTS[endpoint](request.get("body"), models)
            if call.stream:
                raise OpenAIError(400, "a batch line cannot stream", param="stream")
            lines.append(Line(custom_id, call))
        except OpenAIError as error:
            lines.append(Line(custom_id, None, error))
        if len(lines) > MAX_LINES:
            raise _invalid(f"the file has more than {MAX_LINES} requests")
    if not lines:
        raise _invalid("the input file has no requests")
    return lines


def _json_line(raw: str, number: int) -> dict[str, Any]:
    try:
        request = json.loads(raw)
    except ValueError:
        raise _invalid(f"line {number} is not JSON") from None
    if not isinstance(request, dict):
        raise _invalid(f"line {number} is not a JSON object")
    return request


def _invalid(message: str) -> OpenAIError:
    return OpenAIError(400, message, param="input_file_id", code="invalid_input_file")


class ItemWriter:
    """A job's finished items written as they arrive: whatever arrived while one transaction
    ran goes in the next (one transaction per arrival when they come slowly)."""

    def __init__(self, store: JobStore, job_id: str) -> None:
        self._store, self._job_id = store, job_id
        self._pending: list[Item] = []
        self._task: asyncio.Task[None] | None = None

    def put(self, item: Item) -> None:
        self._pending.append(item)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self._pending:
            items, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self._store.add_items, self._job_id, items)
            except Exception as error:  # the database went away: kept, tried again
                log.warning("batch %s: results not stored yet (%s)", self._job_id, error)
                self._pending[:0] = items
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Wait until every item put is stored."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)


Named = Callable[[dict[str, Any], str], dict[str, Any]]


class Batches:
    """The batch jobs of ``store``, run by ``runner`` through ``post`` on ``model``;
    ``named(body, owner)``: a line's body as it goes to TorchServe (the translation memory's
    namespace of the batch's owner, where it is isolated per key)."""

    def __init__(
        self, runner: JobRunner, store: JobStore, post: Post, model: str, named: Named
    ) -> None:
        self.runner, self.store, self._post, self.model = runner, store, post, model
        self._named = named
        self.concurrency = int(os.environ.get(CONCURRENCY_VARIABLE) or DEFAULT_CONCURRENCY)
        self.give_up_s = GIVE_UP_S
        runner.register(BATCH, self._run)

    async def create(self, owner: str, fields: dict[str, Any], lines: list[Line]) -> Job:
        """Store the batch (``fields``: endpoint, input_file_id, ...) billing its lines'
        characters, and start it."""
        job: dict[str, Any] = {"id": f"batch_{secrets.token_hex(12)}", "owner": owner}
        job["kind"] = BATCH
        job |= {"state": "in_progress", "fields": fields, "total": len(lines)}
        characters = sum(line.characters for line in lines)
        await asyncio.to_thread(self.store.create, job, None, characters, self.runner.id)
        stored = await asyncio.to_thread(self.store.get, job["id"])
        assert stored is not None
        self.runner.start(stored)
        return stored

    async def cancel(self, job: Job) -> Job:
        """Stop ``job``: this front end's task at once (another's at its next look), and the
        batch ends ``cancelled`` with what it has."""
        await asyncio.to_thread(self.store.update, job.id, state="cancelling")
        if self.runner.running(job.id):
            await self.runner.cancel(job.id)
            await self._finish(job, "cancelled")
        found = await asyncio.to_thread(self.store.get, job.id)
        return found or job

    async def _run(self, job: Job) -> None:
        content = await asyncio.to_thread(self.store.file_content, job.fields["input_file_id"])
        try:
            lines = await asyncio.to_thread(
                parse_lines, content, job.fields["endpoint"], (self.model,)
            )
        except OpenAIError as error:  # the file changed (deleted) since the batch began
            await self._finish(job, "failed", error=error.message)
            return
        if job.state == "cancelling":
            await self._finish(job, "cancelled")
            return
        done = await asyncio.to_thread(self.store.items, job.id)
        todo = iter([n for n in range(len(lines)) if n not in done])
        writer = ItemWriter(self.store, job.id)
        try:
            workers = [self._work(job, lines, todo, writer) for _ in range(self.concurrency)]
            await asyncio.gather(*workers)
        finally:
            await writer.close()  # what arrived is stored, even when cancelled
        state = "cancelled" if await self._cancelling(job) else "completed"
        await self._finish(job, state)

    async def _work(self, job: Job, lines: list[Line], todo: Any, writer: ItemWriter) -> None:
        for position in todo:
            line = lines[position]
            if line.call is None:
                assert line.error is not None
                writer.put(_error_item(job, position, line, line.error.status, line.error.body()))
                continue
            item = await self._answer(job, position, line, line.call)
            if item is None:  # cancelled elsewhere, or TorchServe never came back
                return
            writer.put(item)

    async def _answer(self, job: Job, position: int, line: Line, call: Call) -> Item | None:
        patience = Patience(self.give_up_s)
        while True:
            try:
                status, reply = await self._post(self.model, self._named(call.forward, job.owner))
            except Busy as busy:
                status, reply = busy.status, busy.body()
            except Exception as error:  # a line goes on whatever one call did
                status, reply = 502, {"error": f"the call failed ({type(error).__name__})"}
            if status == 200:
                try:
                    body = openai_reply.response(call, reply)
                except (KeyError, TypeError, ValueError, AttributeError):
                    wrong = OpenAIError(500, "the model server's reply is not a chat-form reply")
                    return _error_item(job, position, line, 500, wrong.body())
                served = memory_characters(reply)  # not billed: the line keeps the rest
                request_id = str(reply.get("request_id") or "")
                return _item(job, position, line, 200, body, request_id, served)
            if not retryable(status):
                failed = openai_reply.error_from_reply(status, reply)
                return _error_item(job, position, line, failed.status, failed.body())
            if await self._cancelling(job) or not await patience.wait():
                log.warning("batch %s: line %d not answered (%s)", job.id, position, status)
                if not await self._cancelling(job):
                    message = error_text(status, reply)
                    return _error_item(job, position, line, status, {"error": {"message": message}})
                return None

    async def _cancelling(self, job: Job) -> bool:
        found = await asyncio.to_thread(self.store.get, job.id)
        return found is None or found.state == "cancelling"

    async def _finish(self, job: Job, state: str, error: str | None = None) -> None:
        """Write the output and error files and end the batch in ``state``, refunding every
        character of a line that did not succeed."""
        items = await asyncio.to_thread(self.store.items, job.id)
        ok = [items[n] for n in sorted(items) if items[n].status == 200]
        bad = [items[n] for n in sorted(items) if items[n].status != 200]
        values: dict[str, Any] = {"error": error}
        for name, chosen in (("output_file_id", ok), ("error_file_id", bad)):
            if chosen:
                values[name] = await self._write_file(job, chosen)
        fields = {**job.fields, **{k: v for k, v in values.items() if k.endswith("_file_id")}}
        refund = job.billed - sum(item.characters for item in ok)
        await asyncio.to_thread(
            self.store.finish, job.id, state, refund, fields=json.dumps(fields), error=error
        )

    async def _write_file(self, job: Job, items: list[Item]) -> str:
        content = "".join(item.text + "\n" for item in items).encode("utf-8")
        file = StoredFile(
            f"file-{secrets.token_hex(12)}", job.owner, "batch_output", f"{job.id}_output.jsonl",
            len(content), time.time(),
        )  # fmt: skip
        await asyncio.to_thread(self.store.add_file, file, content)
        return file.id


def _item(
    job: Job, position: int, line: Line, status: int, body: Any, request_id: str, served: int = 0
) -> Item:
    """A line's output line (OpenAI's shape), billed its characters when it succeeded, less
    ``served``: those the translation memory served."""
    output = {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": line.custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }
    characters = max(0, line.characters - served) if status == 200 else 0
    return Item(position, status, json.dumps(output, ensure_ascii=False), characters)


def _error_item(job: Job, position: int, line: Line, status: int, body: Any) -> Item:
    return _item(job, position, line, status, body, "")
