"""Stored glossaries: DeepL's glossary objects (API v2) and ours, kept in the front end's
database, each visible only to the client key that made it (docs/glossaries.md).

A glossary is immutable once made (as DeepL's v2 ones): a name, one language pair, its
entries. A translation names it by ``glossary_id``; :func:`with_glossary` turns that into the
handler's inline ``glossary`` field (the term pairs whose source term occurs in the texts), so
the families with terminology prompts use it and the others refuse it with the handler's own
400. Language codes are the request API's, with ``zh-Hant`` folded into ``zh`` as DeepL folds
its Chinese variants: one glossary serves either script (and ``EN-US``/``EN-GB``, ``PT-BR``/
``PT-PT`` are ``en`` and ``pt``).

:class:`GlossaryStore`'s methods block (a transaction each): callers run them on a worker
thread (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, Row
from starlette.requests import Request

from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.office import OFFICE_FORMATS
from hymt_serve.request.prompts import relevant_terms
from hymt_serve.web.access import bearer_key, client_key
from hymt_serve.web.database import metadata
from hymt_serve.web.glossary_entries import (
    MAX_TERM_BYTES,
    GlossaryError,
    Pair,
    glossary_language,
)
from hymt_serve.web.keys import ClientKeys

MAX_GLOSSARIES = 1000  # per client key (DeepL's per account)
CACHE_ENTRIES = 500_000  # entries of the glossaries in use kept in memory (they never change)
NOT_FOUND = "Glossary not found"
# The owner of the glossaries the page's API makes without a key, where it is open (loopback):
# no key name is empty.
LOCAL_OWNER = ""
NEEDS_SOURCE = "Use of a glossary requires the source_lang parameter to be specified"

glossaries = sa.Table(
    "glossaries",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),  # a UUID, as DeepL's glossary_id
    sa.Column("owner", sa.String(200), nullable=False, index=True),  # the client key's name
    sa.Column("name", sa.String(MAX_TERM_BYTES), nullable=False),
    sa.Column("source_lang", sa.String(16), nullable=False),
    sa.Column("target_lang", sa.String(16), nullable=False),
    sa.Column("entry_count", sa.Integer, nullable=False),
    sa.Column("ready", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("creation_time", sa.DateTime(timezone=True), nullable=False),
)

glossary_entries = sa.Table(
    "glossary_entries",
    metadata,
    sa.Column(
        "glossary_id",
        sa.String(36),
        sa.ForeignKey("glossaries.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("position", sa.Integer, primary_key=True),  # the order they were given in
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
)


@dataclass(frozen=True)
class Glossary:
    """A glossary's description (DeepL's ``GlossaryInfo``), without its entries."""

    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    entry_count: int
    creation_time: datetime  # UTC, to the millisecond
    ready: bool = True

    def json(self) -> dict[str, Any]:
        """The object DeepL's v2 routes and ours answer."""
        stamp = self.creation_time.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return {
            "glossary_id": self.glossary_id,
            "name": self.name,
            "ready": self.ready,
            "source_lang": self.source_lang,
            "target_lang": self.target_lang,
            "creation_time": stamp,
            "entry_count": self.entry_count,
        }


def language_pairs() -> list[dict[str, str]]:
    """Every pair of two different glossary languages (DeepL's glossary-language-pairs)."""
    codes = [code for code in LANGUAGES if code != "zh-Hant"]
    return [{"source_lang": s, "target_lang": t} for s in codes for t in codes if s != t]


