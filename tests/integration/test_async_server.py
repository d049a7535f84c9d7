"""TorchServe's async mode (the GPU profile's setting) on a real server with the tiny model and
the fast engine on the CPU: requests reach the worker as they arrive and the continuous batcher
serves them together; bad requests, streams, overload and an out-of-memory fault stay per
request, and the worker survives all of it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import FAULTY_HANDLER, MODEL, running_server

from hymt_serve.ops.frontend_guard import JAR, URL_PATTERN
from hymt_serve.ops.launcher import Server, model_workers
from hymt_serve.ops.operate import guard_report
from hymt_serve.request.metrics import FLUSH_S

pytestmark = pytest.mark.integration
OOM_MARKER = 9
SLOTS = 2
MAX_WAITING = 6
BURST = {"text": "Burst", "target_lang": "fr", "max_new_tokens": 24}
ERRORS = 1500  # of each kind of 400; a quarter as many overload 503s


@pytest.fixture(scope="module")
def async_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    archive = {
        "asyncCommunication": True,
        "batchSize": 1,
        "minWorkers": 1,
        "maxWorkers": 1,
        "handler.engine": "fast",
        "handler.max_new_tokens": 24,
        "handler.max_batch_rows": SLOTS,
        "handler.max_waiting_rows": MAX_WAITING,
        "handler.test_oom_max_new_tokens": OOM_MARKER,
        # Bursts repeat one text: each must reach the engine's waiting line, not be answered
        # from the translation memory (on, it served them all and none overflowed the line).
        "handler.translation_memory": False,
    }
    folder = tmp_path_factory.mktemp("async")
    with running_server(tiny_model_dir, folder, archive, handler=FAULTY_HANDLER) as server:
        yield server


def post(server: Server, body: Any, timeout: float = 120) -> requests.Response:
    return requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json=body,
        headers=server.headers("inference"),
        timeout=timeout,
    )


def pids(server: Server) -> list[object]:
    return [w["pid"] for w in model_workers(server, MODEL)]


def engine_facts(server: Server) -> dict[str, Any]:
    """The describe API's engine facts: the child process's scheduler counters, which start
    from zero whenever that process is replaced, and the process itself (pid, restarts)."""
    response = requests.get(
        f"{server.management_url()}/models/{MODEL}?customized=true",
        headers=server.headers("management"),
        timeout=30,
    )
    custom = response.json()[0]["customizedMetadata"]
    custom = json.loads(custom) if isinstance(custom, str) else custom
    return dict(custom["engine"])


def burst(server: Server, count: int = 40) -> list[requests.Response]:
    """``count`` requests at once: far more than the slots plus the waiting line take."""
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: post(server, BURST), range(count)))


def test_valid_bad_and_streaming_requests_in_flight_together(async_server: Server) -> None:
    before = pids(async_server)
    valid = {"text": "The weather is nice today.", "target_lang": "fr", "max_new_tokens": 8}
    bodies: list[Any] = [
        valid,
        {"text": "x", "target_lang": "klingon"},
        {"text": "Streamed, please.", "target_lang": "de", "stream": True},
        {"text": ["one", "two"], "target_lang": "ja", "max_new_tokens": 4},
        {"text": "x", "target_lang": "fr", "max_new_tokens": 10_000},
        {"text": "x", "target_lang": "fr", "surprise": 1},
    ]
    expected = [200, 400, 200, 200, 400, 400]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda b: post(async_server, b), bodies))
    assert [r.status_code for r in responses] == expected
    assert responses[0].json()["usage"]["output_tokens"] == 8
    assert len(responses[3].json()["translations"]) == 2
    for response in (responses[1], responses[4], responses[5]):
        assert response.json()["error"] and response.json()["request_id"]
    lines = [json.loads(line) for line in responses[2].text.splitlines()]
    assert responses[2].headers["content-type"].startswith("application/x-ndjson")
    assert "".join(line.get("delta", "") for line in lines[:-1]) == lines[-1]["translation"]
    assert pids(async_server) == before


def test_a_burst_beyond_the_waiting_line_gets_fast_503s(async_server: Server) -> None:
    responses = burst(async_server)
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503} and statuses.count(200) >= SLOTS + MAX_WAITING
    refused = [r.json() for r in responses if r.status_code == 503]
    assert refused and all(body["error_type"] == "overloaded" for body in refused)
    assert post(async_server, BURST).status_code == 200  # healthy afterwards


def test_out_of_memory_fails_only_its_request(async_server: Server) -> None:
    before = pids(async_server)
    bodies = [{"text": f"Row {i}", "target_lang": "fr", "max_new_tokens": 6} for i in range(4)]
    bodies.insert(2, {"text": "doomed", "target_lang": "fr", "max_new_tokens": OOM_MARKER})
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda b: post(async_server, b), bodies))
    assert [r.status_code for r in responses] == [200, 200, 507, 200, 200]
    assert responses[2].json()["error_type"] == "out_of_memory"
    assert pids(async_server) == before


def test_describe_shows_the_continuous_scheduler(async_server: Server) -> None:
    """The counters move with this test's own burst: no earlier test's traffic is needed (the
    counters live in the engine process and start again from zero when it is replaced)."""
    before = engine_facts(async_server)
    statuses = [r.status_code for r in burst(async_server)]
    assert 200 in statuses and 503 in statuses  # the burst both finished and refused rows
    after = engine_facts(async_server)
    assert after["process"] == before["process"]  # same engine process: comparable counters
    scheduler = after["scheduler"]
    assert scheduler["scheduler"] == "continuous" and scheduler["slots"] == SLOTS
    assert scheduler["finished"] >= before["scheduler"]["finished"] + statuses.count(200)
    assert scheduler["rejected"] >= before["scheduler"]["rejected"] + statuses.count(503)


def test_a_dead_engine_process_is_replaced_in_the_same_worker(async_server: Server) -> None:
    def engine_process() -> dict[str, int]:
        return dict(engine_facts(async_server)["process"])

    worker, child = pids(async_server), engine_process()
    body = {"text": "Long one", "target_lang": "fr", "max_new_tokens": 24}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(post, async_server, body) for _ in range(4)]
        os.kill(child["pid"], signal.SIGKILL)
        statuses = [future.result().status_code for future in pending]
    assert set(statuses) <= {200, 500, 503}  # done before the kill, failed with it, or refused
    deadline = time.monotonic() + 120
    while post(async_server, body).status_code != 200:
        assert time.monotonic() < deadline, "no successful translation after the restart"
        time.sleep(1)
    after = engine_process()
    assert after["pid"] != child["pid"] and after["restarts"] == child["restarts"] + 1
    assert pids(async_server) == worker


def test_metrics_are_exported_in_async_mode(async_server: Server) -> None:
    """Counters and gauges reach TorchServe coalesced, at most FLUSH_S after the update."""
    assert post(async_server, {"text": "metrics", "target_lang": "ko"}).status_code == 200
    assert post(async_server, {"text": "x", "target_lang": "nope"}).status_code == 400
    wanted = [
        *(f"\n{name}{{" for name in ("hymt_requests_total", "hymt_output_tokens_total")),
        "\nhymt_engine_info{", 'ErrorType="unsupported_language"', 'Engine="fast"',
    ]  # fmt: skip
    deadline = time.monotonic() + 10 * FLUSH_S
    while True:
        text = requests.get(f"{async_server.metrics_url()}/metrics", timeout=10).text
        missing = [part for part in wanted if part not in text]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not missing, missing


def test_grpc_in_async_mode_answers_whole_and_never_wedges(
    async_server: Server, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The async handler path applies the same gRPC rules as the batch one."""
    import grpc
    from grpc_clients import GrpcClient, compile_protos

    client = GrpcClient(async_server, compile_protos(tmp_path_factory.mktemp("async-stubs")))
    before = pids(async_server)
    body = {"text": "hello", "target_lang": "fr", "max_new_tokens": 3}
    assert isinstance(client.predict(body)["translation"], str)
    assert client.predict({**body, "stream": True})["field"] == "stream"
    assert len(client.stream(body)) == 1
    for keep_open in (False, True):
        with pytest.raises(grpc.RpcError):
            client.stream2(body, keep_open=keep_open)

    def refused_stream2(_: int) -> None:
        with pytest.raises(grpc.RpcError):
            client.stream2(body, keep_open=False)

    # A StreamPredictions2 request gets no reply; TorchServe's async front end then clears the
    # jobs it has polled but not yet sent. Requests running beside them must not be lost.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        plain = [pool.submit(post, async_server, body, 60) for _ in range(40)]
        list(pool.map(refused_stream2, range(8)))
        statuses = [future.result().status_code for future in plain]  # none hangs
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 10  # 503: a full queue
    assert post(async_server, body).status_code == 200
    assert pids(async_server) == before
    log = (async_server.log_dir / "ts_log.log").read_text(encoding="utf-8", errors="replace")
    assert "Stream is already completed" not in log


