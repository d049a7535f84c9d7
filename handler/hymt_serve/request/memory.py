"""The translation memory's store: one table of translations in the front end's database.

:class:`TranslationMemory` looks rows up by key in one query (:meth:`~TranslationMemory.recall`,
or by the front end's plain key), and keeps new translations and the hits' ``last_used`` through
a writer thread that writes whatever was queued since its last turn in one transaction, so a
request never waits for a write (this process's lookups find what waits for the writer). Past
``max_rows`` the least recently used rows go, :data:`EVICT_SHARE` of the bound at a time,
checked at most every :data:`EVICT_CHECK_S`. A database that fails is logged and skipped: a
lookup that fails finds nothing, a write that fails is dropped; a translation never fails
because of its memory.

The table is the one migration 0002 creates (``web/migrations/versions``; a test keeps the two
equal); a worker that starts before ``hymt web`` creates it itself (the migration then finds
it). SQLite runs in WAL mode (readers never wait for the writer), a write takes the write lock
at its start (``BEGIN IMMEDIATE``), as the front end's own connections do.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from hymt_serve.core.sqlite import sqlite_engine

logger = logging.getLogger(__name__)

DATABASE_FILE = "hymt.db"  # the front end's database file in the work folder (web/database.py)
URL_VARIABLE = "HYMT_DATABASE_URL"
WORK_DIR_VARIABLE = "HYMT_WORK_DIR"  # set by hymt start for its workers
ADVISORY_LOCK = 0x68796D74  # PostgreSQL: the front end's migration lock (web/database.py)
EVICT_CHECK_S = 10.0  # the row count is read at most this often (only after writes)
EVICT_SHARE = 0.05  # past the bound, the least recently used rows go down to 95 % of it
CHUNK = 500  # keys per lookup statement (SQLite binds at most 32,766 parameters)
NEVER_EVICTED = 2**62  # the markers' last_used

metadata = sa.MetaData()

translation_memory = sa.Table(
    "translation_memory",
    metadata,
    # memory_key.row_key: the model, the namespace, the prompt's ids, the limits (sha256 hex).
    sa.Column("key", sa.String(64), primary_key=True),
    # memory_key.plain_key of a plain sentence request's text: what the front end looks up.
    sa.Column("plain_key", sa.String(64), nullable=True, index=True),
    sa.Column("namespace", sa.String(200), nullable=False, server_default=""),
    sa.Column("model", sa.String(32), nullable=False),  # memory_key.model_identity
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("token_ids", sa.Text, nullable=False),  # comma-separated
    sa.Column("finish_reason", sa.String(8), nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("template", sa.String(32), nullable=False),
    # The language check's outcome when it was kept ("ok" or "mismatch"); null: not checked.
    sa.Column("target_language", sa.String(8), nullable=True),
    sa.Column("last_used", sa.BigInteger, nullable=False, index=True),  # Unix seconds
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)
_VALUES = ("text", "token_ids", "finish_reason", "prompt_tokens", "template", "target_language")


class Entry(NamedTuple):
    """One translation to keep."""

    key: str
    plain_key: str | None
    namespace: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    template: str
    target_language: str | None


class Found(NamedTuple):
    """One translation found."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    template: str
    target_language: str | None


