"""The front end's key file, ``web_keys.json``: how operators declare client keys.

The file (mode 0600) is created with one random key when neither it nor the database has a
key, and is imported into the database at every start (:mod:`.key_store`)::

    {"keys": [{"name": "default", "key": "...", "character_limit": 1000000}]}

``web_usage.json`` beside it is what releases before the database counted per key name; it is
read once, when its keys are first imported.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hymt_serve.core.errors import ConfigurationError

KEYS_FILE = "web_keys.json"
USAGE_FILE = "web_usage.json"
DEFAULT_CHARACTER_LIMIT = 1_000_000


@dataclass(frozen=True)
class ClientKey:
    name: str
    key: str
    character_limit: int


def new_key() -> str:
    """A random client key (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def create(path: Path, character_limit: int) -> None:
    """Write ``path`` with one new key named ``default`` (mode 0600; never over a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {"keys": [{"name": "default", "key": new_key(), "character_limit": character_limit}]}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(content, file, indent=1)


def read_keys(path: Path) -> list[ClientKey]:
    """The keys ``path`` declares; ConfigurationError naming what is wrong with it."""
    try:
        content: Any = json.loads(path.read_text())
        keys = [
            ClientKey(str(item["name"]), str(item["key"]), int(item["character_limit"]))
            for item in content["keys"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigurationError(
            f'{path} must hold {{"keys": [{{"name", "key", "character_limit"}}, ...]}}'
        ) from error
    if not keys:
        raise ConfigurationError(f"{path} holds no keys")
    check(keys, str(path))
    return keys


def check(keys: list[ClientKey], where: str) -> None:
    """ConfigurationError for a short key, a negative limit or a name given twice."""
    if any(len(key.key) < 16 or key.character_limit < 0 for key in keys):
        raise ConfigurationError(
            f"{where}: every key needs at least 16 characters and a limit of 0 or more"
        )
    if any(not key.name or len(key.name) > 200 for key in keys):
        raise ConfigurationError(f"{where}: key names have 1 to 200 characters")
    if len({key.name for key in keys}) != len(keys):
        raise ConfigurationError(f"{where}: key names must differ (usage is kept per name)")


def read_usage(path: Path) -> dict[str, int]:
    """The characters counted per key name in a former release's usage file; {} without one."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(content, dict):
        return {}
    return {str(k): int(v) for k, v in content.items() if isinstance(v, int)}