def live_request_objects(server: Server) -> int:
    """The front end's live request objects (``RestJob``) after a full GC, from the JVM's
    class histogram (``jcmd``, beside the ``java`` that runs the front end)."""
    pid = server.pid()
    assert pid is not None
    jcmd = Path(os.readlink(f"/proc/{pid}/exe")).parent / "jcmd"
    if not jcmd.exists():
        pytest.skip(f"no jcmd beside the front end's java ({jcmd})")
    for _ in range(3):  # attaching can time out on a busy machine
        done = subprocess.run(
            [str(jcmd), str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=120
        )
        if done.returncode == 0:
            break
        time.sleep(2)
    assert done.returncode == 0, done.stdout + done.stderr
    counts = [line.split() for line in done.stdout.splitlines()]
    return sum(int(c[1]) for c in counts if len(c) >= 4 and c[3] == "org.pytorch.serve.job.RestJob")


def test_the_front_end_forgets_answered_requests(async_server: Server) -> None:
    """TorchServe 0.12.0's front end keeps an async-mode request until a reply marked as a
    stream's last part; the handler sends every successful HTTP reply that way, and our
    front-end plugin forgets the others (error replies) once they are written, so no request
    stays in the front end's heap (before, every plain one did:
    benchmarks/serving/frontend_jobs/)."""
    bodies: list[Any] = [
        {"text": "Good morning.", "target_lang": "fr", "max_new_tokens": 4},
        {"text": "x", "target_lang": "klingon"},
        {"text": "Streamed.", "target_lang": "de", "max_new_tokens": 4, "stream": True},
    ]
    before = live_request_objects(async_server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda i: post(async_server, bodies[i % 3]), range(120)))
    assert [r.status_code for r in responses] == [200, 400, 200] * 40
    assert all(r.json()["translation"] for r in responses[::3])
    assert all("translation" in r.text.splitlines()[-1] for r in responses[2::3])
    kept = live_request_objects(async_server) - before
    assert kept <= 5  # a few other requests at the time, e.g. describes
    assert all(r.headers["transfer-encoding"] == "chunked" for r in responses[::3])


