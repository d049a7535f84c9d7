"""The fast engine's check that Triton can build the C modules its kernels launch through, run
against Triton's own build function (the one that compiles them) in a fresh cache: without a
compiler it must say what to install, and a compiler that fails must be named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.runners.build import check_kernel_builds

build = pytest.importorskip("triton.runtime.build", reason="Triton is a Linux x86_64 dependency")

SOURCE = """#include <Python.h>
static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "hymt_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_hymt_probe(void) { return PyModule_Create(&probe); }
"""


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CC", raising=False)
    return tmp_path


def probe() -> None:
    build.compile_module_from_src(SOURCE, "hymt_probe")


def test_no_compiler_says_what_to_install(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fresh_cache))  # nothing on it
    with pytest.raises(ConfigurationError) as raised:
        check_kernel_builds(probe)
    message = str(raised.value)
    assert "no C compiler" in message and "gcc libc6-dev" in message and "engine: hf" in message
    assert "C compiler" in str(raised.value.__cause__)  # Triton's own error, kept as the cause


def test_a_compiler_that_fails_is_named(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = shutil.which("false")
    assert failing
    monkeypatch.setenv("CC", failing)
    with pytest.raises(ConfigurationError, match=r"did not build with '.*false'.*libc6-dev"):
        check_kernel_builds(probe)


def test_other_errors_pass_through() -> None:
    def broken() -> None:
        raise RuntimeError("0 active drivers")

    with pytest.raises(RuntimeError, match="0 active drivers"):
        check_kernel_builds(broken)


@pytest.mark.skipif(not shutil.which("gcc"), reason="no gcc on this machine")
def test_a_working_compiler_passes(fresh_cache: Path) -> None:
    check_kernel_builds(probe)
    assert list((fresh_cache / "cache").rglob("hymt_probe*.so"))  # built, kept in the cache
