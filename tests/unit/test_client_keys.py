"""The web front end's own keys (hymt_serve.web.keys) and how hymt web refuses a bad key file."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.web.keys import SAVE_EVERY_S, ClientKeys

GOOD = {"name": "a", "key": "k" * 16, "character_limit": 10}


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{", "must hold"),
        (json.dumps({"keys": [{"name": "a"}]}), "must hold"),
        (json.dumps({"keys": []}), "holds no keys"),
        (json.dumps({"keys": [{**GOOD, "key": "short"}]}), "at least 16"),
        (json.dumps({"keys": [GOOD, {**GOOD, "key": "x" * 16}]}), "names must differ"),
    ],
)
def test_a_bad_key_file_is_a_configuration_error(tmp_path: Path, content: str, match: str) -> None:
    (tmp_path / "web_keys.json").write_text(content)
    with pytest.raises(ConfigurationError, match=match):
        ClientKeys.open(tmp_path / "web_keys.json")


def test_keys_are_found_exactly_and_limits_hold(tmp_path: Path) -> None:
    (tmp_path / "web_keys.json").write_text(json.dumps({"keys": [GOOD]}))
    keys = ClientKeys.open(tmp_path / "web_keys.json")
    [key] = keys.keys
    assert keys.find("k" * 16) == key
    assert keys.find(None) is None and keys.find("") is None and keys.find("k" * 15) is None
    assert keys.reserve(key, 10) and not keys.reserve(key, 1) and keys.used(key) == 10
    keys.refund(key, 4)
    assert keys.used(key) == 6


def test_hymt_web_refuses_a_bad_key_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "web_keys.json").write_text(json.dumps({"keys": []}))
    command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == f"hymt web: {tmp_path / 'web_keys.json'} holds no keys"


def test_a_read_only_key_file_from_a_secret_is_read_and_usage_kept_beside(tmp_path: Path) -> None:
    """The Helm chart mounts a Secret's web_keys.json read-only into the work folder: it is
    read as it is (never rewritten), and the usage goes to the database (hymt.db) beside it."""
    path = tmp_path / "web_keys.json"
    path.write_text(json.dumps({"keys": [GOOD]}))
    path.chmod(0o440)
    keys = ClientKeys.open(path)
    key = keys.find("k" * 16)
    assert key is not None and keys.reserve(key, 4)
    keys.close()
    assert _stored(tmp_path) == {"a": 4}
    assert json.loads(path.read_text()) == {"keys": [GOOD]}
    assert ClientKeys.open(path).used(key) == 4


def test_usage_is_saved_behind_once_for_a_burst(tmp_path: Path) -> None:
    """Counting is immediate; the database is written once per SAVE_EVERY_S, not per request
    (a write per request would cost the front end's event loop ~2 ms each)."""
    path = tmp_path / "web_keys.json"
    path.write_text(json.dumps({"keys": [{**GOOD, "character_limit": 100}]}))
    keys = ClientKeys.open(path)
    key = keys.find("k" * 16)
    assert key is not None
    for _ in range(50):
        assert keys.reserve(key, 1)
    assert keys.used(key) == 50 and _stored(tmp_path) == {"a": 0}  # nothing written yet
    deadline = time.monotonic() + 10 * SAVE_EVERY_S
    while _stored(tmp_path) != {"a": 50} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _stored(tmp_path) == {"a": 50}
    keys.refund(key, 10)
    keys.close()  # the shutdown writes what is due at once
    assert _stored(tmp_path) == {"a": 40}


def _stored(folder: Path) -> dict[str, int]:
    """The usage the database in ``folder`` holds, read with sqlite3 itself."""
    with contextlib.closing(sqlite3.connect(folder / "hymt.db")) as connection:
        return dict(connection.execute("SELECT name, used FROM client_keys").fetchall())