def guard_counts(server: Server) -> dict[str, Any]:
    response = requests.get(
        f"{server.management_url()}/{URL_PATTERN}", headers=server.headers("management"), timeout=30
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_error_replies_leave_the_front_end_like_answers(async_server: Server) -> None:
    """Every error reply in async mode stayed in TorchServe 0.12.0's front end for good (its map
    forgets a request only at a stream's last part; an error reply cannot be one): about 4 KB
    of heap each. Our front-end plugin forgets a request once its last reply is written,
    whatever it was: the handler's 400s and overload 503s, describe calls, TorchServe's own
    413s (those never reach the map)."""
    empty = {"text": "", "target_lang": "fr"}
    unknown = {"text": "x", "target_lang": "klingon"}
    huge = {"text": "x" * 7_000_000, "target_lang": "fr"}  # over max_request_size
    before, held = live_request_objects(async_server), guard_counts(async_server)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: post(async_server, (empty, unknown)[i % 2]).status_code,
                                 range(ERRORS * 2)))  # fmt: skip
        overloaded = 0
        while overloaded < ERRORS // 4:  # fast 503s from the handler's full waiting line
            overloaded += [r.status_code for r in burst(async_server, 48)].count(503)
        describe = f"{async_server.management_url()}/models/{MODEL}?customized=true"
        headers = async_server.headers("management")
        described = list(pool.map(lambda _: requests.get(describe, headers=headers, timeout=60),
                                  range(100)))  # fmt: skip
        too_big = [post(async_server, huge).status_code for _ in range(3)]
    assert statuses == [400] * (ERRORS * 2)
    assert [r.status_code for r in described] == [200] * 100 and too_big == [413] * 3
    kept = live_request_objects(async_server) - before
    assert kept <= 10, f"{kept} request objects kept after {ERRORS * 2 + overloaded + 103} errors"
    counts = guard_counts(async_server)  # requests in the workers' maps, as the plugin counts
    assert counts["in_backend"] <= held["in_backend"] + 2, (held, counts)
    assert counts["forgotten"] >= held["forgotten"] + ERRORS * 2 + overloaded + 100, counts
    assert counts["late_replies"] == 0, counts


