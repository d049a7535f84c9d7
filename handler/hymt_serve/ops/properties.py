"""TorchServe's ``config.properties``: read, rendered for a work folder, written.

``render_config`` is what ``hymt start`` writes (relative paths resolved against the source
file's folder, overrides applied, ``{model_store}`` in ``allowed_urls`` made a regex literal of
the store's path); the Helm chart's ConfigMap is tested against it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

PATH_KEYS = (
    "model_store",
    "metrics_config",
    "workflow_store",
    "keystore",
    "private_key_file",
    "certificate_file",
    "plugins_path",
)


def read_properties(path: Path) -> dict[str, str]:
    """``key=value`` lines of a Java properties file (comments and blanks skipped)."""
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values[key.strip()] = value.strip()
    return values


def render_properties(source: Path, overrides: Mapping[str, str]) -> dict[str, str]:
    """The effective config: ``source``'s values, relative paths resolved against its folder."""
    values = read_properties(source)
    for key in PATH_KEYS:
        if values.get(key) and not Path(values[key]).is_absolute():
            values[key] = str((source.parent / values[key]).resolve())
    values.update(overrides)
    return values


def render_config(
    config: Path, overrides: Mapping[str, str] | None, model_store: Path | None
) -> dict[str, str]:
    """What ``start`` writes (and the Helm chart's ConfigMap is tested against)."""
    values = render_properties(config.resolve(), dict(overrides or {}))
    if model_store is not None:
        values["model_store"] = str(model_store.resolve())
    if "{model_store}" in values.get("allowed_urls", ""):
        store = _java_regex_literal(values.get("model_store", ""))
        values["allowed_urls"] = values["allowed_urls"].replace("{model_store}", store)
    return values


def write_properties(values: Mapping[str, str], path: Path) -> None:
    lines = ["# rendered by hymt start from the project's config; edit the source, not this"]
    lines += [f"{key}={value}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _java_regex_literal(text: str) -> str:
    """``text`` as a regex literal, escaped once more for a Java properties file."""
    return re.escape(text).replace("\\", "\\\\")
