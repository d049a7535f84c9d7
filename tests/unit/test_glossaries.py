"""Stored glossaries (hymt_serve.web.glossaries, glossary_entries): the migration and the Core
tables agree, the store on SQLite and on a real PostgreSQL server (the ``url`` fixture of
test_database), DeepL's entry rules, and resolving a ``glossary_id`` into the handler's
inline ``glossary``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from test_database import url  # noqa: F401  (the fixture: SQLite and PostgreSQL)

from hymt_serve.web import database, glossaries
from hymt_serve.web.glossaries import GlossaryStore, for_texts, language_pairs, with_glossary
from hymt_serve.web.glossary_entries import (
    MAX_ENTRIES_BYTES,
    MAX_TERM_BYTES,
    GlossaryError,
    glossary_language,
    parse_entries,
    to_tsv,
)

TABLES = (glossaries.glossaries, glossaries.glossary_entries)


@pytest.fixture
def store(tmp_path: Path) -> GlossaryStore:
    engine = database.connect(f"sqlite:///{tmp_path / 'g.db'}")
    database.upgrade(engine)
    return GlossaryStore(engine)


def _alembic(engine: sa.Engine, action: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(database.MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)


def test_the_migration_makes_the_core_tables_and_goes_down_again(url: str) -> None:  # noqa: F811
    engine = database.connect(url)
    database.upgrade(engine)
    inspector = sa.inspect(engine)
    for table in TABLES:
        columns = {c["name"]: c for c in inspector.get_columns(table.name)}
        assert set(columns) == {c.name for c in table.columns}, table.name
        for column in table.columns:  # the same nullability and primary key
            assert columns[column.name]["nullable"] == column.nullable, column.name
        keys = inspector.get_pk_constraint(table.name)["constrained_columns"]
        assert keys == [c.name for c in table.primary_key.columns]
    assert [i["name"] for i in inspector.get_indexes("glossaries")] == ["ix_glossaries_owner"]
    [foreign] = inspector.get_foreign_keys("glossary_entries")
    assert foreign["referred_table"] == "glossaries"
    _alembic(engine, "downgrade", "0002")
    assert not {"glossaries", "glossary_entries"} & set(sa.inspect(engine).get_table_names())
    database.upgrade(engine)
    assert "glossary_entries" in sa.inspect(engine).get_table_names()
    engine.dispose()


def test_the_store_keeps_each_owners_glossaries_apart(url: str) -> None:  # noqa: F811
    engine = database.connect(url)
    database.upgrade(engine)
    store = GlossaryStore(engine)
    pairs = [("Hunyuan", "混元"), ("engine", "Motor"), ("ünï", "ü")]
    made = store.create("alice", "Produkt", "en", "de", pairs)
    other = store.create("alice", "Zwei", "en", "fr", [("a", "b")])
    assert made.entry_count == 3 and made.creation_time.tzinfo is not None
    assert store.listing("alice") == [made, other]  # as stored, times to the millisecond
    assert store.get("alice", made.glossary_id) == made
    assert store.entries("alice", made.glossary_id) == (made, tuple(pairs))
    assert store.entries("alice", made.glossary_id) == (made, tuple(pairs))  # from memory
    # Another key sees nothing of alice's, and cannot delete it.
    assert store.listing("bob") == [] and store.get("bob", made.glossary_id) is None
    assert store.entries("bob", made.glossary_id) is None
    assert not store.delete("bob", made.glossary_id)
    assert store.delete("alice", made.glossary_id)
    assert store.get("alice", made.glossary_id) is None
    assert store.entries("alice", made.glossary_id) is None  # the cached entries go too
    with engine.connect() as connection:
        left = connection.execute(sa.select(glossaries.glossary_entries.c.glossary_id)).all()
    assert {row.glossary_id for row in left} == {other.glossary_id}
    assert not store.delete("alice", made.glossary_id)
    engine.dispose()


def test_a_key_keeps_a_bounded_number_of_glossaries(
    store: GlossaryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(glossaries, "MAX_GLOSSARIES", 2)
    for name in ("a", "b"):
        store.create("alice", name, "en", "de", [("x", "y")])
    with pytest.raises(GlossaryError, match="Too many glossaries") as refused:
        store.create("alice", "c", "en", "de", [("x", "y")])
    assert refused.value.status == 400 and len(store.listing("alice")) == 2
    store.create("bob", "c", "en", "de", [("x", "y")])  # per key


def test_the_cache_keeps_the_most_recent_within_its_budget(
    store: GlossaryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(glossaries, "CACHE_ENTRIES", 3)
    first = store.create("alice", "1", "en", "de", [("a", "b"), ("c", "d")])
    second = store.create("alice", "2", "en", "de", [("e", "f"), ("g", "h")])
    store.entries("alice", first.glossary_id)
    store.entries("alice", second.glossary_id)  # 4 entries > 3: the first one goes
    assert list(store._cache) == [second.glossary_id] and store._cached == 2


@pytest.mark.parametrize(
    ("entries", "entries_format", "pairs"),
    [("Hello\tHallo\n\n  Bye \t Tschüss \r\nA\tB", "tsv",
      [("Hello", "Hallo"), ("Bye", "Tschüss"), ("A", "B")]),
     ('"a, b",c\n"say ""hi""",sag\n', "csv", [("a, b", "c"), ('say "hi"', "sag")]),
     ("x,y,en,de\nz,w,EN,FR\nu,v,EN-US,DE\n", "csv", [("x", "y"), ("u", "v")]),
     ([["a", "b"], {"source": "c", "target": "d"}], "tsv", [("a", "b"), ("c", "d")])],
)  # fmt: skip
def test_entry_formats(entries: Any, entries_format: str, pairs: list[tuple[str, str]]) -> None:
    assert parse_entries(entries, entries_format, ("en", "de")) == pairs


