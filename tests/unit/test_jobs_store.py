"""The durable jobs' store (web/job_store.py) on SQLite and PostgreSQL: the migration makes the
Core tables, a job is billed in the transaction that stores it and refunded at most once, items
add up, and a job runs in one front end at a time (the lease)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from test_database import url  # noqa: F401  (the SQLite and PostgreSQL fixture)

from hymt_serve.web import database, job_store
from hymt_serve.web.job_store import DOCUMENT, Item, JobStore, StoredFile
from hymt_serve.web.key_store import KeyStore


@pytest.fixture
def store(url: str) -> Iterator[JobStore]:  # noqa: F811
    engine = database.connect(url)
    database.upgrade(engine)
    with engine.begin() as connection:
        connection.execute(
            sa.insert(database.client_keys).values(
                name="alice", key="k" * 20, character_limit=1000, source="command"
            )
        )
    yield JobStore(engine)
    engine.dispose()


def _used(store: JobStore) -> int:
    return KeyStore(store.engine).read().used["alice"]


def _job(job_id: str = "j1") -> dict[str, object]:
    return {"id": job_id, "owner": "alice", "kind": DOCUMENT, "state": "queued", "fields": {}}


def test_the_migration_makes_the_core_tables(store: JobStore) -> None:
    inspector = sa.inspect(store.engine)
    for table in (job_store.jobs, job_store.job_items, job_store.job_files):
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name for c in table.columns}, table.name


def test_a_job_is_billed_with_its_row_and_refunded_once(store: JobStore) -> None:
    store.create(_job(), b"# Hi\n", 120, "runner-a")
    assert _used(store) == 120 and store.input("j1") == b"# Hi\n"
    assert store.finish("j1", "error", refund=120, error="broken")
    assert not store.finish("j1", "error", refund=120)  # a second end: nothing refunded
    assert not store.update("j1", state="translating")  # an ended job stays ended
    job = store.get("j1")
    assert job is not None and job.state == "error" and job.refunded == 120
    assert _used(store) == 0


def test_items_are_kept_in_order_with_their_counts(store: JobStore) -> None:
    store.create(_job(), None, 10, "runner-a")
    store.add_items("j1", [Item(2, 200, "c", 3), Item(0, 200, "a", 4)], total=3)
    store.add_items("j1", [Item(1, 400, "b")])
    assert [item.text for _, item in sorted(store.items("j1").items())] == ["a", "b", "c"]
    assert store.item_count("j1") == (3, 1)
    job = store.get("j1")
    assert job is not None and job.total == 3
    store.clear_items("j1")
    assert store.items("j1") == {}


def test_a_job_is_claimed_by_one_runner_once_its_lease_ran_out(store: JobStore) -> None:
    store.create(_job("j1"), None, 0, "runner-a")
    store.create(_job("j2"), None, 0, "runner-a")
    assert store.claim("runner-b", stale_s=30) == []  # runner a beat a moment ago
    time.sleep(0.3)
    store.beat("runner-a", ["j2"])
    claimed = store.claim("runner-b", stale_s=0.2)
    assert [job.id for job in claimed] == ["j1"]  # j2's runner still beats
    assert store.claim("runner-c", stale_s=0.2) == []  # j1 is b's now
    store.finish("j1", "done")
    time.sleep(0.3)
    assert [job.id for job in store.claim("runner-c", stale_s=0.2)] == ["j2"]  # not j1: ended


def test_files_and_old_jobs(store: JobStore) -> None:
    file = StoredFile("file-1", "alice", "batch", "in.jsonl", 3, time.time())
    store.add_file(file, b"abc")
    assert store.file("file-1") == file and store.file_content("file-1") == b"abc"
    assert [f.id for f in store.files("alice", "batch")] == ["file-1"]
    assert store.delete_file("file-1") and store.file("file-1") is None
    store.create(_job("old"), None, 0, "r")
    store.add_items("old", [Item(0, 200, "x")])
    store.finish("old", "done")
    store.create(_job("new"), None, 0, "r")
    assert store.counts("alice", DOCUMENT) == (1, 2, 2)
    assert store.forget(DOCUMENT, time.time() + 1, 0) == 1
    assert store.get("old") is None and store.items("old") == {}
    assert [job.id for job in store.listing("alice", DOCUMENT)] == ["new"]
