"""``hymt db`` and ``hymt keys``: the front end's database and its client keys from the shell.

Each command brings the database to the newest schema and imports the key file first, as
``hymt web`` does at its start, so it sees what a front end would. A key added or taken out
here reaches running front ends within a second (their worker thread reads the keys back).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hymt_serve.core.errors import ConfigurationError

if TYPE_CHECKING:
    from hymt_serve.web.key_store import KeyStore

DATABASE_HELP = (
    "the front end's database: sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST/DB "
    "(default: $HYMT_DATABASE_URL, else WORKDIR/hymt.db)"
)
KEYS_HELP = "the key file imported at start (default: WORKDIR/web_keys.json)"


def add_database_options(parser: argparse.ArgumentParser) -> None:
    """--database-url and --client-keys, shared by hymt web, db and keys."""
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--client-keys", type=Path, help=KEYS_HELP)


def add_parsers(sub: Any, workdir_help: str) -> None:
    """``hymt db upgrade`` and ``hymt keys list|add|remove`` on the subcommands ``sub``."""
    db = sub.add_parser("db", help="the web front end's database: bring it to the newest schema")
    db_sub = db.add_subparsers(dest="action", required=True)
    upgrade = db_sub.add_parser("upgrade", help="migrate and import the key file (hymt web does)")
    keys = sub.add_parser("keys", help="the web front end's client keys: list, add, remove")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    listing = keys_sub.add_parser("list", help="names, sources, usage and limits")
    listing.add_argument("--show-keys", action="store_true", help="print the keys themselves")
    add = keys_sub.add_parser("add", help="make a new random key and print it")
    add.add_argument("name")
    add.add_argument("--character-limit", type=int, default=1_000_000)
    remove = keys_sub.add_parser("remove", help="refuse a key from now on (its usage kept)")
    remove.add_argument("name")
    for command, func in (
        (upgrade, cmd_db_upgrade),
        (listing, cmd_keys_list),
        (add, cmd_keys_add),
        (remove, cmd_keys_remove),
    ):
        command.add_argument("--workdir", type=Path, default=Path("run"), help=workdir_help)
        add_database_options(command)
        command.set_defaults(func=func)


def database_url(args: argparse.Namespace) -> str:
    from hymt_serve.web.database import default_url  # SQLAlchemy: only for these commands

    return str(args.database_url or default_url(args.workdir))


def key_file(args: argparse.Namespace) -> Path:
    from hymt_serve.web.key_file import KEYS_FILE  # the web package: only for these commands

    return Path(args.client_keys or args.workdir / KEYS_FILE)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from hymt_serve.web.database import revision, shown  # SQLAlchemy: only for these commands

    store = _store(args)
    if store is None:
        return 1
    print(f"{shown(database_url(args))}: schema at revision {revision(store.engine)}")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    store = _store(args)
    if store is None:
        return 1
    for row in store.listing():
        state = "active" if row.active else "removed"
        line = f"{row.key.name}\t{row.source}\t{state}\t{row.used}/{row.key.character_limit}"
        print(f"{line}\t{row.key.key}" if args.show_keys else line)
    return 0


def cmd_keys_add(args: argparse.Namespace) -> int:
    store = _store(args)
    if store is None:
        return 1
    try:
        key = store.add(args.name, args.character_limit)
    except ConfigurationError as error:
        print(f"hymt keys add: {error}", file=sys.stderr)
        return 1
    print(key.key)
    return 0


def cmd_keys_remove(args: argparse.Namespace) -> int:
    from hymt_serve.web.key_store import FROM_FILE  # SQLAlchemy: only for these commands

    store = _store(args)
    if store is None:
        return 1
    rows = {row.key.name: row for row in store.listing()}
    if args.name not in rows or not store.deactivate(args.name):
        print(f"hymt keys remove: no key named {args.name!r}", file=sys.stderr)
        return 1
    if rows[args.name].source == FROM_FILE:
        print(f"{args.name} is in {key_file(args)}: take it out there too, or it comes back")
    return 0


def _store(args: argparse.Namespace) -> KeyStore | None:
    """The migrated database's key store with the key file imported; None (and a message)
    for a bad URL, an unreachable database or a bad key file."""
    # SQLAlchemy and the web package load only for these commands
    from sqlalchemy.exc import SQLAlchemyError

    from hymt_serve.web import database  # (the same)
    from hymt_serve.web.key_store import KeyStore

    url = database_url(args)
    try:
        engine = database.connect(url)
        database.upgrade(engine)
        store = KeyStore(engine)
        store.import_file(key_file(args), 0, create=False)
    except (ConfigurationError, SQLAlchemyError) as error:
        print(f"hymt {args.command}: {database.shown(url)}: {error}", file=sys.stderr)
        return None
    return store