def resolve_url(setting: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The memory's database URL for the ``memory_database_url`` setting: a URL as given;
    "auto": $HYMT_DATABASE_URL, else ``hymt.db`` in hymt start's work folder, else None."""
    if setting.lower() != "auto":
        return setting
    found = environ.get(URL_VARIABLE, "").strip()
    if found:
        return found
    work = environ.get(WORK_DIR_VARIABLE, "").strip()
    return f"sqlite:///{Path(work).resolve() / DATABASE_FILE}" if work else None


def connect(url: str) -> Engine:
    """An engine for ``url``; a SQLite file is created mode 0600 (the front end keeps its
    client keys in it). Raises SQLAlchemy's errors for a URL it cannot use."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed, pool_size=2, max_overflow=4, pool_pre_ping=True)
    engine = sqlite_engine(parsed)

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # A write takes the write lock at once; a read takes none (WAL readers never wait).
        write = connection.get_execution_options().get("write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def create_table(engine: Engine) -> None:
    """Create the table (and its indexes) unless it exists, under the migration lock."""
    with engine.connect().execution_options(write=True) as connection, connection.begin():
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": ADVISORY_LOCK})
        metadata.create_all(connection, checkfirst=True)


class TranslationMemory:
    """The memory of one database for the model ``model`` (:func:`memory_key.model_identity`).
    ``recall``/``recall_plain`` block (call them off an event loop); ``keep`` and the hits'
    touches are queued for the writer thread. ``hits``, ``misses`` (rows, as the service
    tallies them) and ``evictions`` count since the start; the service sends them as metrics."""

    def __init__(self, engine: Engine, model: str, max_rows: int, *, url: str = "") -> None:
        self.engine, self.model, self.max_rows, self.url = engine, model, max_rows, url
        self.hits = self.misses = self.evictions = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._inserted = 0
        self._unwritten: dict[str, Entry] = {}  # kept, not yet written: found by recall
        self._checked = 0.0  # when the row count was last read
        self._writer = threading.Thread(target=self._write_loop, name="memory-writer", daemon=True)
        self._writer.start()

    @classmethod
    def open(cls, url: str, model: str, max_rows: int) -> TranslationMemory:
        """The memory in the database at ``url``, its table created when missing."""
        engine = connect(url)
        create_table(engine)
        return cls(engine, model, max_rows, url=url)

    def recall(self, keys: Iterable[str]) -> dict[str, Found]:
        """The translations kept under ``keys`` (one query a chunk); {} when the database
        fails. The hits' ``last_used`` is brought up to date by the writer."""
        return self._recall(translation_memory.c.key, keys)

    def recall_plain(self, keys: Iterable[str]) -> dict[str, Found]:
        """Like :meth:`recall`, by the front end's plain keys (this model's entries only)."""
        return self._recall(translation_memory.c.plain_key, keys)

    def _recall(self, column: sa.Column[Any], keys: Iterable[str]) -> dict[str, Found]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        table, found = translation_memory, self._queued(column.name, wanted)
        wanted = [key for key in wanted if key not in found]
        try:
            with self.engine.connect() as connection:
                for start in range(0, len(wanted), CHUNK):
                    query = sa.select(column, *(table.c[name] for name in _VALUES)).where(
                        column.in_(wanted[start : start + CHUNK]), table.c.model == self.model
                    )
                    for row in connection.execute(query):
                        found[row[0]] = _found(row)
        except sa.exc.SQLAlchemyError as error:
            logger.warning("translation memory lookup failed: %s", _said(error))
            return {}
        if found:
            self._queue.put(("touch", (column.name, list(found))))
        return found

    def _queued(self, column: str, wanted: Sequence[str]) -> dict[str, Found]:
        """The entries under ``wanted`` that wait for the writer (a request right after the
        one that made them finds them)."""
        with self._lock:
            if not self._unwritten:
                return {}
            if column == "key":
                hits = [self._unwritten[key] for key in wanted if key in self._unwritten]
            else:
                plain = set(wanted)
                hits = [e for e in self._unwritten.values() if e.plain_key in plain]
        return {
            e.key if column == "key" else str(e.plain_key): Found(
                e.text, e.token_ids, e.finish_reason, e.prompt_tokens, e.template, e.target_language
            )
            for e in hits
        }

    def tally(self, *, hits: int = 0, misses: int = 0, evictions: int = 0) -> None:
        """Add to the counts (lookups run on several threads in async mode)."""
        with self._lock:
            self.hits += hits
            self.misses += misses
            self.evictions += evictions

    def keep(self, entries: Sequence[Entry]) -> None:
        """Queue ``entries`` for the writer (a newer translation replaces an older one)."""
        if entries:
            with self._lock:
                self._unwritten.update((entry.key, entry) for entry in entries)
            self._queue.put(("keep", list(entries)))

    def announce(self, model_name: str, marker: str) -> None:
        """Write (at once) that TorchServe's ``model_name`` serves this model now, under the
        key ``marker`` (:func:`memory_key.marker_key`): the front end checks it."""
        entry = Entry(marker, None, "", self.model, (), "stop", 0, model_name, None)
        with self.engine.connect().execution_options(write=True) as connection, connection.begin():
            _upsert(connection, [entry], NEVER_EVICTED, model=self.model)

    def current(self, marker: str) -> str | None:
        """The identity of the model the marker names (None when absent or unreadable)."""
        query = sa.select(translation_memory.c.text).where(translation_memory.c.key == marker)
        try:
            with self.engine.connect() as connection:
                value = connection.execute(query).scalar()
        except sa.exc.SQLAlchemyError as error:
            logger.warning("translation memory lookup failed: %s", _said(error))
            return None
        return str(value) if value is not None else None

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until what was queued before this call is written (tests, shutdown)."""
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, stop the writer, close the connections."""
        self._queue.put(("stop", None))
        self._writer.join(timeout=10.0)
        self.engine.dispose()

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]  # then all that came meanwhile: one transaction
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(kind == "stop" for kind, _ in batch)
            self._write(batch)
            for kind, done in batch:
                if kind == "flush":
                    done.set()

    def _write(self, batch: Sequence[tuple[str, Any]]) -> None:
        """One transaction: the kept entries, then the hits' ``last_used``; then eviction."""
        entries: list[Entry] = [e for kind, items in batch if kind == "keep" for e in items]
        touched: dict[str, list[str]] = {}
        for kind, items in batch:
            if kind == "touch":
                touched.setdefault(items[0], []).extend(items[1])
        if not entries and not touched:
            return
        now = int(time.time())
        try:
            with self.engine.connect().execution_options(write=True) as connection:
                with connection.begin():
                    if entries:
                        _upsert(connection, _latest(entries), now, model=self.model)
                    for name, keys in touched.items():
                        _touch(connection, translation_memory.c[name], keys, now)
                self._inserted += len(entries)
                if self._inserted and time.monotonic() - self._checked >= EVICT_CHECK_S:
                    self._evict(connection)
        except sa.exc.SQLAlchemyError as error:
            logger.warning("translation memory write failed (dropped): %s", _said(error))
        with self._lock:  # written (or dropped): the database answers for them now
            for kept in entries:
                if self._unwritten.get(kept.key) is kept:
                    del self._unwritten[kept.key]

    def _evict(self, connection: Connection) -> None:
        """Past ``max_rows``: the least recently used rows go, down to 95 % of the bound."""
        self._checked, self._inserted = time.monotonic(), 0
        table = translation_memory
        with connection.begin():
            count = connection.execute(sa.select(sa.func.count()).select_from(table)).scalar()
            excess = int(count or 0) - self.max_rows
            if excess <= 0:
                return
            excess += int(self.max_rows * EVICT_SHARE)
            oldest = sa.select(table.c.key).order_by(table.c.last_used).limit(excess)
            gone = connection.execute(sa.delete(table).where(table.c.key.in_(oldest))).rowcount
        self.tally(evictions=max(0, gone or 0))
        logger.info("translation memory: %d least recently used rows evicted", gone)


