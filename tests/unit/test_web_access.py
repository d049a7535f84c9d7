"""Who may call the web front end and how its clients share TorchServe: the app against the
stub TorchServe of test_web_app (no TorchServe)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Mount, Route
from starlette.testclient import TestClient
from web_stub import DESCRIBE, MODEL, PREDICTIONS, Upstream, client_keys, opened, workdir
from werkzeug.wrappers import Request, Response

from hymt_serve.ops import launcher
from hymt_serve.ops.launcher import KEY_FILE
from hymt_serve.web import fairness
from hymt_serve.web.access import ALWAYS_OPEN, OWN_KEYS
from hymt_serve.web.app import create_app, is_loopback
from hymt_serve.web.keys import ClientKeys

TRANSLATED = {"translation": "x", "translations": [{"text": "x"}], "usage": {}}


def _auth(keys: ClientKeys, index: int = 0) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys.keys[index].key}"}


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json")


@contextmanager
def _app(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys, **options: Any
) -> Iterator[TestClient]:
    app = create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys, **options)
    with opened(app) as client:
        yield client


# --- the rule: open on loopback, keys everywhere else -----------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
     ("example.internal", False)],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_off_loopback_every_route_but_the_page_and_probes_needs_a_key(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    """Each route of the app, called without a key, is refused unless it is meant to be open:
    a route added later without a decision fails here."""
    upstream.reply(PREDICTIONS, TRANSLATED)
    app = create_app(
        workdir(tmp_path, upstream.url), MODEL, client_keys=keys, require_keys=True,
        refine_model="chimera",
    )  # fmt: skip
    names = set()
    with opened(app) as client:
        for route in app.routes:
            assert isinstance(route, Route | Mount), route
            names.add(route.name)
            path = route.path.replace("{name}", MODEL).replace("{document_id}", "0" * 32)
            methods = (route.methods or set()) if isinstance(route, Route) else {"GET"}
            if isinstance(route, Mount):  # the page's files
                path += "/app.js"
            for method in sorted(methods - {"HEAD", "OPTIONS"}):
                answer = client.request(method, path, json={"text": "a", "target_lang": "de"})
                if route.name in ALWAYS_OPEN:
                    assert answer.status_code not in (401, 403), (route.path, method)
                else:
                    refused = (route.path, method, answer.status_code)
                    assert answer.status_code in (401, 403), refused
                    assert answer.headers["Content-Type"] == "application/json"
        unknown = client.get("/no/such/route")
        assert unknown.status_code == 401 and unknown.headers["Content-Type"] == "application/json"
    assert not upstream.forwarded()
    assert names >= OWN_KEYS


def test_off_loopback_the_page_api_counts_characters_against_the_key(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, TRANSLATED)
    with _app(upstream, tmp_path, keys, require_keys=True) as client:
        body = {"text": ["abc", "de"], "target_lang": "fr", "stream": False}
        assert client.post("/api/translate", json=body, headers=_auth(keys)).status_code == 200
        assert keys.used(keys.keys[0]) == 5 and keys.used(keys.keys[1]) == 0
        upstream.reply(PREDICTIONS, {"error": "bad", "error_type": "invalid_request"}, 400)
        assert client.post("/api/translate", json=body, headers=_auth(keys)).status_code == 400
        assert keys.used(keys.keys[0]) == 5  # a refused request is given back
        poor = client_keys(tmp_path / "poor.json", ("carol",), limit=3)
    with _app(upstream, tmp_path, poor, require_keys=True) as client:
        over = client.post("/api/translate", json=body, headers=_auth(poor))
        assert over.status_code == 429 and over.json()["error_type"] == "quota_exceeded"
        assert client.get("/api/config").status_code == 401
        assert client.get("/").status_code == 200


def test_on_loopback_the_page_api_is_open_and_counts_nothing(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, TRANSLATED)
    with _app(upstream, tmp_path, keys) as client:
        body = {"text": "abc", "target_lang": "fr", "stream": False}
        assert client.post("/api/translate", json=body).status_code == 200
        assert keys.used(keys.keys[0]) == 0
        answer = client.post("/translate", json={"q": "a", "source": "en", "target": "de"})
        assert answer.status_code == 403  # the compatible APIs ask for their keys everywhere


# --- TorchServe's key file while TorchServe rewrites it ---------------------------------------


def test_a_half_written_key_file_is_a_503_not_a_500(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "KEY_FILE_WAIT_S", 0.1)
    upstream.reply(PREDICTIONS, TRANSLATED)
    with _app(upstream, tmp_path, keys) as client:
        body = {"text": "abc", "target_lang": "fr", "stream": False}
        (tmp_path / KEY_FILE).write_text('{"inference": {"ke')
        for path, payload in (
            ("/api/translate", body),
            ("/api/translate", {**body, "stream": True}),
        ):
            answer = client.post(path, json=payload)
            assert answer.status_code == 502 and answer.json()["error_type"] == "server_unavailable"
        libre = {"q": "a", "source": "en", "target": "de", "api_key": keys.keys[0].key}
        answer = client.post("/translate", json=libre)
        assert answer.status_code == 502 and "cannot be reached" in answer.json()["error"]


def test_a_key_file_finished_while_waiting_is_read(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, TRANSLATED)
    with _app(upstream, tmp_path, keys) as client:
        path = tmp_path / KEY_FILE
        whole = path.read_text()
        path.write_text(whole[:10])
        threading.Timer(0.2, path.write_text, (whole,)).start()
        body = {"text": "abc", "target_lang": "fr", "stream": False}
        assert client.post("/api/translate", json=body).status_code == 200
        assert upstream.forwarded()[-1].headers["Authorization"] == "Bearer inference-key"


# --- one huge request among others ------------------------------------------------------------


class Counting:
    """A predictions route that counts the calls in flight and answers each text."""

    def __init__(self, delay: float = 0.005) -> None:
        self.delay, self.in_flight, self.most, self.calls = delay, 0, 0, 0
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Response:
        with self.lock:
            self.in_flight += 1
            self.calls += 1
            self.most = max(self.most, self.in_flight)
        time.sleep(self.delay)
        texts = json.loads(request.get_data())["text"]
        with self.lock:
            self.in_flight -= 1
        body = {"translations": [{"text": t.upper()} for t in texts]}
        return Response(json.dumps(body), content_type="application/json")


def test_a_huge_libretranslate_request_is_sent_a_window_at_a_time(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    route = Counting()
    upstream.replies[PREDICTIONS] = route
    with _app(upstream, tmp_path, keys) as client:
        texts = [f"t{i}" for i in range(2000)]
        libre = {"q": texts, "source": "en", "target": "de", "api_key": keys.keys[0].key}
        answer = client.post("/translate", json=libre)
        assert answer.status_code == 200
        assert answer.json()["translatedText"] == [t.upper() for t in texts]
        assert route.calls == 2000 // fairness.BULK_CHUNK and route.most <= fairness.BULK_ALONE


def test_a_huge_request_sends_one_chunk_at_a_time_while_others_translate(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    """Users' single texts beside a 400-text request: while any user's call is in flight, at
    most one chunk of the huge request is (the batch stays theirs)."""
    seen = {"users": 0, "bulk": 0, "bulk_beside_users": 0}
    lock = threading.Lock()

    def route(request: Request) -> Response:
        texts = json.loads(request.get_data())["text"]
        kind = "bulk" if len(texts) > 1 else "users"
        with lock:
            seen[kind] += 1
            if seen["users"]:
                seen["bulk_beside_users"] = max(seen["bulk_beside_users"], seen["bulk"])
        time.sleep(0.005)
        with lock:
            seen[kind] -= 1
        body = {"translations": [{"text": t} for t in texts]}
        return Response(json.dumps(body), content_type="application/json")

    upstream.replies[PREDICTIONS] = route
    with _app(upstream, tmp_path, keys) as client:
        base = {"source": "en", "target": "de", "api_key": keys.keys[0].key}
        done = threading.Event()

        def user() -> None:
            while not done.is_set():
                assert client.post("/translate", json={**base, "q": "a"}).status_code == 200

        users = [threading.Thread(target=user) for _ in range(4)]
        for thread in users:
            thread.start()
        huge = client.post("/translate", json={**base, "q": ["b"] * 400})
        done.set()
        for thread in users:
            thread.join()
        assert huge.status_code == 200 and len(huge.json()["translatedText"]) == 400
        assert seen["bulk_beside_users"] == fairness.BULK_SHARED


def test_the_front_end_never_fills_torchserves_queue(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    """Twelve requests of 200 texts at once, against a queue of 8: never more than six calls in
    flight (three quarters of the queue), and every request answered."""
    upstream.reply(DESCRIBE, [{"jobQueueStatus": {"remainingCapacity": 8, "pendingRequests": 0}}])
    route = Counting(delay=0.01)
    upstream.replies[PREDICTIONS] = route
    with _app(upstream, tmp_path, keys) as client:
        libre = {"q": ["a"] * 200, "source": "en", "target": "de", "api_key": keys.keys[0].key}
        statuses: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: statuses.append(client.post("/translate", json=libre).status_code)
            )
            for _ in range(12)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert statuses == [200] * 12
        assert route.most <= 6


def test_too_many_requests_of_one_key_get_429(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    gate = threading.Event()

    def held(request: Request) -> Response:
        gate.wait(5)
        return Response(json.dumps(TRANSLATED), content_type="application/json")

    upstream.replies[PREDICTIONS] = held
    with _app(upstream, tmp_path, keys, limits=fairness.KeyLimits(per_key=2)) as client:
        body = {"text": ["a"], "target_lang": "DE", "auth_key": keys.keys[0].key}
        answers: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(client.post("/v2/translate", json=body).status_code)
            )
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        third = client.post("/v2/translate", json=body)
        other = {**body, "auth_key": keys.keys[1].key}
        other_thread = threading.Thread(
            target=lambda: answers.append(client.post("/v2/translate", json=other).status_code)
        )
        other_thread.start()
        gate.set()
        for thread in [*threads, other_thread]:
            thread.join()
        assert third.status_code == 429 and "at most 2" in third.json()["message"]
        assert third.headers["Retry-After"]
        assert answers == [200, 200, 200]


def test_torchserves_busy_answer_says_to_retry_not_to_scale(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fairness, "BUSY_BACKOFF_S", 0.001)
    message = (
        'Model "hunyuan-mt" has no worker to serve inference request. '
        "Please use scale workers API to add workers."
    )
    upstream.reply(
        PREDICTIONS, {"code": 503, "type": "ServiceUnavailableException", "message": message}, 503
    )
    with _app(upstream, tmp_path, keys) as client:
        libre = {"q": ["a"], "source": "en", "target": "de", "api_key": keys.keys[0].key}
        answer = client.post("/translate", json=libre)
        assert answer.status_code == 503 and answer.headers["Retry-After"]
        assert "scale" not in answer.json()["error"] and "retry" in answer.json()["error"]
        assert keys.used(keys.keys[0]) == 0
