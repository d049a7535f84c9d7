"""The web front end's own API keys for the LibreTranslate and DeepL compatible APIs.

Never the TorchServe keys: a client of the compatible APIs gets a key from this file, and the
front end calls TorchServe with its own inference key. The file (``web_keys.json`` in the work
folder, mode 0600) is created at the first start with one random key and read at each start::

    {"keys": [{"name": "default", "key": "...", "character_limit": 1000000}]}

Each key has a character limit: the characters of the texts it had translated (as DeepL counts
them) are kept per key name in ``web_usage.json`` beside it, so a restart does not reset them;
a request that would pass the limit is refused whole. Counting happens in memory at once; the
file is written behind, at most every ``SAVE_EVERY_S`` on a timer thread and at
:meth:`ClientKeys.close` (the front end's shutdown): writing and renaming it for every request
cost the front end's one event loop about 2 ms a request, a fifth of its capacity. A crash
loses at most that interval's counts.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hymt_serve.core.errors import ConfigurationError

KEYS_FILE = "web_keys.json"
USAGE_FILE = "web_usage.json"
DEFAULT_CHARACTER_LIMIT = 1_000_000
SAVE_EVERY_S = 0.5


@dataclass(frozen=True)
class ClientKey:
    name: str
    key: str
    character_limit: int


class ClientKeys:
    """The keys of one key file, with their usage."""

    def __init__(self, keys: list[ClientKey], usage_path: Path) -> None:
        self.keys = keys
        self.usage_path = usage_path
        self._lock = threading.Lock()
        self._used: dict[str, int] = _read_usage(usage_path)
        self._timer: threading.Timer | None = None  # a save due, until it runs
        self._saving = threading.Lock()

    @classmethod
    def open(cls, path: Path, character_limit: int = DEFAULT_CHARACTER_LIMIT) -> ClientKeys:
        """The keys of ``path``, creating it with one new key when it does not exist."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            first = {"name": "default", "key": secrets.token_urlsafe(24)}
            content = {"keys": [{**first, "character_limit": character_limit}]}
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                json.dump(content, file, indent=1)
        return cls(_read_keys(path), path.with_name(USAGE_FILE))

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
            return self._used.get(key.name, 0)

    def reserve(self, key: ClientKey, characters: int) -> bool:
        """Count ``characters`` against ``key``; False (and nothing counted) past its limit."""
        with self._lock:
            used = self._used.get(key.name, 0)
            if used + characters > key.character_limit:
                return False
            self._used[key.name] = used + characters
            self._save_later()
            return True

    def refund(self, key: ClientKey, characters: int) -> None:
        """Give back what :meth:`reserve` counted for a request that failed."""
        with self._lock:
            self._used[key.name] = max(0, self._used.get(key.name, 0) - characters)
            self._save_later()

    def close(self) -> None:
        """Write the usage now (a save due is not waited for)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self._save()

    def _save_later(self) -> None:
        """Schedule a save in ``SAVE_EVERY_S`` unless one is due already (lock held)."""
        if self._timer is None:
            self._timer = threading.Timer(SAVE_EVERY_S, self._save_due)
            self._timer.daemon = True
            self._timer.start()

    def _save_due(self) -> None:
        with self._lock:
            self._timer = None
        self._save()

    def _save(self) -> None:
        # One save at a time, each writing what is counted when it starts: a later save never
        # lands before an earlier one.
        with self._saving:
            with self._lock:
                content = json.dumps(self._used)
            partial = self.usage_path.with_suffix(".tmp")
            partial.write_text(content)
            partial.replace(self.usage_path)


def bearer(header: str) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; None for another scheme."""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _read_keys(path: Path) -> list[ClientKey]:
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
    if any(len(key.key) < 16 or key.character_limit < 0 for key in keys):
        raise ConfigurationError(
            f"{path}: every key needs at least 16 characters and a limit of 0 or more"
        )
    if len({key.name for key in keys}) != len(keys):
        raise ConfigurationError(f"{path}: key names must differ (usage is kept per name)")
    return keys


def _read_usage(path: Path) -> dict[str, int]:
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(content, dict):
        return {}
    return {str(k): int(v) for k, v in content.items() if isinstance(v, int)}
