"""The serving benchmarks' closed-loop client (``loadtest/serving/client.py``): a request the
server never answers ends at the client's timeout as an error of its level, so one lost
request cannot hold a benchmark run for the default 600 s."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "loadtest/serving"))
from client import run_closed_loop  # noqa: E402


def test_an_unanswered_request_is_an_error_after_the_timeout() -> None:
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
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/predictions/hunyuan-mt"
    try:
        started = time.monotonic()
        stats = run_closed_loop(
            lambda rng: (url, {"text": "hello"}, {}, 3), users=2, duration_s=0.2, timeout=0.5
        )
        elapsed = time.monotonic() - started
    finally:
        listener.close()
        for connection in held:
            connection.close()
    assert stats["requests"] == 0 and stats["errors"] == 2  # one per user, then the level ends
    assert "timed out" in stats["error_samples"][0]
    assert elapsed < 5  # the timeout, not the 600 s default
