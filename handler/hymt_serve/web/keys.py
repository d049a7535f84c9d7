"""The front end's own client keys (LibreTranslate, DeepL, KServe v2, OpenAI and, with keys
required, the page's API), their character limits and usage, kept in the database.

Never the TorchServe keys: a client gets a key of the front end, and the front end calls
TorchServe with its own inference key. Keys are declared in the key file (``web_keys.json``,
imported at each start: :mod:`.key_file`, :mod:`.key_store`) or made by ``hymt keys add``.

Each key has a character limit: the characters of the texts it had translated (as DeepL counts
them) are counted per key name, and a request that would pass the limit is refused whole.
Counting happens in memory, under a lock, with no I/O (the event loop's cost per request: a few
dictionary operations). A worker thread, every ``SAVE_EVERY_S``, adds what was counted since
its last turn to the database in one transaction of ``used = used + n`` increments and reads
every key back in the same transaction, so replicas on one database add up exactly, and each
sees the others' counts and keys within two turns (1 s) plus a transaction's time. A key may
so pass its limit by what other replicas counted in that window. A crash loses at most one
turn's counts; a database that cannot be reached keeps them in memory until it can.
"""

from __future__ import annotations

import hmac
import logging
import threading
import weakref
from collections import Counter
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from hymt_serve.web import database
from hymt_serve.web.key_file import DEFAULT_CHARACTER_LIMIT, KEYS_FILE, USAGE_FILE, ClientKey
from hymt_serve.web.key_store import KeyStore, Snapshot

__all__ = [
    "DEFAULT_CHARACTER_LIMIT",
    "KEYS_FILE",
    "SAVE_EVERY_S",
    "USAGE_FILE",
    "ClientKey",
    "ClientKeys",
    "bearer",
]

log = logging.getLogger(__name__)
SAVE_EVERY_S = 0.5


class ClientKeys:
    """The active client keys of one database, with their usage; one per front end process."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        snapshot = store.read()
        self.keys: list[ClientKey] = snapshot.keys  # replaced whole, never changed in place
        self._stored: dict[str, int] = snapshot.used  # as the database had it at the last turn
        self._sending: Counter[str] = Counter()  # taken by the turn in progress
        self._pending: Counter[str] = Counter()  # counted since
        self._stop = threading.Event()
        # The thread holds the keys weakly: keys dropped without close() stop their thread.
        self._thread = threading.Thread(
            target=_turns, args=(weakref.ref(self), self._stop), name="client-key-usage"
        )
        self._thread.daemon = True
        self._thread.start()

    @classmethod
    def open(
        cls,
        path: Path,
        character_limit: int = DEFAULT_CHARACTER_LIMIT,
        database_url: str | None = None,
    ) -> ClientKeys:
        """The keys of the database at ``database_url`` (default: ``hymt.db`` beside ``path``),
        migrated to the newest schema, with the key file ``path`` imported (created with one
        key of ``character_limit`` when neither it nor the database has a key)."""
        engine = database.connect(database_url or f"sqlite:///{path.parent / 'hymt.db'}")
        database.upgrade(engine)
        store = KeyStore(engine)
        store.import_file(path, character_limit)
        return cls(store)

    def find(self, offered: str | None) -> ClientKey | None:
        """The key ``offered`` is, compared in constant time; None for no key or a wrong one."""
        if not offered:
            return None
        found = None
        for key in self.keys:
            if hmac.compare_digest(key.key.encode(), offered.encode()):
                found = key
        return found

    def used(self, key: ClientKey) -> int:
        with self._lock:
            return self._used(key.name)

    def reserve(self, key: ClientKey, characters: int) -> bool:
        """Count ``characters`` against ``key``; False (and nothing counted) past its limit."""
        with self._lock:
            if self._used(key.name) + characters > key.character_limit:
                return False
            self._pending[key.name] += characters
            return True

    def refund(self, key: ClientKey, characters: int) -> None:
        """Give back what :meth:`reserve` counted for a request that failed."""
        with self._lock:
            self._pending[key.name] -= min(characters, self._used(key.name))

    def sync(self) -> None:
        """One turn: write what was counted, read every key back (blocks: a worker thread's)."""
        with self._lock:
            self._sending, self._pending = self._pending, Counter()
            sending = dict(self._sending)
        try:
            snapshot = self.store.add_and_read(sending)
        except SQLAlchemyError as error:
            with self._lock:  # kept for the next turn
                self._pending.update(self._sending)
                self._sending = Counter()
            log.warning("client key usage not written (kept for the next try): %s", error)
            return
        self._take(snapshot)

    def close(self) -> None:
        """Stop the turns and write what is counted (blocks: the front end's shutdown calls it
        on a worker thread)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self.sync()
        self.store.engine.dispose()

    def _take(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._stored = snapshot.used
            self._sending = Counter()
            self.keys = snapshot.keys

    def _used(self, name: str) -> int:
        """(lock held)"""
        return self._stored.get(name, 0) + self._sending[name] + self._pending[name]


def _turns(owner: weakref.ref[ClientKeys], stop: threading.Event) -> None:
    while not stop.wait(SAVE_EVERY_S):
        keys = owner()
        if keys is None:
            return
        keys.sync()
        del keys  # no strong reference while waiting


def bearer(header: str) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; None for another scheme."""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None
