"""Client keys in the database: the key file's import, usage written as increments, and the
keys ``hymt keys`` adds, lists and takes out.

Every method is one transaction and blocks: :class:`.keys.ClientKeys` calls them at start and
from its worker thread, the commands directly; never the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.web import key_file
from hymt_serve.web.database import client_keys, lock
from hymt_serve.web.key_file import USAGE_FILE, ClientKey

log = logging.getLogger(__name__)
IMPORTED_SUFFIX = ".imported"  # web_usage.json is renamed so once it is in the database

FROM_FILE = "file"
FROM_COMMAND = "command"


@dataclass(frozen=True)
class StoredKey:
    """One row of the keys table, for ``hymt keys list``."""

    key: ClientKey
    used: int
    active: bool
    source: str


@dataclass(frozen=True)
class Snapshot:
    """The active keys in the order they were added, and every key's usage by name."""

    keys: list[ClientKey]
    used: dict[str, int]


class KeyStore:
    """The client keys of one database (an engine whose schema is at the newest revision)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def read(self) -> Snapshot:
        with self.engine.begin() as connection:
            return _snapshot(connection)

    def add_and_read(self, counted: Mapping[str, int]) -> Snapshot:
        """Add ``counted`` (characters per key name, negative for refunds) to each key's usage
        as ``used = used + n`` (never below 0), then read every key back, in one transaction:
        what other replicas added meanwhile is kept, and the read includes it."""
        table = client_keys
        added = table.c.used + sa.bindparam("n", type_=sa.BigInteger)
        statement = (
            sa.update(table)
            .where(table.c.name == sa.bindparam("key_name"))
            .values(used=sa.case((added < 0, 0), else_=added))
        )
        rows = [{"key_name": name, "n": n} for name, n in counted.items() if n]
        with self.engine.begin() as connection:
            if rows:
                connection.execute(statement, rows)
            return _snapshot(connection)

    def import_file(self, path: Path, character_limit: int, create: bool = True) -> None:
        """Make the database's file keys those of the key file ``path``: new names added (with
        their usage from a former release's ``web_usage.json``, imported once), changed keys and
        limits taken, names no longer there deactivated (their usage kept). When ``path`` does
        not exist and the database has no active key, ``path`` is created with one (unless not
        ``create``). Idempotent;
        on PostgreSQL one replica at a time (the migration lock)."""
        usage_path = path.with_name(USAGE_FILE)
        with self.engine.begin() as connection:
            lock(connection)
            rows = {row.name: row for row in connection.execute(sa.select(client_keys))}
            if not path.exists():
                if not create or any(row.active for row in rows.values()):
                    return
                key_file.create(path, character_limit)
            declared = key_file.read_keys(path)
            _declare(connection, declared, rows, key_file.read_usage(usage_path))
        if usage_path.exists():
            try:
                usage_path.replace(usage_path.with_name(USAGE_FILE + IMPORTED_SUFFIX))
            except OSError as error:  # a read-only folder: harmless, it is read only for new names
                log.warning("could not rename %s after its import: %s", usage_path, error)

    def add(self, name: str, character_limit: int) -> ClientKey:
        """A new random key named ``name``; ConfigurationError when the name is taken."""
        key = ClientKey(name, key_file.new_key(), character_limit)
        key_file.check([key], "hymt keys add")
        with self.engine.begin() as connection:
            taken = connection.execute(
                sa.select(client_keys.c.id).where(client_keys.c.name == name)
            ).first()
            if taken is not None:
                raise ConfigurationError(f"a key named {name!r} exists already")
            connection.execute(sa.insert(client_keys).values(**_values(key, FROM_COMMAND)))
        return key

    def deactivate(self, name: str) -> bool:
        """Refuse the key ``name`` from now on (its usage kept); False when there is none."""
        with self.engine.begin() as connection:
            done = connection.execute(
                sa.update(client_keys).where(client_keys.c.name == name).values(active=False)
            )
            return bool(done.rowcount)

    def listing(self) -> list[StoredKey]:
        with self.engine.begin() as connection:
            rows = connection.execute(sa.select(client_keys).order_by(client_keys.c.id))
            return [StoredKey(_key(row), int(row.used), row.active, row.source) for row in rows]


def _declare(
    connection: Connection,
    declared: list[ClientKey],
    rows: dict[str, Row[tuple[object, ...]]],
    usage: dict[str, int],
) -> None:
    table = client_keys
    for key in declared:
        if key.name in rows:
            connection.execute(
                sa.update(table)
                .where(table.c.name == key.name)
                .values(key=key.key, character_limit=key.character_limit, active=True)
                .values(source=FROM_FILE)
            )
        else:
            values = _values(key, FROM_FILE) | {"used": max(0, usage.get(key.name, 0))}
            connection.execute(sa.insert(table).values(**values))
    names = {key.name for key in declared}
    gone = [n for n, row in rows.items() if row.source == FROM_FILE and n not in names]
    if gone:
        connection.execute(sa.update(table).where(table.c.name.in_(gone)).values(active=False))


def _values(key: ClientKey, source: str) -> dict[str, object]:
    return {
        "name": key.name,
        "key": key.key,
        "character_limit": key.character_limit,
        "source": source,
    }


def _key(row: Row[tuple[object, ...]]) -> ClientKey:
    return ClientKey(str(row.name), str(row.key), int(row.character_limit))


def _snapshot(connection: Connection) -> Snapshot:
    rows = connection.execute(sa.select(client_keys).order_by(client_keys.c.id)).all()
    return Snapshot(
        [_key(row) for row in rows if row.active],
        {str(row.name): int(row.used) for row in rows},
    )