def test_every_worker_gets_a_thread_safe_request_map(async_server: Server) -> None:
    """TorchServe 0.12.0's async request map is a plain LinkedHashMap used by two threads (a
    lookup can miss under load, and a worker's requests then go unanswered); our front-end
    plugin swaps it for a ConcurrentHashMap in each worker before its model is loaded. Its jar
    is committed, so this holds without a JDK too."""
    assert JAR.is_file(), "the plugin's jar is committed (handler/hymt_serve/ops/frontend_guard/)"
    assert Server(async_server.workdir).properties()["plugins_path"] == str(JAR.parent)
    response = requests.get(
        f"{async_server.management_url()}/{URL_PATTERN}",
        headers=async_server.headers("management"),
        timeout=30,
    )
    assert response.status_code == 200, response.text
    unkeyed = requests.get(f"{async_server.management_url()}/{URL_PATTERN}", timeout=30)
    assert unkeyed.status_code != 200  # behind the management key, as the whole API
    counts = response.json()
    workers = len(model_workers(async_server, MODEL))
    # every worker of this server, the replacement of a killed engine's worker included
    assert counts["guarded"] >= workers >= 1, counts
    assert counts["unguarded"] == 0, counts
    assert counts["scan_errors"] == 0, counts
    log = (async_server.log_dir / "ts_log.log").read_text(errors="replace")
    assert "request map is now thread-safe" in log
    assert guard_report(async_server).startswith("front-end guard: active (")  # hymt health


def test_the_front_end_writes_no_log_line_per_request(async_server: Server) -> None:
    """TorchServe 0.12.0's own log configuration wrote about ten lines per request to ts_log.log
    and again to the server's output (logs/start.log, which nothing rotates); `hymt start`
    passes ours (handler/hymt_serve/ops/log4j2.xml): the access log keeps one line a request."""
    logs = async_server.log_dir
    names = ("start.log", "ts_log.log", "model_log.log", "access_log.log")

    def lines() -> dict[str, int]:
        return {n: len((logs / n).read_bytes().splitlines()) for n in names}

    before = lines()
    body = {"text": "Good morning.", "target_lang": "fr", "max_new_tokens": 4}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: post(async_server, body), range(40)))
    assert [r.status_code for r in responses] == [200] * 40
    time.sleep(1)  # the access line is written after the reply
    grown = {n: count - before[n] for n, count in lines().items()}
    assert grown["access_log.log"] >= 40, grown
    for name in ("start.log", "ts_log.log", "model_log.log"):
        assert grown[name] < 10, grown  # none per request (a metrics flush or two may log)
    # what is not per request stays: the server's start-up, the handler's own lines
    assert "Torchserve version: 0.12.0" in (logs / "ts_log.log").read_text(errors="replace")
    assert "handler ready" in (logs / "model_log.log").read_text(errors="replace")


HANG_MARKER = 7


@pytest.fixture
def hanging_server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Server]:
    """A server of its own: this test kills its worker."""
    archive = {
        "asyncCommunication": True,
        "batchSize": 1,
        "minWorkers": 1,
        "maxWorkers": 1,
        "handler.engine": "fast",
        "handler.max_new_tokens": 24,
        "handler.test_hang_max_new_tokens": HANG_MARKER,
    }
    with running_server(tiny_model_dir, tmp_path, archive, handler=FAULTY_HANDLER) as server:
        yield server


def test_requests_of_a_dead_worker_get_503_and_leave(hanging_server: Server) -> None:
    """TorchServe 0.12.0 never answers an async-mode request whose worker process died: its
    client waited until its own timeout, and the request stayed in the front end for good. Our
    front-end plugin answers it 503 "Worker died." once the connection to that process has been
    closed for 2 s, and forgets it."""
    body = {"text": "hang", "target_lang": "fr", "max_new_tokens": HANG_MARKER}
    held = guard_counts(hanging_server)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(post, hanging_server, body, 30) for _ in range(3)]
        deadline = time.monotonic() + 30
        while guard_counts(hanging_server)["in_backend"] < held["in_backend"] + 3:
            assert time.monotonic() < deadline, "the requests never reached the worker"
            time.sleep(0.2)
        killed = time.monotonic()
        os.kill(int(str(pids(hanging_server)[0])), signal.SIGKILL)
        responses = [future.result() for future in pending]  # a hang here: 30 s, then fails
    assert [r.status_code for r in responses] == [503] * 3
    assert all("Worker died." in r.text for r in responses)
    assert time.monotonic() - killed < 15
    counts = guard_counts(hanging_server)
    assert counts["worker_died"] >= held["worker_died"] + 3, counts
    assert counts["in_backend"] == held["in_backend"], counts
