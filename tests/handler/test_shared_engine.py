"""``share_engine: true``: two handlers in async mode (two TorchServe workers on one GPU) feed
one engine process, with the tiny real model on the fast engine. Both get the replies a handler
of its own gives. When that process dies, both connect again and one of them starts a new one.
It exits once no worker is connected, and a model that cannot load fails each worker's start
with the reason."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import make_context
from test_async_handler import ASYNC, BODIES, one_call, settings

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.process.shared import IDLE_EXIT_ENV


@pytest.fixture
def meeting_place(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder of the test's own (short: a Unix socket's path has ~100 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="hymt-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv(IDLE_EXIT_ENV, "2")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _worker(model_dir: Path) -> tuple[HunyuanMTHandler, Any]:
    handler = HunyuanMTHandler()
    context = make_context(
        {**settings(model_dir), "share_engine": True}, model_dir, batch_size=1, frontend=ASYNC
    )
    handler.initialize(context)
    return handler, context


def _engine_pid(handler: HunyuanMTHandler) -> int:
    return int(handler._service().engine.describe()["process"]["pid"])  # type: ignore[attr-defined]


async def _both(workers: list[tuple[HunyuanMTHandler, Any]]) -> list[tuple[int, str, str]]:
    calls = [one_call(*workers[i % 2], body, f"r{i}") for i, body in enumerate(BODIES + BODIES)]
    return list(await asyncio.gather(*calls))


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_two_workers_share_one_engine_process(tiny_model_dir: Path, meeting_place: Path) -> None:
    workers = [_worker(tiny_model_dir), _worker(tiny_model_dir)]
    pid = _engine_pid(workers[0][0])
    assert pid == _engine_pid(workers[1][0]) and pid != os.getpid()

    replies = asyncio.run(_both(workers))
    statuses = [status for status, _, _ in replies]
    assert statuses == [200, 200, 400, 200, 400, 200, 200, 413, 200] * 2  # per request, as alone
    for status, _, text in replies:
        if status == 200:
            assert json.loads(text)["translations"], text

    os.kill(pid, signal.SIGKILL)  # the engine process dies: both workers connect again
    assert _gone(pid, 10)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all(worker[0]._service().engine.available for worker in workers):  # type: ignore[attr-defined]
            break
        time.sleep(0.2)
    new_pid = _engine_pid(workers[0][0])
    assert new_pid not in (0, pid) and new_pid == _engine_pid(workers[1][0])
    assert [s for s, _, _ in asyncio.run(_both(workers))] == statuses

    for handler, _ in workers:  # both workers gone: the engine exits after its idle time
        handler._service().engine.close()  # type: ignore[attr-defined]
    assert _gone(new_pid, 30)


def test_an_engine_that_cannot_load_fails_the_start_with_why(
    tiny_model_dir: Path, meeting_place: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigurationError, match=r"the engine process failed to load: .+"):
        _worker(broken)


def test_batch_mode_refuses_share_engine(tiny_model_dir: Path) -> None:
    context = make_context({**settings(tiny_model_dir), "share_engine": True}, tiny_model_dir)
    with pytest.raises(ConfigurationError, match="share_engine: true shares the async mode"):
        HunyuanMTHandler().initialize(context)
