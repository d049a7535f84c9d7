"""`hymt drain` against a real TorchServe under a steady stream of requests: the preStop
sequence of the Helm chart (deploy/helm/hunyuan-mt). Readiness (`hymt health`) fails as soon as
the drain starts, the drain returns only once every request sent before the endpoints were
gone has been answered, and none of them is lost; then the server stops."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from conftest import MODEL, running_server

from hymt_serve.ops.launcher import Server, stop

pytestmark = pytest.mark.integration

ENDPOINT_WAIT = 3.0  # seconds requests keep arriving after the drain starts (proxies lagging)
# Two to five seconds each on the tiny model with two CPU workers (random weights generate to
# the limit): longer than the drain's settle time, so requests are still being generated when
# the wait ends. (When each worker took every core, a busy neighbour made them 15-30 s.)
SLOW_BODY = {
    "text": ["A sentence to translate, slowly."] * 2,
    "target_lang": "de",
    "max_new_tokens": 200,
}
CLIENTS = 6


@dataclass
class Sent:
    started: float
    finished: float = 0.0
    status: int = 0


@pytest.fixture(scope="module")
def draining_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A server of its own: the drain leaves it out of rotation for good."""
    overrides = {
        "maxBatchDelay": 50,
        "handler.max_new_tokens": 400,
        "minWorkers": 2,
        # SLOW_BODY again and again: each must be generated (slowly), not recalled at once
        # from the translation memory, or nothing is in flight when the drain waits.
        "handler.translation_memory": False,
    }
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("drain"), overrides) as server:
        yield server


def _client(server: Server, until: threading.Event, sent: list[Sent], delay: float) -> None:
    """Send requests one after the other until ``until`` is set (at least one)."""
    time.sleep(delay)  # staggered, so that requests start all the time
    session = requests.Session()
    while True:
        sent.append(_send(server, session))
        if until.is_set():
            return


def _send(server: Server, session: requests.Session) -> Sent:
    record = Sent(time.monotonic())
    try:
        response = session.post(
            f"{server.inference_url()}/predictions/{MODEL}",
            json=SLOW_BODY,
            headers=server.headers("inference"),
            timeout=120,
        )
        record.status = response.status_code
    except requests.RequestException:
        record.status = -1
    record.finished = time.monotonic()
    return record


def _hymt(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "hymt_serve.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)


def test_drain_fails_readiness_then_waits_for_every_request(draining_server: Server) -> None:
    server, workdir = draining_server, str(draining_server.workdir)
    assert _hymt("health", "--workdir", workdir).returncode == 0
    endpoints_gone = threading.Event()
    sent: list[Sent] = []
    clients = [
        threading.Thread(target=_client, args=(server, endpoints_gone, sent, 0.4 * i))
        for i in range(CLIENTS)
    ]
    for client in clients:
        client.start()
    time.sleep(4.0)  # a steady stream, some requests answered already

    drain_started = time.monotonic()
    drain = subprocess.Popen(
        [sys.executable, "-m", "hymt_serve.cli", "drain", "--workdir", workdir,
         "--endpoint-wait", str(ENDPOINT_WAIT), "--timeout", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    while not server.drain_marker.exists() and drain.poll() is None:
        time.sleep(0.02)
    marked = time.monotonic()  # the drain's endpoint wait starts here
    # Requests that still arrive while the endpoint removal spreads (new connections).
    one_each = threading.Event()
    one_each.set()
    late = [threading.Thread(target=_client, args=(server, one_each, sent, 0.0)) for _ in range(2)]
    for client in late:
        client.start()
    readiness = _hymt("health", "--workdir", workdir)
    flipped = time.monotonic() - marked
    assert readiness.returncode == 1 and "draining" in readiness.stderr, readiness.stderr
    assert _hymt("health", "--liveness", "--workdir", workdir).returncode == 0  # not a failure

    time.sleep(max(0.0, marked + ENDPOINT_WAIT - time.monotonic()))
    endpoints_gone.set()  # the pod has left the endpoints: no new requests from here on
    output, _ = drain.communicate(timeout=120)
    drained = time.monotonic()
    for client in clients + late:
        client.join(timeout=120)

    assert drain.returncode == 0, output
    assert "drained" in output, output
    assert flipped < ENDPOINT_WAIT, f"readiness failed only {flipped:.1f} s into the drain"
    before = [s for s in sent if s.started < drain_started]
    during = [s for s in sent if drain_started <= s.started < marked + ENDPOINT_WAIT]
    assert before and during, (len(before), len(during))
    # No request lost: everything sent before the drain, and while endpoints were still being
    # removed, was answered with a translation, and before the drain said it was done.
    assert [s.status for s in before + during] == [200] * len(before + during)
    assert max(s.finished for s in before + during) <= drained
    # The drain waited for work in flight: some requests were still running after the wait.
    assert any(s.finished > marked + ENDPOINT_WAIT for s in before + during)

    stop(server)
    assert server.pid() is None
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.inference_url()}/ping", timeout=5)
