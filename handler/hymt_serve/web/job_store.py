"""Durable jobs in the front end's database: DeepL document jobs and OpenAI batches, their
items' progress (a document's translated segments, a batch's answered lines) and the files of
the batch API (docs/jobs.md).

Tables (on :data:`hymt_serve.web.database.metadata`, created by migration 0004):

- ``jobs``: one row a job: its owner (a client key's name), kind, state, input (the uploaded
  document; a batch's input is its file), fields (JSON), the characters billed and refunded,
  its result or error, and which front end runs it (``runner``, ``heartbeat``: a lease).
- ``job_items``: one row per finished item, written as it arrives: a segment's translation,
  a batch line's output line (``status``: its HTTP status; ``characters``: what it billed).
- ``job_files``: ``/v1/files``: an upload, or a batch's output or error file.

Billing happens here, in the transaction that writes the job: ``client_keys.used`` grows by
the job's characters as the job row is inserted, and a refund (:meth:`JobStore.finish`) takes
them back as the job's end is written, only if it was not written before: a job is billed
once and refunded at most once, whatever restarts in between.

Every method is one transaction and blocks: the event loop calls them through
``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from hymt_serve.web.database import client_keys, metadata

DOCUMENT, BATCH = "document", "batch"
# States that end a job (a document's "done"/"error", a batch's OpenAI states).
ENDED = ("done", "error", "completed", "failed", "cancelled", "expired")

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(200), nullable=False, index=True),  # the client key's name
    sa.Column("kind", sa.String(16), nullable=False),  # document | batch
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("secret", sa.String(64)),  # a document's document_key
    sa.Column("filename", sa.String(400)),
    sa.Column("fields", sa.Text, nullable=False),  # JSON: the request's fields
    sa.Column("input", sa.LargeBinary),  # the uploaded document (UTF-8 text or base64)
    sa.Column("billed", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("refunded", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("total", sa.Integer),  # segments or lines, once known
    sa.Column("fingerprint", sa.String(64)),  # the document's split (request/document_resume)
    sa.Column("result", sa.LargeBinary),  # a document's translation
    sa.Column("error", sa.Text),
    sa.Column("runner", sa.String(64)),  # the front end running it
    sa.Column("heartbeat", sa.Float),  # when that runner last said it still runs it
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float),
    sa.Column("downloaded_at", sa.Float),
)

job_items = sa.Table(
    "job_items",
    metadata,
    sa.Column(
        "job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("position", sa.Integer, primary_key=True),  # segment index or line number
    sa.Column("status", sa.Integer, nullable=False),  # 200, or a failed batch line's status
    sa.Column("text", sa.Text, nullable=False),  # the translation, or the output line
    sa.Column("characters", sa.BigInteger, nullable=False, server_default="0"),
)

job_files = sa.Table(
    "job_files",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(200), nullable=False, index=True),
    sa.Column("purpose", sa.String(32), nullable=False),
    sa.Column("filename", sa.String(400), nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("content", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class Job:
    """A job row (without its input and result, read on their own)."""

    id: str
    owner: str
    kind: str
    state: str
    secret: str | None
    filename: str | None
    fields: dict[str, Any]
    billed: int
    refunded: int
    total: int | None
    fingerprint: str | None
    error: str | None
    created_at: float
    ended_at: float | None
    downloaded_at: float | None

    @property
    def ended(self) -> bool:
        return self.state in ENDED


@dataclass(frozen=True)
class Item:
    """A finished item of a job."""

    position: int
    status: int
    text: str
    characters: int = 0


@dataclass(frozen=True)
class StoredFile:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: float


_JOB_COLUMNS = [c for c in jobs.columns if c.name not in ("input", "result")]
_FILE_COLUMNS = [c for c in job_files.columns if c.name != "content"]


class JobStore:
    """The jobs of one database (an engine whose schema is at the newest revision)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def create(
        self, job: Mapping[str, Any], data: bytes | None, characters: int, runner: str
    ) -> None:
        """Insert ``job`` (id, owner, kind, state, fields, ...; its input ``data``), claimed by
        ``runner``, and bill its owner ``characters``, in one transaction."""
        now = time.time()
        values = {**job, "fields": json.dumps(job["fields"]), "input": data, "billed": characters}
        values |= {"runner": runner, "heartbeat": now, "created_at": now}
        with self.engine.begin() as connection:
            connection.execute(sa.insert(jobs).values(**values))
            _add_usage(connection, job["owner"], characters)

    def get(self, job_id: str) -> Job | None:
        with self.engine.begin() as connection:
            row = connection.execute(sa.select(*_JOB_COLUMNS).where(jobs.c.id == job_id)).first()
        return _job(row) if row is not None else None

    def listing(
        self, owner: str, kind: str, *, after: str | None = None, limit: int = 20
    ) -> list[Job]:
        """``owner``'s jobs of ``kind``, newest first, from the one after ``after``."""
        query = sa.select(*_JOB_COLUMNS).where(jobs.c.owner == owner, jobs.c.kind == kind)
        with self.engine.begin() as connection:
            if after is not None:
                since = connection.execute(
                    sa.select(jobs.c.created_at).where(jobs.c.id == after)
                ).scalar()
                if since is not None:
                    query = query.where(
                        sa.or_(
                            jobs.c.created_at < since,
                            sa.and_(jobs.c.created_at == since, jobs.c.id < after),
                        )
                    )
            query = query.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
            return [_job(row) for row in connection.execute(query)]

    def counts(self, owner: str, kind: str) -> tuple[int, int, int]:
        """``owner``'s jobs of ``kind``: (unfinished, kept, all owners' kept)."""
        with self.engine.begin() as connection:
            rows = connection.execute(
                sa.select(jobs.c.owner, jobs.c.state).where(jobs.c.kind == kind)
            ).all()
        mine = [state for name, state in rows if name == owner]
        return sum(state not in ENDED for state in mine), len(mine), len(rows)

    def input(self, job_id: str) -> bytes:
        with self.engine.begin() as connection:
            data = connection.execute(sa.select(jobs.c.input).where(jobs.c.id == job_id)).scalar()
        return bytes(data or b"")

    def result(self, job_id: str) -> bytes | None:
        with self.engine.begin() as connection:
            data = connection.execute(sa.select(jobs.c.result).where(jobs.c.id == job_id)).scalar()
        return bytes(data) if data is not None else None

    def update(self, job_id: str, **values: Any) -> bool:
        """Set ``values`` on an unfinished job; False when it has ended (nothing written)."""
        with self.engine.begin() as connection:
            done = connection.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state.not_in(ENDED))
                .values(**values)
            )
        return bool(done.rowcount)

    def mark_downloaded(self, job_id: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.downloaded_at.is_(None))
                .values(downloaded_at=time.time())
            )

    def items(self, job_id: str) -> dict[int, Item]:
        """The job's finished items by position."""
        query = sa.select(job_items).where(job_items.c.job_id == job_id)
        with self.engine.begin() as connection:
            return {
                row.position: Item(row.position, row.status, row.text, row.characters)
                for row in connection.execute(query)
            }

    def item_count(self, job_id: str) -> tuple[int, int]:
        """(finished items, of them failed: status other than 200)."""
        failed = sa.func.sum(sa.case((job_items.c.status != 200, 1), else_=0))
        query = sa.select(sa.func.count(), failed).where(job_items.c.job_id == job_id)
        with self.engine.begin() as connection:
            count, bad = connection.execute(query).one()
        return int(count), int(bad or 0)

    def add_items(self, job_id: str, items: Iterable[Item], **values: Any) -> None:
        """Finished items of ``job_id`` (and ``values`` set on the job), in one transaction."""
        rows = [{"job_id": job_id, **item.__dict__} for item in items]
        with self.engine.begin() as connection:
            if rows:
                connection.execute(sa.insert(job_items), rows)
            if values:
                connection.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))

    def clear_items(self, job_id: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(sa.delete(job_items).where(job_items.c.job_id == job_id))

    def finish(self, job_id: str, state: str, refund: int = 0, **values: Any) -> bool:
        """End the job in ``state`` (with ``values``: result, error, ...) and give its owner
        back ``refund`` characters, in one transaction, only if it had not ended: False (and
        nothing written, nothing refunded) when it had."""
        with self.engine.begin() as connection:
            owner = connection.execute(
                sa.select(jobs.c.owner).where(jobs.c.id == job_id, jobs.c.state.not_in(ENDED))
            ).scalar()
            if owner is None:
                return False
            values |= {"state": state, "ended_at": time.time(), "refunded": refund}
            done = connection.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state.not_in(ENDED))
                .values(**values)
            )
            if done.rowcount != 1:
                return False
            _add_usage(connection, owner, -refund)
        return True

    def claim(self, runner: str, stale_s: float) -> list[Job]:
        """Unfinished jobs that no runner has beaten for ``stale_s`` (their front end stopped),
        now ``runner``'s: a job runs in one front end at a time."""
        now = time.time()
        stale = sa.or_(jobs.c.heartbeat.is_(None), jobs.c.heartbeat < now - stale_s)
        claimed = []
        with self.engine.begin() as connection:
            query = sa.select(*_JOB_COLUMNS).where(jobs.c.state.not_in(ENDED), stale)
            for row in connection.execute(query).all():
                done = connection.execute(
                    sa.update(jobs)
                    .where(jobs.c.id == row.id, jobs.c.state.not_in(ENDED), stale)
                    .values(runner=runner, heartbeat=now)
                )
                if done.rowcount == 1:
                    claimed.append(_job(row))
        return claimed

    def beat(self, runner: str, job_ids: Sequence[str]) -> None:
        """``runner`` still runs ``job_ids``."""
        if not job_ids:
            return
        with self.engine.begin() as connection:
            connection.execute(
                sa.update(jobs)
                .where(jobs.c.id.in_(list(job_ids)), jobs.c.runner == runner)
                .values(heartbeat=time.time())
            )

    def forget(self, kind: str, ended_before: float, downloaded_before: float) -> int:
        """Delete ``kind`` jobs that ended before ``ended_before`` or were downloaded before
        ``downloaded_before``, with their items; how many."""
        old = sa.or_(
            sa.and_(jobs.c.ended_at.is_not(None), jobs.c.ended_at < ended_before),
            sa.and_(jobs.c.downloaded_at.is_not(None), jobs.c.downloaded_at < downloaded_before),
        )
        with self.engine.begin() as connection:
            ids = connection.execute(sa.select(jobs.c.id).where(jobs.c.kind == kind, old)).scalars()
            gone = list(ids)
            if gone:
                connection.execute(sa.delete(job_items).where(job_items.c.job_id.in_(gone)))
                connection.execute(sa.delete(jobs).where(jobs.c.id.in_(gone)))
        return len(gone)

    # -- files (/v1/files) ------------------------------------------------------------------

    def add_file(self, file: StoredFile, content: bytes) -> None:
        with self.engine.begin() as connection:
            connection.execute(sa.insert(job_files).values(**file.__dict__, content=content))

    def file(self, file_id: str) -> StoredFile | None:
        query = sa.select(*_FILE_COLUMNS).where(job_files.c.id == file_id)
        with self.engine.begin() as connection:
            row = connection.execute(query).first()
        return StoredFile(**row._mapping) if row is not None else None

    def files(self, owner: str, purpose: str | None = None) -> list[StoredFile]:
        query = sa.select(*_FILE_COLUMNS).where(job_files.c.owner == owner)
        if purpose is not None:
            query = query.where(job_files.c.purpose == purpose)
        with self.engine.begin() as connection:
            rows = connection.execute(query.order_by(job_files.c.created_at.desc())).all()
        return [StoredFile(**row._mapping) for row in rows]

    def file_content(self, file_id: str) -> bytes:
        query = sa.select(job_files.c.content).where(job_files.c.id == file_id)
        with self.engine.begin() as connection:
            return bytes(connection.execute(query).scalar() or b"")

    def delete_file(self, file_id: str) -> bool:
        with self.engine.begin() as connection:
            done = connection.execute(sa.delete(job_files).where(job_files.c.id == file_id))
        return bool(done.rowcount)


def _add_usage(connection: Connection, owner: str, characters: int) -> None:
    """``used = used + characters`` for the key ``owner`` (never below 0): the key's usage, as
    :class:`.key_store.KeyStore` writes it (every front end reads it back within a turn)."""
    if not characters:
        return
    added = client_keys.c.used + characters
    connection.execute(
        sa.update(client_keys)
        .where(client_keys.c.name == owner)
        .values(used=sa.case((added < 0, 0), else_=added))
    )


def _job(row: Row[Any]) -> Job:
    values = dict(row._mapping)
    values["fields"] = json.loads(values["fields"])
    for name in ("input", "result", "runner", "heartbeat"):
        values.pop(name, None)
    return Job(**values)
