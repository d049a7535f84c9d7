"""The front end's database (hymt_serve.web.database, key_store, keys) on SQLite and on a real
PostgreSQL server: migrations from empty, the key file's import, replicas counting on one
database, and hymt web and hymt keys against both.

PostgreSQL: $HYMT_TEST_POSTGRES_URL (scripts/postgres.sh starts one; .ci/run and
scripts/test.sh set it); each test gets a database of its own. Without the variable those tests
skip, except under CI, where they fail.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from hymt_serve.web import database
from hymt_serve.web.key_store import KeyStore
from hymt_serve.web.keys import SAVE_EVERY_S, USAGE_FILE, ClientKeys

POSTGRES_VARIABLE = "HYMT_TEST_POSTGRES_URL"
# The newest revision in migrations/versions (the head of its one chain).
NEWEST = ScriptDirectory(str(database.MIGRATIONS)).get_current_head()
BOUND_S = 2 * SAVE_EVERY_S + 1.0  # two turns, and room for a slow shared machine


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL with nothing in it yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    server = os.environ.get(POSTGRES_VARIABLE)
    if not server:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the PostgreSQL tests: ${POSTGRES_VARIABLE} is not set")
        pytest.skip(f"no PostgreSQL server: set ${POSTGRES_VARIABLE} (scripts/postgres.sh)")
    name = f"hymt_{secrets.token_hex(6)}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield sa.make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:  # FORCE: connections of keys left open
            connection.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def write_keys(folder: Path, limits: dict[str, int]) -> Path:
    path = folder / "web_keys.json"
    entries = [
        {"name": n, "key": f"{n}-key-0123456789ab", "character_limit": c} for n, c in limits.items()
    ]
    path.write_text(json.dumps({"keys": entries}))
    return path


def wait_for(condition: Callable[[], bool], seconds: float = BOUND_S) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def stored(url: str) -> dict[str, int]:
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT name, used FROM client_keys"))
            return {str(name): int(used) for name, used in rows}
    finally:
        engine.dispose()


def test_migrations_run_up_from_empty_and_once(url: str) -> None:
    engine = database.connect(url)
    assert database.revision(engine) is None and not sa.inspect(engine).get_table_names()
    database.upgrade(engine)
    assert database.revision(engine) == NEWEST
    columns = {c["name"] for c in sa.inspect(engine).get_columns("client_keys")}
    assert columns == {c.name for c in database.client_keys.columns}  # the Core table matches
    database.upgrade(engine)  # at the newest revision: nothing to do
    assert database.revision(engine) == NEWEST
    engine.dispose()


def test_a_key_file_and_its_usage_file_are_imported_once(url: str, tmp_path: Path) -> None:
    path = write_keys(tmp_path, {"a": 100, "b": 50})
    (tmp_path / USAGE_FILE).write_text(json.dumps({"a": 7, "b": 3}))
    keys = ClientKeys.open(path, database_url=url)
    assert [k.name for k in keys.keys] == ["a", "b"]
    assert [keys.used(k) for k in keys.keys] == [7, 3]
    assert not (tmp_path / USAGE_FILE).exists()  # renamed: the database holds it now
    assert (tmp_path / f"{USAGE_FILE}.imported").is_file()
    keys.close()
    # A second start, even with a usage file again, counts nothing twice.
    (tmp_path / USAGE_FILE).write_text(json.dumps({"a": 7, "b": 3}))
    again = ClientKeys.open(path, database_url=url)
    assert [again.used(k) for k in again.keys] == [7, 3]
    again.close()
    # The file decides its keys: a limit changed, a key taken out is refused, its usage kept.
    write_keys(tmp_path, {"a": 10})
    edited = ClientKeys.open(path, database_url=url)
    assert [(k.name, k.character_limit) for k in edited.keys] == [("a", 10)]
    assert edited.find("b-key-0123456789ab") is None
    edited.close()
    write_keys(tmp_path, {"a": 10, "b": 50})
    back = ClientKeys.open(path, database_url=url)
    assert [back.used(k) for k in back.keys] == [7, 3]
    back.close()


def test_two_replicas_count_exactly_on_one_database(url: str, tmp_path: Path) -> None:
    """Two ClientKeys on one database, as two front-end replicas: every character counted by
    either ends up in the database, none twice, though both write all the time."""
    path = write_keys(tmp_path, {"a": 10**9})
    replicas = [ClientKeys.open(path, database_url=url) for _ in range(2)]

    def count(keys: ClientKeys) -> None:
        key = keys.keys[0]
        for i in range(3000):
            assert keys.reserve(key, 3)
            if i % 3 == 0:
                keys.refund(key, 1)
            if i % 500 == 0:
                time.sleep(SAVE_EVERY_S / 2)  # let turns write in the middle of it

    threads = [threading.Thread(target=count, args=(k,)) for k in replicas for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = 4 * (3000 * 3 - 1000)
    key = replicas[0].keys[0]
    # Each sees the other's counts within two turns, before either closes.
    assert all(wait_for(lambda k=k: k.used(key) == expected) for k in replicas)  # type: ignore[misc]
    for keys in replicas:
        keys.close()
    assert stored(url) == {"a": expected}


def test_a_limit_holds_across_replicas(url: str, tmp_path: Path) -> None:
    path = write_keys(tmp_path, {"a": 100})
    first, second = (ClientKeys.open(path, database_url=url) for _ in range(2))
    key = first.keys[0]
    assert first.reserve(key, 60)
    assert wait_for(lambda: second.used(key) == 60)  # the bounded staleness
    assert not second.reserve(key, 41) and second.reserve(key, 40)
    assert wait_for(lambda: first.used(key) == 100)
    assert not first.reserve(key, 1)
    first.refund(key, 30)  # a failed request gives back, seen by the other replica too
    assert wait_for(lambda: second.used(key) == 70) and second.reserve(key, 30)
    first.close()
    second.close()
    assert stored(url) == {"a": 100}


def test_hymt_keys_commands_reach_a_running_front_end(url: str, tmp_path: Path) -> None:
    path = write_keys(tmp_path, {"a": 100})
    running = ClientKeys.open(path, database_url=url)
    base = [sys.executable, "-m", "hymt_serve.cli", "keys"]
    where = ["--workdir", str(tmp_path), "--database-url", url]
    added = subprocess.run(
        [*base, "add", "team-b", "--character-limit", "5", *where],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    new_key = added.stdout.strip()
    assert len(new_key) >= 32 and wait_for(lambda: running.find(new_key) is not None)
    listed = subprocess.run(
        [*base, "list", *where], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert listed == ["a\tfile\tactive\t0/100", "team-b\tcommand\tactive\t0/5"]
    assert new_key not in "".join(listed)  # only with --show-keys
    subprocess.run([*base, "remove", "team-b", *where], timeout=60, check=True)
    assert wait_for(lambda: running.find(new_key) is None)
    twice = subprocess.run([*base, "add", "a", *where], capture_output=True, text=True, timeout=60)
    assert twice.returncode == 1 and "exists already" in twice.stderr
    running.close()
    assert KeyStore(database.connect(url)).read().used == {"a": 0, "team-b": 0}


@pytest.mark.parametrize("default", [True, False], ids=["default-sqlite", "url"])
def test_hymt_web_starts_and_migrates(url: str, tmp_path: Path, default: bool) -> None:
    if default and not url.startswith("sqlite"):
        pytest.skip("the default is SQLite in the work folder")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(tmp_path)]
    command += ["--port", str(port)] + ([] if default else ["--database-url", url])
    environment = {k: v for k, v in os.environ.items() if k != database.URL_VARIABLE}
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: _live(port), seconds=60), "hymt web did not start"
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    if default:
        url = f"sqlite:///{tmp_path / database.DATABASE_FILE}"
        assert (tmp_path / database.DATABASE_FILE).stat().st_mode & 0o777 == 0o600
    assert "client keys and usage in the database" in output
    assert database.revision(database.connect(url)) == NEWEST
    key = json.loads((tmp_path / "web_keys.json").read_text())["keys"][0]
    assert stored(url) == {key["name"]: 0}


def _live(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=1).ok
    except requests.ConnectionError:
        return False