def _found(row: Sequence[Any]) -> Found:
    ids = tuple(int(i) for i in str(row[2]).split(",") if i)
    return Found(str(row[1]), ids, str(row[3]), int(row[4]), str(row[5]), row[6])


def _latest(entries: Sequence[Entry]) -> list[Entry]:
    """One entry per key, the last one kept (one statement cannot write a key twice)."""
    return list({entry.key: entry for entry in entries}.values())


def _upsert(connection: Connection, entries: Sequence[Entry], now: int, *, model: str) -> None:
    rows = [
        {
            "key": e.key,
            "plain_key": e.plain_key,
            "namespace": e.namespace,
            "model": model,
            "text": e.text,
            "token_ids": ",".join(map(str, e.token_ids)),
            "finish_reason": e.finish_reason,
            "prompt_tokens": e.prompt_tokens,
            "template": e.template,
            "target_language": e.target_language,
            "last_used": now,
        }
        for e in entries
    ]
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(translation_memory)
    replaced = {name: statement.excluded[name] for name in (*_VALUES, "plain_key", "last_used")}
    connection.execute(statement.on_conflict_do_update(index_elements=["key"], set_=replaced), rows)


def _touch(connection: Connection, column: sa.Column[Any], keys: Sequence[str], now: int) -> None:
    """``last_used`` of the rows hit, unless already this recent (a hot row is not rewritten
    at every hit)."""
    table = translation_memory
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), CHUNK):
        connection.execute(
            sa.update(table)
            .where(column.in_(unique[start : start + CHUNK]), table.c.last_used < now - 60)
            .values(last_used=now)
        )


def _said(error: BaseException) -> str:
    """An error's types only: a database error's message can quote the statement's values,
    which hold user text (the whole message goes to DEBUG)."""
    logger.debug("translation memory error: %s", error)
    cause = getattr(error, "orig", None)
    return type(error).__name__ + (f" ({type(cause).__name__})" if cause is not None else "")
