"""The translation memory's store on SQLite and PostgreSQL (test_database's ``url``): the
table the migration makes is the worker's, lookups and writes, least recently used eviction,
the model marker; and what the keys are made of."""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from test_database import NEWEST, url  # noqa: F401 (the fixture: SQLite and PostgreSQL)

from hymt_serve.core.types import GenerationRow, SamplingParams
from hymt_serve.request import memory as store
from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.memory_key import (
    Choice,
    check_choice,
    marker_key,
    model_identity,
    row_key,
    take_choice,
    uses_memory,
)
from hymt_serve.web import database

MIGRATION = database.MIGRATIONS / "versions" / "0002_translation_memory.py"


def entry(key: str, text: str = "out", plain: str | None = None) -> store.Entry:
    return store.Entry(key, plain, "", text, (5, 6), "stop", 9, "en", "ok")


def columns(engine: sa.Engine) -> dict[str, tuple[str, bool]]:
    found = sa.inspect(engine).get_columns("translation_memory")
    return {c["name"]: (type(c["type"]).__name__, bool(c["nullable"])) for c in found}


def indexes(engine: sa.Engine) -> set[tuple[str, tuple[str, ...]]]:
    found = sa.inspect(engine).get_indexes("translation_memory")
    return {(str(i["name"]), tuple(str(c) for c in i["column_names"])) for i in found}


