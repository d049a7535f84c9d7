"""The front-end plugin (async mode's request maps: thread-safe, forgetting answered requests):
its committed jar, rebuilt byte for byte from its sources, and ``hymt start`` putting it in
``plugins_path``. The plugin at work in a real TorchServe:
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


def _javac_for_the_committed_jar() -> str:
    javac = frontend_guard.find_javac()
    if javac is None:
        pytest.skip("no javac here: the committed jar is used as it is")
    major = frontend_guard.javac_major(javac)
    if major != frontend_guard.JAVAC_MAJOR:
        pytest.skip(
            f"javac {major} here; the committed jar is javac {frontend_guard.JAVAC_MAJOR}'s build"
            " (another javac may lay out the same classes otherwise)"
        )
    return javac


def test_the_committed_jar_is_the_build_of_its_sources(tmp_path: Path) -> None:
    javac = _javac_for_the_committed_jar()
    first = frontend_guard.build(tmp_path / "a" / "guard.jar", javac)
    second = frontend_guard.build(tmp_path / "b" / "guard.jar", javac)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == frontend_guard.JAR.read_bytes(), (
        "hymt-frontend-guard.jar is not the build of its sources: run"
        " `python -m hymt_serve.ops.frontend_guard` and commit the jar"
    )


def test_the_committed_jar_holds_the_endpoint_for_java_11() -> None:
    with zipfile.ZipFile(frontend_guard.JAR) as jar:
        names = jar.namelist()
        service = jar.read(frontend_guard.SERVICE).decode()
        classes = {name: jar.read(name) for name in names if name.endswith(".class")}
        assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in jar.infolist())
    assert service.strip() == frontend_guard.CLASS
    assert frontend_guard.CLASS.replace(".", "/") + ".class" in classes
    assert "org/hymt/frontend/ForgetfulJobs.class" in classes
    for data in classes.values():
        # class files for Java 11 (major version 55): TorchServe 0.12.0 runs from 11 on
        assert data[:4] == b"\xca\xfe\xba\xbe" and int.from_bytes(data[6:8], "big") == 55
        assert str(REPO).encode() not in data  # nothing of the building machine's folders


def test_the_jar_is_package_data_and_not_ignored() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"hymt_serve.ops.frontend_guard" = ["*.java", "*.jar"]' in pyproject
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(frontend_guard.JAR)], cwd=REPO, check=False
    )
    assert ignored.returncode == 1, "the committed jar must not be ignored by .gitignore"


def test_no_javac_is_a_clear_build_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(frontend_guard, "find_javac", lambda: None)
    with pytest.raises(frontend_guard.BuildError, match="no javac"):
        frontend_guard.build(tmp_path / "guard.jar")
    assert not (tmp_path / "guard.jar").exists()


def test_a_compile_error_leaves_the_old_jar(tmp_path: Path) -> None:
    if frontend_guard.find_javac() is None:
        pytest.skip("no javac here")
    for name in frontend_guard.SOURCES:
        (tmp_path / name).write_text("package org.hymt.frontend; class Broken { nonsense }\n")
    jar = tmp_path / "guard.jar"
    jar.write_bytes(b"old")
    with pytest.raises(frontend_guard.BuildError, match="javac failed"):
        frontend_guard.build(jar, source=tmp_path)
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
    assert "front-end plugin's jar is missing" in capsys.readouterr().err
