"""Real TorchServes started from archives built here, on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import requests

from hymt_serve.ops.archive import build_archive
from hymt_serve.ops.launcher import Server, free_port_overrides, start, stop, wait_ready

REPO = Path(__file__).resolve().parents[2]
# Our handler with the test-only fault keys (test_oom_max_new_tokens, test_hang_max_new_tokens).
FAULTY_HANDLER = REPO / "tests/faulty_handler.py"
MODEL = "hunyuan-mt"


WRONG = {"Authorization": "Bearer not-the-key"}


def refused(response: requests.Response) -> bool:
    """TorchServe 0.12.0 refuses a missing or wrong token with 400 InvalidKeyException (not 401)."""
    return response.status_code == 400 and response.json()["type"] == "InvalidKeyException"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def locust_run(
    server: Server, locustfile: str, report: str, *args: str, **env: str
) -> tuple[list[str], dict[str, str]]:
    """Command and environment for a headless Locust run against ``server``; the CSV/HTML
    reports go to loadtest/reports/<report>*."""
    reports = REPO / "loadtest/reports"
    reports.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, "HYMT_KEY_FILE": str(server.workdir / "key_file.json"), **env}
    environ.pop("HYMT_TOKEN", None)
    host = f"http://127.0.0.1:{urlparse(server.inference_url()).port}"
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        locustfile,
        "--headless",
        "--host",
        host,
        "--csv",
        str(reports / report),
        "--html",
        str(reports / f"{report}.html"),
        "--only-summary",
        *args,
    ]
    return command, environ


@contextlib.contextmanager
def running_server(
    model_dir: Path,
    folder: Path,
    archive_overrides: Mapping[str, Any],
    config_overrides: Mapping[str, str] | None = None,
    more_models: Mapping[str, tuple[Path, Mapping[str, Any]]] | None = None,
    handler: Path | None = None,
) -> Iterator[Server]:
    """Build an archive of ``model_dir`` (CPU profile + overrides; ``handler``: another handler
    file, e.g. :data:`FAULTY_HANDLER`), and of each of ``more_models`` (name: (folder,
    overrides)), start, wait, stop after."""
    store = folder / "model_store"
    archives = {MODEL: (model_dir, archive_overrides), **(more_models or {})}
    for name, (path, archive) in archives.items():
        build_archive(
            model_path=path,
            template=REPO / "configs/model-config-cpu.yaml",
            export_path=store,
            overrides=archive,
            name=name,
            handler=handler if name == MODEL else None,
        )
    overrides = {**free_port_overrides(), **(config_overrides or {})}
    server, _ = start(
        REPO / "config.properties",
        folder / "run",
        model_store=store,
        models=[f"{name}={name}.mar" for name in archives],
        overrides=overrides,
    )
    try:
        wait_ready(server, list(archives), timeout=240)
        yield server
    finally:
        stop(server)


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared server. A longer batch delay than the demo's, so that concurrent test
    requests share a batch."""
    overrides = {
        "maxBatchDelay": 200,
        "handler.max_new_tokens": 16,
        # The tests repeat their texts and check each request's own work (usage, batches, the
        # soak's heap): the memory would answer them. test_memory_server.py has it on.
        "handler.translation_memory": False,
    }
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("main"), overrides) as running:
        yield running
