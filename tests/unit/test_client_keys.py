"""The web front end's own keys (hymt_serve.web.keys) and how hymt web refuses a bad key file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.web.keys import ClientKeys

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
    read as it is (never rewritten), and the usage goes to web_usage.json beside it."""
    path = tmp_path / "web_keys.json"
    path.write_text(json.dumps({"keys": [GOOD]}))
    path.chmod(0o440)
    keys = ClientKeys.open(path)
    key = keys.find("k" * 16)
    assert key is not None and keys.reserve(key, 4)
    assert json.loads((tmp_path / "web_usage.json").read_text()) == {"a": 4}
    assert json.loads(path.read_text()) == {"keys": [GOOD]}