class GlossaryStore:
    """The glossaries of one database (an engine whose schema is at the newest revision)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._cache: OrderedDict[str, tuple[Pair, ...]] = OrderedDict()  # least recent first
        self._cached = 0  # entries in the cache
        self._lock = threading.Lock()

    def create(
        self, owner: str, name: str, source_lang: str, target_lang: str, pairs: Sequence[Pair]
    ) -> Glossary:
        """A new glossary of ``owner`` with ``pairs`` (checked by the caller); GlossaryError 400
        when ``owner`` has ``MAX_GLOSSARIES`` already."""
        now = datetime.now(UTC)
        glossary = Glossary(
            str(uuid.uuid4()),
            name,
            source_lang,
            target_lang,
            len(pairs),
            now.replace(microsecond=now.microsecond // 1000 * 1000),
        )
        rows = [
            {"glossary_id": glossary.glossary_id, "position": i, "source": s, "target": t}
            for i, (s, t) in enumerate(pairs)
        ]
        with self.engine.begin() as connection:
            count = connection.execute(
                sa.select(sa.func.count()).where(glossaries.c.owner == owner)
            ).scalar_one()
            if count >= MAX_GLOSSARIES:
                raise GlossaryError(
                    400,
                    "Too many glossaries",
                    f"a key keeps at most {MAX_GLOSSARIES}: delete one first",
                )
            connection.execute(sa.insert(glossaries).values(owner=owner, **_values(glossary)))
            connection.execute(sa.insert(glossary_entries), rows)
        return glossary

    def listing(self, owner: str) -> list[Glossary]:
        """``owner``'s glossaries, oldest first."""
        query = sa.select(glossaries).where(glossaries.c.owner == owner)
        with self.engine.begin() as connection:
            rows = connection.execute(query.order_by(glossaries.c.creation_time, glossaries.c.id))
            return [_glossary(row) for row in rows]

    def get(self, owner: str, glossary_id: str) -> Glossary | None:
        """The glossary, or None when there is none of ``owner`` with that id."""
        with self.engine.begin() as connection:
            return _find(connection, owner, glossary_id)

    def entries(self, owner: str, glossary_id: str) -> tuple[Glossary, tuple[Pair, ...]] | None:
        """The glossary and its entries in their order; None when ``owner`` has no such one.
        Entries come from memory once read (a glossary never changes; its owner and its
        existence are read from the database each time)."""
        with self.engine.begin() as connection:
            glossary = _find(connection, owner, glossary_id)
            if glossary is None:
                return None
            with self._lock:
                pairs = self._cache.get(glossary_id)
                if pairs is not None:
                    self._cache.move_to_end(glossary_id)
                    return glossary, pairs
            query = sa.select(glossary_entries.c.source, glossary_entries.c.target)
            query = query.where(glossary_entries.c.glossary_id == glossary_id)
            rows = connection.execute(query.order_by(glossary_entries.c.position))
            pairs = tuple((str(row.source), str(row.target)) for row in rows)
        self._keep(glossary_id, pairs)
        return glossary, pairs

    def delete(self, owner: str, glossary_id: str) -> bool:
        """Delete the glossary and its entries; False when ``owner`` has no such one."""
        with self.engine.begin() as connection:
            if _find(connection, owner, glossary_id) is None:
                return False
            # Entries first: SQLite enforces no foreign keys (no cascade) unless told to.
            connection.execute(
                sa.delete(glossary_entries).where(glossary_entries.c.glossary_id == glossary_id)
            )
            connection.execute(sa.delete(glossaries).where(glossaries.c.id == glossary_id))
        with self._lock:
            self._cached -= len(self._cache.pop(glossary_id, ()))
        return True

    def _keep(self, glossary_id: str, pairs: tuple[Pair, ...]) -> None:
        """Cache ``pairs``, dropping the least recently used past ``CACHE_ENTRIES``."""
        with self._lock:
            if glossary_id in self._cache or len(pairs) > CACHE_ENTRIES:
                return
            self._cache[glossary_id] = pairs
            self._cached += len(pairs)
            while self._cached > CACHE_ENTRIES:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= len(dropped)


_STORES: weakref.WeakKeyDictionary[ClientKeys, GlossaryStore] = weakref.WeakKeyDictionary()


def store_of(keys: ClientKeys) -> GlossaryStore:
    """The one store of ``keys``' database for every route of the app (they share its cache of
    entries)."""
    found = _STORES.get(keys)
    if found is None:
        found = _STORES[keys] = GlossaryStore(keys.store.engine)
    return found


