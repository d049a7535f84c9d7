"""A real TorchServe, started once per session from an archive built here, on free ports."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hymt_serve.archive import build_archive
from hymt_serve.launcher import Server, start, stop, wait_ready

REPO = Path(__file__).resolve().parents[2]
MODEL = "hunyuan-mt"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("model_store")
    # A longer batch delay than the demo's, so that concurrent test requests share a batch.
    build_archive(
        model_path=tiny_model_dir,
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=store,
        overrides={"maxBatchDelay": 200, "handler.max_new_tokens": 16},
    )
    inference, management, metrics, grpc_i, grpc_m, worker = free_ports(6)
    overrides = {
        "inference_address": f"http://127.0.0.1:{inference}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "grpc_inference_port": str(grpc_i),
        "grpc_management_port": str(grpc_m),
        "initial_worker_port": str(worker),
    }
    running, _ = start(
        REPO / "config.properties",
        tmp_path_factory.mktemp("run"),
        model_store=store,
        models=[f"{MODEL}={MODEL}.mar"],
        overrides=overrides,
    )
    try:
        wait_ready(running, [MODEL], timeout=240)
        yield running
    finally:
        stop(running)
