"""The front end's database: SQLite in the work folder by default, PostgreSQL for replicas.

One schema for both, written as SQLAlchemy Core tables here and created by Alembic's versioned
migrations (``migrations/versions/``): :func:`upgrade` brings a database to the newest
revision and runs at every ``hymt web`` start and in ``hymt db upgrade``. On PostgreSQL it holds
a transaction-scoped advisory lock, so replicas that start together migrate one after another;
PostgreSQL and SQLite both run DDL inside the transaction, so a migration that fails leaves
nothing half done.

Everything here blocks: callers run it before the event loop serves, or on a worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.sqlite import sqlite_engine

DATABASE_FILE = "hymt.db"
URL_VARIABLE = "HYMT_DATABASE_URL"
MIGRATIONS = Path(__file__).with_name("migrations")
# Any fixed number: the advisory lock that serialises migrations and key-file imports across
# replicas (PostgreSQL only; SQLite's own write lock does that there).
ADVISORY_LOCK = 0x68796D74  # "hymt"

metadata = sa.MetaData()

client_keys = sa.Table(
    "client_keys",
    metadata,
    # The order keys were added in (a key file's order): ClientKeys.keys keeps it.
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    sa.Column("key", sa.String(400), nullable=False),
    sa.Column("character_limit", sa.BigInteger, nullable=False),
    # Characters translated, added to by every replica with ``used = used + n``.
    sa.Column("used", sa.BigInteger, nullable=False, server_default="0"),
    # False for a key taken out of the key file: refused, its usage kept should it come back.
    sa.Column("active", sa.Boolean, nullable=False, server_default=sa.true()),
    # "file": declared in the key file (the file decides it); "command": made by hymt keys add.
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)


def default_url(folder: Path) -> str:
    """``$HYMT_DATABASE_URL`` when set, else the SQLite file ``hymt.db`` in ``folder``."""
    return os.environ.get(URL_VARIABLE) or f"sqlite:///{folder.resolve() / DATABASE_FILE}"


def shown(url: str | URL) -> str:
    """``url`` fit for a log line or a message: its password hidden."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<an unreadable database URL>"


def connect(url: str) -> Engine:
    """An engine for ``url`` (``sqlite:///path`` or ``postgresql+psycopg://...``); a SQLite
    file is created mode 0600 (it holds the client keys). ConfigurationError for a URL that
    names no database SQLAlchemy knows or whose driver is missing."""
    try:
        parsed = sa.make_url(url)
        if parsed.get_backend_name() == "sqlite":
            return _sqlite(parsed)
        # A small pool: one worker thread writes usage, the commands run once.
        return sa.create_engine(parsed, pool_size=2, max_overflow=2, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError, ImportError) as error:
        raise ConfigurationError(f"database URL {shown(url)}: {error}") from error


def upgrade(engine: Engine) -> None:
    """Bring the database to the newest schema revision (nothing to do when it is)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        lock(connection)
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def revision(engine: Engine) -> str | None:
    """The schema revision the database is at; None before the first migration."""
    with engine.connect() as connection:
        if not sa.inspect(connection).has_table("alembic_version"):
            return None
        found = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        return str(found) if found is not None else None


def lock(connection: Connection) -> None:
    """On PostgreSQL, hold the migration lock until ``connection``'s transaction ends."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": ADVISORY_LOCK})


def _sqlite(url: URL) -> Engine:
    engine = sqlite_engine(url)

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # IMMEDIATE takes the write lock at once (waiting up to the busy timeout): a
        # transaction that reads and then writes never fails on a lock another process took
        # between the two, as a deferred one can.
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
