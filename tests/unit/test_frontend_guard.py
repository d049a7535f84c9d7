"""The front-end plugin (a thread-safe async request map): its build, and ``hymt start`` putting
it in ``plugins_path``. The plugin at work in a real TorchServe:
tests/integration/test_async_server.py."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hymt_serve.ops import frontend_guard, launcher
from hymt_serve.ops.properties import read_properties

REPO = Path(__file__).resolve().parents[2]


def test_the_jar_holds_the_endpoint_and_is_the_same_for_the_same_sources(tmp_path: Path) -> None:
    if frontend_guard.find_javac() is None:
        pytest.skip("no JDK here (scripts/setup.sh builds the plugin where javac is)")
    first = frontend_guard.build(tmp_path / "a" / "guard.jar")
    second = frontend_guard.build(tmp_path / "b" / "guard.jar")
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as jar:
        names = set(jar.namelist())
        service = jar.read(frontend_guard.SERVICE).decode()
    assert service.strip() == frontend_guard.CLASS
    assert frontend_guard.CLASS.replace(".", "/") + ".class" in names
    # class files for Java 11 (major version 55): TorchServe 0.12.0 runs from 11 on
    with zipfile.ZipFile(first) as jar:
        header = jar.read(frontend_guard.CLASS.replace(".", "/") + ".class")[:8]
    assert header[:4] == b"\xca\xfe\xba\xbe" and int.from_bytes(header[6:8], "big") == 55


def test_no_javac_is_a_clear_build_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(frontend_guard, "find_javac", lambda: None)
    with pytest.raises(frontend_guard.BuildError, match="no javac"):
        frontend_guard.build(tmp_path / "guard.jar")
    assert not (tmp_path / "guard.jar").exists()


def test_a_compile_error_leaves_the_old_jar(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if frontend_guard.find_javac() is None:
        pytest.skip("no JDK here")
    broken = tmp_path / "HymtFrontendGuard.java"
    broken.write_text("package org.hymt.frontend; class HymtFrontendGuard { nonsense }\n")
    monkeypatch.setattr(frontend_guard, "SOURCE", broken)
    jar = tmp_path / "guard.jar"
    jar.write_bytes(b"old")
    with pytest.raises(frontend_guard.BuildError, match="javac failed"):
        frontend_guard.build(jar)
    assert jar.read_bytes() == b"old"


def _started_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plugins: Path | None, **overrides: str
) -> dict[str, str]:
    """The config ``launcher.start`` writes, TorchServe itself not run."""
    monkeypatch.setattr(launcher, "plugins_path", lambda: plugins)
    monkeypatch.setattr(launcher.Server, "environment", lambda self: {})  # no Java looked for
    calls: list[Any] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    server, _ = launcher.start(REPO / "config.properties", tmp_path / "run", overrides=overrides)
    assert calls and "--start" in calls[0][0]
    return read_properties(server.config_path)


def test_start_puts_the_built_plugin_in_plugins_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "plugins"
    assert _started_config(monkeypatch, tmp_path, folder)["plugins_path"] == str(folder)


def test_a_configured_plugins_path_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = _started_config(
        monkeypatch, tmp_path, tmp_path / "plugins", plugins_path=str(tmp_path / "mine")
    )
    assert config["plugins_path"] == str(tmp_path / "mine")


def test_without_the_plugin_start_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "plugins_path" not in _started_config(monkeypatch, tmp_path, None)
    assert "front-end plugin is not built" in capsys.readouterr().err
