"""The serving benchmarks' closed-loop client (``loadtest/serving/client.py``): a request the
server never answers ends at the client's timeout as an error of its level, so one lost
request cannot hold a benchmark run for the default 600 s; a kept-alive user sends all its
requests on one connection and opens a new one when the server closes it."""

from __future__ import annotations

import json
import random
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
from client import (  # noqa: E402
    EXPECTED,
    GOOD,
    UNEXPECTED,
    Job,
    KeptAlive,
    Reply,
    counted_tokens,
    judged,
    run_closed_loop,
    windows,
)
from run_bench import BAD_CHANGES, GpuSampler, made_bad, measure_levels  # noqa: E402


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
            lambda rng: Job(url, {"text": "hello"}, {}, 3), users=2, duration_s=0.2, timeout=0.5
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
            {"system": "test"}, lambda rng: Job(url, {"text": "hello"}, {}, 3), [1], 0.2, sampler,
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
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = 200 if request.get("text") else 400  # as the handler answers an empty text
        body = json.dumps({"translation": "x", "usage": {"output_tokens": 3}}).encode()
        self.send_response(status)
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
        results = [kept.send(Job(url, {"text": "hello"}, {}, 3), timeout=5) for _ in range(4)]
    finally:
        kept.close()
        server.shutdown()
        server.server_close()
    assert results == [Reply(tokens=(3, 0))] * 4
    assert len(handler.connections) == (4 if close_each or drop_each else 1)


@pytest.mark.parametrize("keep_alive", [False, True])
def test_a_bad_request_s_400_is_expected_and_anything_else_is_an_error(keep_alive: bool) -> None:
    """A job bad on purpose that gets its 400 is an expected error, counted apart from the good
    requests and from the errors; a 400 to a good job, or a 200 to a bad one, is an error."""
    handler = type("Handler", (_Translate,), {"connections": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/predictions/hunyuan-mt"
    bodies = [({"text": "hello"}, 200), ({"text": ""}, 400), ({"text": ""}, 200),
              ({"text": "hello"}, 400)]  # fmt: skip

    def make_job(rng: random.Random) -> Job:
        body, expected = bodies[rng.randrange(len(bodies))]
        return Job(url, body, {}, 3, expected_status=expected)

    try:
        stats = run_closed_loop(make_job, users=2, duration_s=0.5, timeout=5, keep_alive=keep_alive)
    finally:
        server.shutdown()
        server.server_close()
    assert stats["requests"] > 0 and stats["expected_errors"] > 0 and stats["errors"] > 0
    samples = " ".join(stats["error_samples"])
    assert "HTTP 400:" in samples or "HTTP 200 (400 expected)" in samples


def test_made_bad_turns_about_the_fraction_into_400s_half_of_each_kind() -> None:
    good = Job("u", {"text": "hello", "target_lang": "fr"}, {}, 7)
    rng = random.Random(1)
    made = [made_bad(good, rng, 0.1) for _ in range(20_000)]
    bad = [job for job in made if job.expected_status == 400]
    assert 1_800 < len(bad) < 2_200
    empty = sum(job.body["text"] == "" for job in bad)
    assert 0.4 < empty / len(bad) < 0.6
    assert all(job.body == {**good.body, **BAD_CHANGES[job.body["text"] != ""]} for job in bad)
    assert all(job.output_tokens == 0 for job in bad)
    assert all(job is good for job in made if job.expected_status == 200)
    untouched = random.Random(1)
    assert (
        made_bad(good, untouched, 0.0) is good and untouched.random() == random.Random(1).random()
    )


def test_windows_count_each_request_where_it_ended() -> None:
    finished = [(100.5, 10.0, GOOD), (100.9, 30.0, GOOD), (101.2, 20.0, GOOD),
                (101.5, 1.0, EXPECTED), (101.6, 2.0, UNEXPECTED), (99.0, 5.0, GOOD),
                (102.0, 40.0, GOOD)]  # fmt: skip
    rows = windows(finished, start=100.0, window_s=1.0, count=2)
    assert [r["requests"] for r in rows] == [2, 1]  # before the start and after the end: none
    assert rows[0]["requests_per_s"] == 2.0 and rows[0]["p50_ms"] == 10.0
    assert rows[0]["p99_ms"] == 30.0 and rows[0]["errors"] == 0
    assert (rows[1]["errors"], rows[1]["expected_errors"], rows[1]["end_s"]) == (1, 1, 2.0)


def test_output_tokens_are_read_from_either_api_s_usage_and_other_lengths_counted() -> None:
    """The request API's usage (output_tokens, input_tokens), OpenAI's (completion_tokens,
    prompt_tokens) and the naive server's top level; a good reply with other output tokens
    than its job asked for is an output mismatch of its level, not an error."""
    ours = {"translation": "x", "usage": {"input_tokens": 26, "output_tokens": 7}}
    openai = {"choices": [], "usage": {"prompt_tokens": 26, "completion_tokens": 7,
                                       "total_tokens": 33}}  # fmt: skip
    naive = {"translation": "x", "output_tokens": 7, "input_tokens": 40}
    assert counted_tokens(ours, 9) == counted_tokens(openai, 9) == (7, 26)
    assert counted_tokens(naive, 9) == (7, 40)
    assert counted_tokens({"translation": "x"}, 9) == (9, 0)  # not said: as asked
    for answer in (ours, openai):
        payload = json.dumps(answer).encode()
        assert judged(Job("u", {}, {}, 7), 200, payload) == Reply(tokens=(7, 26))
        assert judged(Job("u", {}, {}, 8), 200, payload) == Reply(tokens=(7, 26), other_length=True)
    handler = type("Handler", (_Translate,), {"connections": []})  # answers 3 output tokens
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/predictions/hunyuan-mt"
    try:
        asked = [3, 4]  # the second length is one the server never gives
        stats = run_closed_loop(
            lambda rng: Job(url, {"text": "hello"}, {}, asked[rng.randrange(2)]),
            users=2, duration_s=0.5, timeout=5,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert stats["errors"] == 0 and 0 < stats["output_mismatches"] < stats["requests"]