@pytest.mark.parametrize(
    ("entries", "entries_format", "status", "detail"),
    [("a\tb\na\tc", "tsv", 400, "entry 2 duplicates the source term of entry 1"),
     ("a\tb\tc", "tsv", 400, "line 1 has more than one tab"),
     ("\n\nab", "tsv", 400, "line 3 has no tab"),
     ("a\t", "tsv", 400, "entry 1: its target is empty"),
     ('"a\tb",c', "csv", 400, "its source holds the control character U+0009"),
     ('"a\nb",c', "csv", 400, "U+000A"),
     ("a\u2028b\tc", "tsv", 400, "U+2028"),
     ("a,b,c", "csv", 400, "row 1 has 3 fields"),
     ('"a,b', "csv", 400, "the CSV cannot be read"),
     ("\n \n", "tsv", 400, "no entries"),
     ("x" * (MAX_TERM_BYTES + 1) + "\ty", "tsv", 400, f"more than {MAX_TERM_BYTES} UTF-8 bytes"),
     ("a\tb\n" * (MAX_ENTRIES_BYTES // 4 + 1), "tsv", 413, "bytes of entries"),
     ([["a"]], "tsv", 400, "entry 1 must be [source, target]"),
     ("a\tb", "xml", 400, None),
     (7, "tsv", 400, None)],
)  # fmt: skip
def test_entries_are_checked_as_deepl_checks_them(
    entries: Any, entries_format: str, status: int, detail: str | None
) -> None:
    with pytest.raises(GlossaryError) as refused:
        parse_entries(entries, entries_format, ("en", "de"))
    assert refused.value.status == status
    if detail is not None:
        assert detail in str(refused.value.detail)
    assert set(refused.value.deepl_body()) <= {"message", "detail"}
    assert refused.value.api_body()["error_type"] in ("invalid_request", "payload_too_large")


def test_languages_fold_as_deepl_folds_them() -> None:
    assert [glossary_language(c) for c in ("EN-US", "zh-Hant", "ZH-HANS", "pt-br", "yue")] == [
        "en", "zh", "zh", "pt", "yue",
    ]  # fmt: skip
    assert glossary_language("auto") is None and glossary_language("xx") is None
    pairs = language_pairs()
    assert {"source_lang": "en", "target_lang": "zh"} in pairs and len(pairs) == 37 * 36
    assert all(p["source_lang"] != p["target_lang"] for p in pairs)
    assert to_tsv([("a", "b"), ("c", "d")]) == "a\tb\nc\td"


def test_for_texts_sends_the_terms_that_occur() -> None:
    pairs = [("Hunyuan", "混元"), ("GPU", "显卡"), ("model", "模型")]
    assert for_texts(pairs, ["The hunyuan MODEL", "x"]) == [
        {"source": "Hunyuan", "target": "混元"}, {"source": "model", "target": "模型"},
    ]  # fmt: skip
    # None occurs: the first goes, so the handler still checks the family has glossaries.
    assert for_texts(pairs, ["nothing"]) == [{"source": "Hunyuan", "target": "混元"}]
    assert len(for_texts(pairs, None)) == 3  # an Office document: its text is not read here
    assert for_texts(pairs, ["GPU\nmodel"]) == for_texts(pairs, ["GPU", "model"])


def test_with_glossary_resolves_an_id_of_its_owner_for_its_language_pair(
    store: GlossaryStore,
) -> None:
    made = store.create("alice", "g", "en", "zh", [("Hunyuan", "混元"), ("GPU", "显卡")])
    body = {"text": "Hunyuan runs", "source_lang": "en", "target_lang": "zh-Hant"}

    def resolve(fields: dict[str, Any], owner: str = "alice") -> dict[str, Any]:
        return asyncio.run(with_glossary(fields, owner, store))

    assert resolve(body) is body  # no glossary_id: unchanged
    resolved = resolve({**body, "glossary_id": made.glossary_id})
    assert resolved == {**body, "glossary": [{"source": "Hunyuan", "target": "混元"}]}
    document = {"document": "GPU", "format": "markdown", "src_lang": "EN", "tgt_lang": "zh"}
    assert resolve({**document, "glossary_id": made.glossary_id})["glossary"][0]["source"] == "GPU"
    refusals = [
        ({**body, "glossary_id": made.glossary_id}, "bob", 404, "Glossary not found"),
        ({**body, "glossary_id": "nope"}, "alice", 404, "Glossary not found"),
        ({**body, "glossary_id": made.glossary_id, "target_lang": "fr"}, "alice", 400,
         "language pair does not match"),
        ({**body, "glossary_id": made.glossary_id, "source_lang": "auto"}, "alice", 400,
         "requires the source_lang"),
        ({"text": "a", "target_lang": "zh", "glossary_id": made.glossary_id}, "alice", 400,
         "requires the source_lang"),
        ({**body, "glossary_id": made.glossary_id, "target_lang": "xx"}, "alice", 400,
         "'target_lang' not supported"),
        ({**body, "glossary_id": made.glossary_id, "glossary": []}, "alice", 400, "not both"),
        ({**body, "glossary_id": 3}, "alice", 400, "'glossary_id' not supported"),
    ]  # fmt: skip
    for fields, owner, status, message in refusals:
        with pytest.raises(GlossaryError, match=message) as refused:
            resolve(fields, owner)
        assert refused.value.status == status
    with pytest.raises(GlossaryError, match="keeps no glossaries"):
        asyncio.run(with_glossary({**body, "glossary_id": "x"}, "alice", None))
