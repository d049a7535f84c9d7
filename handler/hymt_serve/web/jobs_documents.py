"""DeepL document jobs, durable (docs/jobs.md): each upload is a job in the database
(:mod:`.job_store`) with its file; its segments' translations are stored as they come back, so
a restart of the front end or of TorchServe resumes it where it stopped.

A job's calls are the request API's document requests (docs/documents.md) with the resume
fields (:mod:`hymt_serve.request.document_resume`): each asks for at most
``SEGMENTS_PER_CALL`` of the segments not yet translated, giving those that are
(``done_segments``, with the ``segments_fingerprint`` of the split they belong to); each reply's
``segment_translations`` are stored before the next call, and the call that leaves no segment
missing answers the document. A segment stored is never sent to the model again; a call cut
short by a restart loses only its own segments. Characters are billed once, in the
transaction that stores the job, and refunded once if it fails. What the translation memory
served (a reply's ``usage.memory_characters``) is noted with the segments that reply stored
(their first item's ``characters``, in the same transaction), and the job that ends done gets
their sum back in the transaction that ends it: once, a resumed job's earlier calls included.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import time
from typing import Any

from hymt_serve.request.memory_key import CACHE_FIELD
from hymt_serve.request.office import OFFICE_FORMATS
from hymt_serve.web.access import memory_characters, with_namespace
from hymt_serve.web.batches import Batches
from hymt_serve.web.compat import CompatError
from hymt_serve.web.fairness import Busy, Post
from hymt_serve.web.job_store import DOCUMENT, Item, Job, JobStore
from hymt_serve.web.jobs import GIVE_UP_S, LEASE_S, JobRunner, Patience, error_text, retryable
from hymt_serve.web.keys import ClientKey, ClientKeys
from hymt_serve.web.memory_front import FastPath

MAX_JOBS = 256  # kept in the database: each holds up to MAX_FILE_BYTES twice
PER_KEY_ACTIVE = 8
PER_KEY_KEPT = 32
KEEP_S = 3600.0
DOWNLOADED_KEEP_S = 300.0
WORKERS = 4
SEGMENTS_PER_CALL = 128  # what a restart can lose of a document's work, at most
SEGMENTS_VARIABLE = "HYMT_DOCUMENT_SEGMENTS_PER_CALL"  # sets it (tests, tuning)
FINGERPRINT_FIELD = "segments_fingerprint"


class DocumentJobs:
    """The uploaded documents and their translations, in the database of ``keys``; also the
    holder of the batch API's jobs (:attr:`batches`) and of the runner both use. ``fast``
    says whether the translation memory is isolated per key (each call then names the job's
    owner to it)."""

    def __init__(
        self, post: Post, model: str, keys: ClientKeys, fast: FastPath | None = None
    ) -> None:
        self._post, self._model, self._keys = post, model, keys
        self.store = JobStore(keys.store.engine)
        self.runner = JobRunner(self.store, lease_s=LEASE_S)
        self.runner.register(DOCUMENT, self._run)
        self.batches = Batches(self.runner, self.store, post, model, self.named)
        self.fast = fast
        self.give_up_s = GIVE_UP_S
        self.segments_per_call = int(os.environ.get(SEGMENTS_VARIABLE) or SEGMENTS_PER_CALL)
        self._turns: asyncio.Semaphore | None = None  # WORKERS translating at once

    async def open(self) -> None:
        """Called once the event loop serves, before the first request (the app's lifespan):
        the jobs a stopped front end left are resumed from here on."""
        await self.runner.open()

    async def close(self) -> None:
        """Cancel the translations in progress (stored; the next start resumes them)."""
        await self.runner.close()

    async def submit(
        self,
        key: ClientKey,
        filename: str,
        text: str,
        fields: dict[str, Any],
        characters: int | None = None,
    ) -> tuple[str, str]:
        """Store ``text`` (the file's content; an Office file's in base64) as a job and start
        it: (document id, document key). ``fields``: the request API's, ``format`` included;
        ``characters`` billed (the text's length if not given). Raises CompatError (quota,
        too many jobs)."""
        characters = len(text) if characters is None else characters
        await asyncio.to_thread(self._forget_old)
        await self._check_room(key, characters)
        document_id, secret = secrets.token_hex(16), secrets.token_urlsafe(32)
        job: dict[str, Any] = {"id": document_id, "owner": key.name, "kind": DOCUMENT}
        job["state"] = "queued"
        job |= {"secret": secret, "filename": filename, "fields": fields}
        await asyncio.to_thread(
            self.store.create, job, text.encode("utf-8"), characters, self.runner.id
        )
        stored = await asyncio.to_thread(self.store.get, document_id)
        assert stored is not None
        self.runner.start(stored)
        return document_id, secret

    async def _check_room(self, key: ClientKey, characters: int) -> None:
        """CompatError when ``key`` (or the front end) has no room for one more job, or the
        key's limit no room for ``characters``."""
        active, kept, everyone = await asyncio.to_thread(self.store.counts, key.name, DOCUMENT)
        if active >= PER_KEY_ACTIVE:
            raise CompatError(
                429,
                f"This key has {active} documents in translation (at most {PER_KEY_ACTIVE}): "
                "wait for one to finish.",
            )
        if kept >= PER_KEY_KEPT:
            raise CompatError(
                429,
                f"This key has {kept} documents on the server (at most {PER_KEY_KEPT}): "
                "download the finished ones first.",
            )
        if everyone >= MAX_JOBS:
            raise CompatError(429, "Too many documents in progress, try again later.")
        if self._keys.used(key) + characters > key.character_limit:
            raise CompatError(456, "Quota for this billing period has been exceeded.")

    async def _run(self, job: Job) -> None:
        """Translate (or go on translating) ``job``, once a turn comes."""
        if self._turns is None:
            self._turns = asyncio.Semaphore(WORKERS)
        async with self._turns:
            await self._translate(job)

    async def _translate(self, job: Job) -> None:
        text = (await asyncio.to_thread(self.store.input, job.id)).decode("utf-8")
        items = await asyncio.to_thread(self.store.items, job.id)
        done = {position: item.text for position, item in items.items()}
        fingerprint = job.fingerprint if done else None
        kind = job.fields["format"]  # the request API's, from the file's suffix
        await asyncio.to_thread(self.store.update, job.id, state="translating")
        patience = Patience(self.give_up_s)
        while True:
            body = {**job.fields, "document": text, "stream": False}
            body |= {"done_segments": {str(i): t for i, t in done.items()}}
            body |= {"max_segments": self.segments_per_call}
            if fingerprint is not None:
                body[FINGERPRINT_FIELD] = fingerprint
            status, answer = await self._call(self.named(body, job.owner))
            if status == 200 and isinstance(answer.get("document"), str):
                await self._store(job, answer, done)
                result = answer["document"]
                data = base64.b64decode(result) if kind in OFFICE_FORMATS else result.encode()
                # what the memory served, every call's (stored with their segments): not billed
                items = await asyncio.to_thread(self.store.items, job.id)
                refund = min(job.billed, sum(item.characters for item in items.values()))
                await asyncio.to_thread(self.store.finish, job.id, "done", refund, result=data)
                return
            if status == 200 and isinstance(answer.get("segment_translations"), dict):
                before = len(done)
                fingerprint = await self._store(job, answer, done)
                if len(done) > before:
                    patience.progressed()
                    continue
                status = 502  # a reply that moved nothing on: waited for like a failure
            if status == 400 and answer.get("field") == FINGERPRINT_FIELD and done:
                # The document splits otherwise now (another tokenizer or budget after a
                # restart): the stored segments belong to another split, start again.
                await asyncio.to_thread(self.store.clear_items, job.id)
                done, fingerprint = {}, None
                continue
            if status == 200 or not retryable(status) or not await patience.wait():
                await self._fail(job, error_text(status, answer))
                return

    def named(self, body: dict[str, Any], owner: str) -> dict[str, Any]:
        """``body`` as it goes to TorchServe for a job of ``owner`` (a key's name): named to
        the translation memory where it is isolated per key (:func:`.access.with_namespace`)."""
        isolated = self.fast is not None and self.fast.isolated
        key = next((key for key in self._keys.keys if key.name == owner), None)
        if isolated and key is None:  # a key deleted since: no other key's memory, nor its own
            return {**with_namespace(body, None, False), CACHE_FIELD: False}
        return with_namespace(body, key, isolated)

    async def _call(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            return await self._post(self._model, body, bulk=True)  # bulk work
        except Busy as busy:
            return busy.status, busy.body()
        except Exception as error:  # a job goes on whatever one call did
            return 502, {"error": f"the translation failed ({type(error).__name__})"}

    async def _store(self, job: Job, answer: dict[str, Any], done: dict[int, str]) -> str | None:
        """The reply's new segment translations into ``done`` and the database (the first
        new one noting the characters the memory served); its fingerprint."""
        new = answer.get("segment_translations")
        fingerprint = answer.get(FINGERPRINT_FIELD)
        if not isinstance(new, dict):
            return fingerprint if isinstance(fingerprint, str) else None
        added = {int(i): str(t) for i, t in new.items() if int(i) not in done}
        done.update(added)
        values: dict[str, Any] = {"total": answer.get("segments_total")}
        if isinstance(fingerprint, str):
            values["fingerprint"] = fingerprint
        items = [Item(position, 200, text) for position, text in sorted(added.items())]
        if items:  # the reply's memory characters, kept with what it added (refunded at the end)
            items[0] = Item(items[0].position, 200, items[0].text, memory_characters(answer))
        await asyncio.to_thread(self.store.add_items, job.id, items, **values)
        return fingerprint if isinstance(fingerprint, str) else None

    async def _fail(self, job: Job, message: str) -> None:
        await asyncio.to_thread(
            self.store.finish, job.id, "error", refund=job.billed, error=message
        )

    async def find(self, document_id: str, document_key: str | None, key: ClientKey) -> Job:
        """The job, or CompatError 404 (unknown id, the wrong document key, or a job that
        another client key uploaded)."""
        job = await asyncio.to_thread(self.store.get, document_id)
        if (
            job is None
            or job.kind != DOCUMENT
            or not document_key
            or not secrets.compare_digest(job.secret or "", document_key)
            or job.owner != key.name  # a name, not a secret (and may be any text)
        ):
            raise CompatError(404, "Document not found")
        return job

    async def take(self, job: Job) -> bytes:
        """A done job's translation (kept ``DOWNLOADED_KEEP_S`` more, for a retry);
        CompatError 503 before it is done."""
        if job.state != "done":
            raise CompatError(503, "Document translation is not done yet.")
        result = await asyncio.to_thread(self.store.result, job.id)
        await asyncio.to_thread(self.store.mark_downloaded, job.id)
        return result or b""

    def _forget_old(self) -> None:
        now = time.time()
        self.store.forget(DOCUMENT, now - KEEP_S, now - DOWNLOADED_KEEP_S)