def run_migration(engine: sa.Engine, step: str) -> None:
    """Revision 0002's ``upgrade`` or ``downgrade`` alone, as Alembic would run it."""
    spec = importlib.util.spec_from_file_location("revision_0002", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with engine.begin() as connection, Operations.context(MigrationContext.configure(connection)):
        getattr(module, step)()


def test_the_migration_and_the_workers_table_agree(url: str) -> None:  # noqa: F811
    engine = store.connect(url)
    store.create_table(engine)  # a worker that starts before the front end ever migrated
    made = columns(engine), indexes(engine)
    assert set(made[0]) == {c.name for c in store.translation_memory.columns}
    assert store.ADVISORY_LOCK == database.ADVISORY_LOCK  # one lock for both creators
    migrated = database.connect(url)
    database.upgrade(migrated)  # from empty: 0002 finds the table and leaves it
    assert database.revision(migrated) == NEWEST and columns(migrated) == made[0]
    with migrated.begin() as connection:
        connection.execute(sa.text("DROP TABLE translation_memory"))
    run_migration(migrated, "upgrade")  # the migration's own table: the same
    assert (columns(migrated), indexes(migrated)) == made
    run_migration(migrated, "downgrade")
    assert not sa.inspect(migrated).has_table("translation_memory")
    engine.dispose()
    migrated.dispose()


def test_keep_recall_touch_and_the_model_marker(url: str) -> None:  # noqa: F811
    memory = store.TranslationMemory.open(url, "model-a", 100)
    memory.keep([entry("k1", "eins", plain="p1"), entry("k2", "zwei")])
    memory.keep([entry("k1", "eins!", plain="p1")])  # a newer one replaces it
    memory.flush()
    found = memory.recall(["k1", "k2", "k3"])
    assert found["k1"] == store.Found("eins!", (5, 6), "stop", 9, "en", "ok") and len(found) == 2
    assert memory.recall_plain(["p1"])["p1"].text == "eins!"
    other = store.TranslationMemory(memory.engine, "model-b", 100)  # another model: nothing
    assert other.recall(["k1"]) == {} and other.recall_plain(["p1"]) == {}
    memory.announce("hunyuan-mt", marker_key("hunyuan-mt"))
    assert other.current(marker_key("hunyuan-mt")) == "model-a"
    other.announce("hunyuan-mt", marker_key("hunyuan-mt"))  # the model changed
    assert memory.current(marker_key("hunyuan-mt")) == "model-b"
    memory.close()


def test_past_the_bound_the_least_recently_used_go(
    url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store, "EVICT_CHECK_S", 0.0)
    memory = store.TranslationMemory.open(url, "m", 25)
    memory.announce("name", "marker")
    memory.keep([entry(f"old{i}") for i in range(20)])
    memory.flush()
    table = store.translation_memory
    with memory.engine.begin() as connection:  # ages: old0 the oldest, old19 the newest
        for i in range(20):
            age = time.time() - 10_000 + i
            connection.execute(
                sa.update(table).where(table.c.key == f"old{i}").values(last_used=int(age))
            )
    assert memory.recall(["old0"])  # a hit: old0 is the newest use now
    memory.max_rows = 20
    memory.keep([entry("new")])
    memory.flush()
    with memory.engine.connect() as connection:
        left = set(connection.execute(sa.select(table.c.key)).scalars())
    # 22 rows, bound 20: down to 19 (95 %): the 3 least recently used went (old1..old3).
    assert left == {"marker", "new", "old0", *(f"old{i}" for i in range(4, 20))}
    assert memory.evictions == 3
    memory.close()


def test_a_lost_database_finds_nothing_and_drops_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory = store.TranslationMemory.open(f"sqlite:///{tmp_path / 'm.db'}", "m", 100)
    with memory.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE translation_memory"))
    assert memory.recall(["k"]) == {}
    memory.keep([entry("k", "a user's secret words")])
    memory.flush()
    assert "lookup failed" in caplog.text and "write failed (dropped)" in caplog.text
    above_debug = [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG]
    assert not any("secret" in message for message in above_debug)  # values stay at DEBUG
    memory.close()


def test_resolving_the_database() -> None:
    assert store.resolve_url("sqlite:////x.db", {}) == "sqlite:////x.db"
    assert store.resolve_url("auto", {"HYMT_DATABASE_URL": "postgresql://h/d"}) == (
        "postgresql://h/d"
    )
    assert store.resolve_url("auto", {"HYMT_WORK_DIR": "/w"}) == "sqlite:////w/hymt.db"
    assert store.resolve_url("auto", {}) is None


def test_the_model_identity_sees_weights_config_and_precision(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}')
    weights = folder / "model.safetensors"
    header = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'
    weights.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    first = model_identity(folder, {"dtype": "float32"})
    assert model_identity(folder, {"dtype": "float32"}) == first  # read again: the same
    assert model_identity(folder, {"dtype": "bfloat16"}) != first
    weights.write_bytes(len(header).to_bytes(8, "little") + header + bytes(15) + b"\x01")
    trained = model_identity(folder, {"dtype": "float32"})  # same names and shapes
    assert trained != first
    (folder / "config.json").write_text('{"a": 2}')
    assert model_identity(folder, {"dtype": "float32"}) not in (first, trained)


def test_what_a_rows_key_holds() -> None:
    row = GenerationRow((1, 2, 3), 64)
    key = row_key("m", "", row)
    assert row_key("m", "", GenerationRow((1, 2, 3), 64)) == key
    others = [
        row_key("m2", "", row),
        row_key("m", "team", row),
        row_key("m", "", GenerationRow((1, 2, 4), 64)),
        row_key("m", "", GenerationRow((1, 2, 3), 65)),
        row_key("m", "", GenerationRow((1, 2, 3), 64, stop=("\n",))),
        row_key("m", "", GenerationRow((1, 2, 3), 64, SamplingParams(seed=1))),
        row_key("m", "", GenerationRow((1, 2, 3), 64, SamplingParams(seed=2))),
    ]
    assert len({key, *others}) == len(others) + 1


def test_the_requests_say() -> None:
    greedy, seeded = GenerationRow((1,), 8), GenerationRow((1,), 8, SamplingParams(seed=3))
    unseeded = GenerationRow((1,), 8, SamplingParams())
    assert uses_memory(greedy, Choice()) and not uses_memory(greedy, Choice(cache=False))
    assert not uses_memory(seeded, Choice()) and uses_memory(seeded, Choice(cache=True))
    assert not uses_memory(unseeded, Choice(cache=True))
    body, choice = take_choice(b'{"text": "x", "cache": false, "cache_namespace": "a"}')
    assert body == {"text": "x"} and choice == Choice(False, "a")
    assert take_choice({"text": "x"}) == ({"text": "x"}, Choice())
    for bad in ({"cache": 1}, {"cache_namespace": 5}, {"cache_namespace": "n" * 201}):
        with pytest.raises(InvalidRequest):
            take_choice(bad)
    check_choice(Choice(cache=True), sampled=True, seeded=True)
    with pytest.raises(InvalidRequest, match="seed"):
        check_choice(Choice(cache=True), sampled=True, seeded=False)
