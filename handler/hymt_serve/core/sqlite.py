"""A SQLite engine as the front end's database and the worker's translation memory both open
it (one file, several processes: WAL, a busy timeout, transactions opened by SQLAlchemy)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

BUSY_TIMEOUT_MS = 10_000  # how long a writer waits for another process's write lock


def sqlite_engine(url: URL) -> Engine:
    """An engine for the SQLite ``url``; its file (and folder) created first, mode 0600 (the
    front end keeps its client keys in it). The caller adds a ``begin`` listener: Python's
    sqlite3 is told to open no transaction itself."""
    if url.database and url.database != ":memory:":
        path = Path(url.database)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: object) -> None:
        # Python's sqlite3 opens transactions itself, only before DML: DDL would commit as it
        # goes. It is told to open none, and the caller's "begin" opens each one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # WAL: readers never wait for the writer; NORMAL sync survives a crash of the process
        # (not of the machine) and costs a commit much less than FULL.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.close()

    return engine
