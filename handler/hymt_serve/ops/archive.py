"""Build the model archive with torch-model-archiver.

The archive carries the handler module, this whole package and a model-config.yaml rendered from
a profile template (``configs/model-config-<profile>.yaml``) with ``handler.model_path`` set.
Weights are referenced by absolute path by default (a 15 GB model must never be zipped); with
``bundle_weights`` a small model folder is copied into the archive as ``model/`` instead.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

HANDLER_MODULE = "hunyuan_mt_handler"
BUNDLED_MODEL_DIR = "model"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


def render_model_config(
    template: Path, model_path: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The template's YAML with ``handler.model_path`` set and dotted-key overrides applied."""
    config: dict[str, Any] = yaml.safe_load(template.read_text(encoding="utf-8")) or {}
    config.setdefault("handler", {})["model_path"] = model_path
    for dotted, value in (overrides or {}).items():
        target = config
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """``key.sub=value`` with the value read as YAML (so 8 is an int, true a bool)."""
    if "=" not in text:
        raise ValueError(f"override must look like key=value, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), yaml.safe_load(value)


def build_archive(
    *,
    model_path: Path,
    template: Path,
    export_path: Path,
    name: str = "hunyuan-mt",
    version: str = "1.0",
    bundle_weights: bool = False,
    archive_format: str = "default",
    overrides: Mapping[str, Any] | None = None,
    handler: Path | None = None,
) -> Path:
    """Build ``<export_path>/<name>.mar`` (or a folder for ``no-archive``); returns its path.
    ``handler``: another handler file than ours (a test's subclass of it)."""
    if not (model_path / "config.json").is_file():
        raise FileNotFoundError(f"{model_path} is not a Hugging Face model folder (no config.json)")
    export_path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hymt-archive-") as tmp:
        stage = Path(tmp)
        extra = stage / "extra"
        shutil.copytree(Path(__file__).parents[1], extra / "hymt_serve", ignore=_SKIP)
        if bundle_weights:
            shutil.copytree(model_path, extra / BUNDLED_MODEL_DIR, ignore=_SKIP)
        recorded_path = BUNDLED_MODEL_DIR if bundle_weights else str(model_path.resolve())
        config = render_model_config(template, recorded_path, overrides)
        (stage / "model-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        _run_archiver(stage, export_path, name, version, archive_format, handler)
    suffix = {"default": ".mar", "tgz": ".tar.gz", "no-archive": ""}[archive_format]
    return export_path / f"{name}{suffix}"


def _handler_file() -> Path:
    spec = importlib.util.find_spec(HANDLER_MODULE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the handler module {HANDLER_MODULE} is not installed")
    return Path(spec.origin)


def _run_archiver(
    stage: Path, export_path: Path, name: str, version: str, fmt: str, handler: Path | None
) -> None:
    if fmt == "no-archive":
        shutil.rmtree(export_path / name, ignore_errors=True)
    command = [
        sys.executable,
        "-c",  # what the torch-model-archiver script runs (-m warns: the package imports it)
        "from model_archiver.model_packaging import generate_model_archive as g; g()",
        "--model-name",
        name,
        "--version",
        version,
        "--handler",
        str(handler or _handler_file()),
        "--extra-files",
        str(stage / "extra"),
        "--config-file",
        str(stage / "model-config.yaml"),
        "--export-path",
        str(export_path.resolve()),
        "--archive-format",
        fmt,
        "--force",
    ]
    subprocess.run(command, check=True)
