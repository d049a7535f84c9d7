"""Overload and faults against a real TorchServe with a deliberately small queue.

The server here runs one worker, batches of one request and a job queue of four, so that a
burst overflows it; a test-only setting makes any request asking for 13 new tokens fail its
batch with a device out-of-memory error, and one asking for 11 hangs its worker.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from conftest import FAULTY_HANDLER, MODEL, REPO, locust_run, running_server

from hymt_serve.ops.launcher import Server, model_workers

pytestmark = pytest.mark.integration
OOM_MARKER = 13
HANG_MARKER = 11
HEALTH_TIMEOUT_S = 5
RESPONSE_TIMEOUT_S = 30
QUEUE = 4


@pytest.fixture(scope="module")
def small_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    archive = {
        "batchSize": 1,
        "maxBatchDelay": 10,
        "jobQueueSize": QUEUE,
        "minWorkers": 1,
        "maxWorkers": 1,
        "responseTimeout": RESPONSE_TIMEOUT_S,
        "handler.max_new_tokens": 32,
        "handler.test_oom_max_new_tokens": OOM_MARKER,
        "handler.test_hang_max_new_tokens": HANG_MARKER,
        # Every request repeats one text: each must cost the worker its generation (a full
        # queue, a hang, a kill in flight), not be answered from the translation memory.
        "handler.translation_memory": False,
    }
    config = {"default_response_timeout": str(RESPONSE_TIMEOUT_S)}
    with running_server(
        tiny_model_dir, tmp_path_factory.mktemp("small"), archive, config, handler=FAULTY_HANDLER
    ) as server:
        yield server


def predict(server: Server, max_new_tokens: int = 32, timeout: float = 60) -> tuple[int, float]:
    """(status, seconds) of one translation request."""
    started = time.perf_counter()
    response = requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json={
            "text": "The quick brown fox jumps over the lazy dog.",
            "target_lang": "de",
            "max_new_tokens": max_new_tokens,
        },
        headers=server.headers("inference"),
        timeout=timeout,
    )
    return response.status_code, time.perf_counter() - started


def workers(server: Server) -> list[dict[str, object]]:
    return model_workers(server, MODEL)


def wait_until_ready(server: Server, timeout: float = 120) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = workers(server)
        if current and all(w["status"] == "READY" for w in current):
            return current
        time.sleep(0.5)
    raise AssertionError(f"workers not READY after {timeout} s: {workers(server)}")


def test_out_of_memory_fails_its_batch_with_507_and_the_worker_keeps_serving(
    small_server: Server,
) -> None:
    pid = wait_until_ready(small_server)[0]["pid"]
    response = requests.post(
        f"{small_server.inference_url()}/predictions/{MODEL}",
        json={"text": "hello", "target_lang": "fr", "max_new_tokens": OOM_MARKER},
        headers=small_server.headers("inference"),
        timeout=60,
    )
    assert response.status_code == 507
    assert response.json()["error_type"] == "out_of_memory"
    assert predict(small_server)[0] == 200
    assert workers(small_server)[0]["pid"] == pid


def test_a_burst_beyond_the_queue_gets_fast_503s_and_nothing_hangs(small_server: Server) -> None:
    wait_until_ready(small_server)
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda _: predict(small_server), range(40)))
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 503}, statuses
    rejected = [seconds for status, seconds in results if status == 503]
    assert len(rejected) >= 40 - (QUEUE + 2) * 3  # a queue of 4 cannot hold a burst of 40
    assert max(rejected) < 2.0  # rejected at once, not after waiting
    assert max(seconds for _, seconds in results) < RESPONSE_TIMEOUT_S
    assert statuses.count(200) >= 1
    wait_until_ready(small_server)
    assert predict(small_server)[0] == 200  # healthy once the burst is over


def test_locust_spike_gets_only_fast_rejections(small_server: Server) -> None:
    command, env = locust_run(
        small_server,
        "loadtest/spike.py",
        "spike",
        HYMT_REJECT_MS="2000",
        HYMT_P95_MS=str(RESPONSE_TIMEOUT_S * 1000),
        HYMT_MAX_NEW_TOKENS="32",
        HYMT_SPIKE_USERS="30",
        HYMT_BASE_USERS="1",
        HYMT_STAGE_S="6",
    )
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    print(run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-2000:]
    stats = (REPO / "loadtest/reports/spike_stats.csv").read_text()
    assert ":rejected" in stats  # the spike did overflow the queue
    wait_until_ready(small_server)
    assert predict(small_server)[0] == 200


def test_a_killed_worker_is_restarted_and_in_flight_requests_fail_cleanly(
    small_server: Server,
) -> None:
    pid = int(str(wait_until_ready(small_server)[0]["pid"]))
    results: list[tuple[float, int]] = []
    stop_at = time.monotonic() + 20
    lock = threading.Lock()

    def client() -> None:
        while time.monotonic() < stop_at:
            try:
                status, _ = predict(small_server, timeout=RESPONSE_TIMEOUT_S + 10)
            except requests.RequestException:
                status = -1  # a dropped connection counts as a failure, not a hang
            with lock:
                results.append((time.monotonic(), status))

    threads = [threading.Thread(target=client) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=RESPONSE_TIMEOUT_S + 30)
    assert not any(thread.is_alive() for thread in threads), "a request hung"
    restarted = wait_until_ready(small_server)
    assert restarted[0]["pid"] != pid
    # In-flight requests fail with a 5xx (TorchServe 0.12.0 answers 507 when the worker dies).
    assert all(status == 200 or status == -1 or 500 <= status < 600 for _, status in results)
    before = [status for at, status in results if at < killed_at]
    assert before and set(before) == {200}
    assert predict(small_server)[0] == 200


def health(server: Server) -> tuple[int, str]:
    """``hymt health`` as the container runs it: (exit code, what it printed)."""
    command = [
        sys.executable,
        "-m",
        "hymt_serve.cli",
        "health",
        "--workdir",
        str(server.workdir),
    ]
    run = subprocess.run(
        [*command, "--timeout", str(HEALTH_TIMEOUT_S)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return run.returncode, run.stdout + run.stderr


def until_health(server: Server, code: int, within: float) -> float:
    """Seconds until ``hymt health`` exits with ``code``; fails after ``within`` seconds."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if health(server)[0] == code:
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"hymt health never exited {code} in {within} s: {health(server)}")


def test_health_fails_while_the_worker_is_wedged_and_recovers_after(
    small_server: Server,
) -> None:
    """The describe API keeps saying READY while the worker hangs; health must not."""
    pid = wait_until_ready(small_server)[0]["pid"]
    assert health(small_server)[0] == 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        hung = pool.submit(predict, small_server, HANG_MARKER, RESPONSE_TIMEOUT_S + 60)
        time.sleep(1)
        assert [w["status"] for w in workers(small_server)] == ["READY"]
        code, said = health(small_server)
        assert code == 1 and "no answer within" in said, said
        # TorchServe gives up on the hung batch after responseTimeout and replaces the worker.
        until_health(small_server, 0, RESPONSE_TIMEOUT_S + 120)
        assert hung.result()[0] >= 500
    assert workers(small_server)[0]["pid"] != pid


def test_health_fails_when_the_worker_process_is_gone(small_server: Server) -> None:
    pid = int(str(wait_until_ready(small_server)[0]["pid"]))
    os.kill(pid, signal.SIGKILL)
    assert until_health(small_server, 1, 10) < 10
    until_health(small_server, 0, 120)
