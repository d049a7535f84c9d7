"""The serving benchmarks' closed-loop client (``loadtest/serving/client.py``): a request the
server never answers ends at the client's timeout as an error of its level, so one lost
request cannot hold a benchmark run for the default 600 s; a kept-alive user sends all its
requests on one connection and opens a new one when the server closes it."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "loadtest/serving"))
from client import KeptAlive, run_closed_loop  # noqa: E402
from run_bench import GpuSampler, measure_levels  # noqa: E402


def silent_server() -> tuple[socket.socket, str, list[socket.socket]]:
    """A listener that accepts connections and never answers, its translation URL and the
    connections it holds."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept_and_stay_silent() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            held.append(connection)  # read nothing, answer nothing

    threading.Thread(target=accept_and_stay_silent, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}/predictions/hunyuan-mt", held


def close(listener: socket.socket, held: list[socket.socket]) -> None:
    listener.close()
    for connection in held:
        connection.close()


def test_an_unanswered_request_is_an_error_after_the_timeout() -> None:
    listener, url, held = silent_server()
    try:
        started = time.monotonic()
        stats = run_closed_loop(
            lambda rng: (url, {"text": "hello"}, {}, 3), users=2, duration_s=0.2, timeout=0.5
        )
        elapsed = time.monotonic() - started
    finally:
        close(listener, held)
    assert stats["requests"] == 0 and stats["errors"] == 2  # one per user, then the level ends
    assert "timed out" in stats["error_samples"][0]
    assert elapsed < 5  # the timeout, not the 600 s default


def test_a_level_with_errors_saves_before_its_row_is_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """run_bench keeps TorchServe's log of a level with errors even when the run is cut short
    right after it (as one stalled level of a GPU run was): ``on_errors`` runs before the
    level's row is printed."""
    listener, url, held = silent_server()
    printed_before: list[str] = []
    sampler = GpuSampler.__new__(GpuSampler)  # no nvidia-smi thread: no samples
    sampler.samples = []
    try:
        rows = measure_levels(
            {"system": "test"}, lambda rng: (url, {"text": "hello"}, {}, 3), [1], 0.2, sampler,
            timeout=0.3, on_errors=lambda: printed_before.append(capsys.readouterr().out),
        )  # fmt: skip
    finally:
        close(listener, held)
    assert rows[0]["errors"] == 1
    assert printed_before == [""]  # called once, with the level's row not printed yet
    assert json.loads(capsys.readouterr().out)["errors"] == 1


class _Translate(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps connections open unless told otherwise
    close_each = False  # say "Connection: close" on each reply
    drop_each = False  # close each connection after its reply without saying so
    connections: ClassVar[list[int]] = []  # one entry per accepted connection

    def setup(self) -> None:  # the server makes one handler per connection
        super().setup()
        type(self).connections.append(1)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"translation": "x", "usage": {"output_tokens": 3}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_each:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        if self.drop_each:
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("close_each", "drop_each"), [(False, False), (True, False), (False, True)]
)
def test_a_kept_alive_user_reuses_its_connection_and_survives_closes(
    close_each: bool, drop_each: bool
) -> None:
    settings = {"close_each": close_each, "drop_each": drop_each, "connections": []}
    handler = type("Handler", (_Translate,), settings)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/predictions/hunyuan-mt"
    kept = KeptAlive()
    try:
        results = [kept.send((url, {"text": "hello"}, {}, 3), timeout=5) for _ in range(4)]
    finally:
        kept.close()
        server.shutdown()
        server.server_close()
    assert results == [((3, 0), None)] * 4
    assert len(handler.connections) == (4 if close_each or drop_each else 1)
