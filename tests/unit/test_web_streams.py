"""Streams relayed by the front end hold no thread, and give their upstream slot back however
they end; against the stub TorchServe (no TorchServe)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
from web_stub import PREDICTIONS, Upstream, opened, serving, workdir
from werkzeug.wrappers import Request, Response

from hymt_serve.web.app import create_app

STREAMS = 40
BODY = {"text": "Hello", "target_lang": "fr"}


class Held:
    """A streamed answer: its first line at once, the last when ``gate`` opens."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, request: Request) -> Response:
        def lines() -> Iterator[bytes]:
            yield b'{"delta": "Bon"}\n'
            self.gate.wait(30)
            yield b'{"translation": "Bonjour"}\n'

        return Response(lines(), content_type="application/x-ndjson")


def _wait_until(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_open_streams_hold_no_worker_thread(upstream: Upstream, tmp_path: Path) -> None:
    """40 streams open at once: each holds an upstream slot, none a thread of the loop's
    worker pool (so their number is not bounded by --threads); all end whole."""
    held = Held()
    upstream.replies[PREDICTIONS] = held
    app = create_app(workdir(tmp_path, upstream.url))
    endings: list[Any] = []

    with opened(app) as client:

        def one() -> None:
            with client.stream("POST", "/api/translate", json=BODY) as answer:
                lines = [json.loads(line) for line in answer.iter_lines() if line]
            endings.append(lines[-1])

        async def in_use() -> tuple[int, float]:
            counts = await app.state.torchserve.upstream.counts()
            limiter = anyio.to_thread.current_default_thread_limiter()
            return counts["in_flight"], limiter.borrowed_tokens

        clients = [threading.Thread(target=one) for _ in range(STREAMS)]
        for thread in clients:
            thread.start()
        _wait_until(lambda: len(upstream.forwarded()) == STREAMS)
        assert client.portal is not None
        _wait_until(lambda: client.portal.call(in_use) == (STREAMS, 0))  # type: ignore[union-attr]
        held.gate.set()
        for thread in clients:
            thread.join(30)
        assert endings == [{"translation": "Bonjour"}] * STREAMS
        assert client.portal.call(in_use) == (0, 0)


def test_a_client_that_goes_away_gives_the_slot_back(upstream: Upstream, tmp_path: Path) -> None:
    """Under uvicorn, as hymt web serves it: a client that closes its connection mid-stream
    frees its upstream slot at once, while TorchServe still generates."""
    held = Held()
    upstream.replies[PREDICTIONS] = held
    app = create_app(workdir(tmp_path, upstream.url))
    upstream_slots = app.state.torchserve.upstream
    try:
        with serving(app) as url, httpx.Client(timeout=10) as client:
            with client.stream("POST", f"{url}api/translate", json=BODY) as answer:
                lines = answer.iter_lines()  # kept: a dropped iterator closes the connection
                assert json.loads(next(lines)) == {"delta": "Bon"}
                assert upstream_slots._in_flight == 1
            # the client closed its connection: the relay ends and the slot is free
            _wait_until(lambda: upstream_slots._in_flight == 0)
            assert not held.gate.is_set()  # TorchServe's stream had not ended
    finally:
        held.gate.set()
