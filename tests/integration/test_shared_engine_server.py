"""``share_engine: true`` on a real TorchServe in async mode: two workers on one device (here
the CPU, whose workers all get the same device id) feed one engine process. Concurrent
requests through both workers are answered, both workers report the same engine, and the
server's stop (``hymt stop``) stops the engine too, well before its 30 s of idle time."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import MODEL, running_server

from hymt_serve.ops.launcher import Server, describe_model, model_workers

pytestmark = pytest.mark.integration


def _engine_processes() -> dict[int, str]:
    """pid -> command line of every shared engine process on this machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "hymt_serve.engine.process.shared" in command:
                found[int(entry.name)] = command
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _translate(server: Server, index: int) -> int:
    response = requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json={"text": f"Sentence number {index}.", "target_lang": "de"},
        headers=server.headers("inference"),
        timeout=120,
    )
    return response.status_code


def _engine_pid(server: Server) -> Any:
    custom = describe_model(server, MODEL, "?customized=true")[0]["customizedMetadata"]
    return (json.loads(custom) if isinstance(custom, str) else custom)["engine"]["process"]["pid"]


def test_two_workers_feed_one_engine_process_which_stops_with_the_server(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    before = set(_engine_processes())
    archive = {
        "asyncCommunication": True,
        "batchSize": 1,
        "minWorkers": 2,
        "maxWorkers": 2,
        "handler.engine": "fast",
        "handler.max_new_tokens": 12,
        "handler.share_engine": True,
    }
    with running_server(tiny_model_dir, tmp_path, archive) as server:
        workers = model_workers(server, MODEL)
        assert [w["status"] for w in workers] == ["READY", "READY"]
        engines = {pid for pid in _engine_processes() if pid not in before}
        assert len(engines) == 1, engines  # one engine for both workers, not one each
        (engine,) = engines
        assert engine not in {w["pid"] for w in workers}
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(lambda i: _translate(server, i), range(48)))
        assert statuses == [200] * 48
        assert {_engine_pid(server) for _ in range(6)} == {engine}  # either worker
    deadline = time.monotonic() + 15  # stopped with the server, not after 30 s idle
    while _alive(engine) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(engine)