async def with_glossary(
    body: dict[str, Any],
    owner: str,
    store: GlossaryStore | None,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``body`` (a request API body, or the DeepL route's fields with ``texts`` given apart)
    with its ``glossary_id`` resolved into the handler's ``glossary``: the entries of that
    glossary of ``owner`` whose source term occurs in the texts (``texts``, else ``body``'s
    ``text`` or plain-text ``document``; every entry when neither says: an Office document).
    ``body`` unchanged without a ``glossary_id``.

    GlossaryError: 400 without a named source language, for a glossary beside ``glossary``, a
    glossary whose language pair is not the request's, or no store (no client keys); 404 for no
    glossary of ``owner`` with that id. A family without terminology prompts refuses the result
    with the handler's 400 (at least one entry always goes, so that check always runs)."""
    if "glossary_id" not in body:
        return body
    fields = dict(body)
    glossary_id = fields.pop("glossary_id")
    if not isinstance(glossary_id, str) or not glossary_id:
        raise GlossaryError(400, "Value for 'glossary_id' not supported.", "a glossary's id")
    if "glossary" in fields:
        raise GlossaryError(400, "Give 'glossary' or 'glossary_id', not both")
    if store is None:
        raise GlossaryError(400, "This server keeps no glossaries (it has no client keys)")
    source = glossary_language(fields.get("source_lang", fields.get("src_lang")))
    if source is None:
        raise GlossaryError(400, NEEDS_SOURCE, "a language code, not auto")
    target = glossary_language(fields.get("target_lang", fields.get("tgt_lang")))
    if target is None:
        raise GlossaryError(400, "Value for 'target_lang' not supported.", "a language code")
    found = await asyncio.to_thread(store.entries, owner, glossary_id)
    if found is None:
        raise GlossaryError(404, NOT_FOUND)
    glossary, pairs = found
    if (glossary.source_lang, glossary.target_lang) != (source, target):
        raise GlossaryError(
            400,
            "The glossary's language pair does not match the request's",
            f"the glossary is {glossary.source_lang} to {glossary.target_lang}, "
            f"the request {source} to {target}",
        )
    seen = list(texts) if texts is not None else _texts_of(fields)
    fields["glossary"] = await asyncio.to_thread(for_texts, pairs, seen)
    return fields


def api_owner(request: Request, keys: ClientKeys | None) -> str:
    """Whose glossaries a call of our API (``/api/*``) sees: its client key's (the one
    :class:`.access.KeyCheck` found, or on loopback an ``Authorization: Bearer`` key of
    ``keys``), else ``LOCAL_OWNER`` where the API is open; GlossaryError 401 for a bearer key
    that is not one of ``keys``."""
    key = client_key(request) or (bearer_key(request, keys) if keys is not None else None)
    if key is not None:
        return key.name
    if request.headers.get("Authorization"):
        raise GlossaryError(401, "Authorization failure", "not a client key of this server")
    return LOCAL_OWNER


def for_texts(pairs: Sequence[Pair], texts: Sequence[str] | None) -> list[dict[str, str]]:
    """The handler's ``glossary`` for ``texts``: the pairs whose source term occurs in them
    (the handler puts into each prompt only those of its text, and takes a bounded number per
    request), all of them when the texts are unknown (None), else the first when none occurs:
    the prompts are then the plain ones, and the handler still checks its family has
    glossaries."""
    chosen = list(pairs)
    if texts is not None:
        # Terms hold no line break: joined texts never make a match across two of them.
        chosen = relevant_terms("\n".join(texts), pairs) or list(pairs[:1])
    return [{"source": source, "target": target} for source, target in chosen]


def pairs_of(glossary: list[dict[str, str]]) -> list[Pair]:
    """The term pairs of a handler's ``glossary`` field (as :func:`for_texts` makes it)."""
    return [(item["source"], item["target"]) for item in glossary]


def _texts_of(fields: dict[str, Any]) -> list[str] | None:
    """The texts of a request API body; None (unknown: every entry goes) for a document of an
    Office format (base64) or fields without their texts."""
    text, document = fields.get("text"), fields.get("document")
    if isinstance(text, str):
        return [text]
    if isinstance(text, list):
        return [item for item in text if isinstance(item, str)]
    if isinstance(document, str) and fields.get("format") not in OFFICE_FORMATS:
        return [document]
    return None


def _find(connection: sa.Connection, owner: str, glossary_id: str) -> Glossary | None:
    query = sa.select(glossaries).where(glossaries.c.id == glossary_id)
    row = connection.execute(query.where(glossaries.c.owner == owner)).first()
    return _glossary(row) if row is not None else None


def _values(glossary: Glossary) -> dict[str, Any]:
    return {
        "id": glossary.glossary_id,
        "name": glossary.name,
        "source_lang": glossary.source_lang,
        "target_lang": glossary.target_lang,
        "entry_count": glossary.entry_count,
        "ready": glossary.ready,
        "creation_time": glossary.creation_time,
    }


def _glossary(row: Row[Any]) -> Glossary:
    created: datetime = row.creation_time
    # SQLite keeps no time zone: what it gives back is the UTC time stored.
    created = created.replace(tzinfo=UTC) if created.tzinfo is None else created.astimezone(UTC)
    return Glossary(
        str(row.id),
        str(row.name),
        str(row.source_lang),
        str(row.target_lang),
        int(row.entry_count),
        created,
        bool(row.ready),
    )
