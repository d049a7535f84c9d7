"""A stub TorchServe for the web front end's tests (a local WSGI server): it records what the
app forwarded and answers what each test tells it to, including the shapes TorchServe itself
produces (``{code, type, message}`` errors, an empty 413). ``tests/unit/conftest.py`` serves it
as the ``upstream`` fixture. :func:`opened` drives the front end's app in process
(Starlette's test client, one event loop for all its requests, the lifespan run);
:func:`serving` serves it on a free port with uvicorn, as ``hymt web`` does."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.testclient import TestClient
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from hymt_serve.ops.launcher import KEY_FILE, Server
from hymt_serve.web.keys import ClientKeys

MODEL = "hunyuan-mt"
PREDICTIONS = f"/predictions/{MODEL}"
DESCRIBE = f"/models/{MODEL}"
KEYS = {"inference": {"key": "inference-key"}, "management": {"key": "management-key"}}


@dataclass
class Forwarded:
    """One request the stub received."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Upstream:
    """A stub TorchServe: ``replies`` by path (a Response or a function of the request)."""

    url: str = ""
    replies: dict[str, Callable[[Request], Response]] = field(default_factory=dict)
    received: list[Forwarded] = field(default_factory=list)

    def reply(self, path: str, body: Any, status: int = 200, mimetype: str | None = None) -> None:
        """Answer ``path`` with ``body`` (bytes as they are, anything else as JSON)."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        kind = mimetype or ("application/json" if raw else None)
        self.replies[path] = lambda _request: response(raw, status, kind)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        self.received.append(Forwarded(request.path, dict(request.headers), request.get_data()))
        answer = self.replies.get(request.path, lambda _r: response(b"", 404, None))
        return answer(request)(environ, start_response)

    def forwarded(self, path: str = PREDICTIONS) -> list[Forwarded]:
        return [seen for seen in self.received if seen.path == path]


def response(raw: bytes, status: int, mimetype: str | None) -> Response:
    response = Response(raw, status=status)
    if mimetype is None:  # TorchServe's 413: no body, no content type
        del response.headers["Content-Type"]
    else:
        response.headers["Content-Type"] = mimetype
    return response


def serve_stub() -> Iterator[Upstream]:
    """A stub on a free local port, for as long as the generator is not closed."""
    stub = Upstream()
    server = make_server("127.0.0.1", 0, stub, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_port}"
    yield stub
    server.shutdown()


def workdir(path: Path, url: str) -> Server:
    (path / "config.properties").write_text(
        f"inference_address={url}\nmanagement_address={url}\n", encoding="utf-8"
    )
    (path / KEY_FILE).write_text(json.dumps(KEYS), encoding="utf-8")
    return Server(path)


def client_keys(
    path: Path, names: tuple[str, ...] = ("alice", "bøb"), limit: int = 1_000_000
) -> ClientKeys:
    """A key file of the front end with one key per name, each with ``limit`` characters."""
    entries = [{"name": n, "key": f"{n}-key-0123456789ab", "character_limit": limit} for n in names]
    path.write_text(json.dumps({"keys": entries}))
    return ClientKeys.open(path)


@contextlib.contextmanager
def opened(app: Starlette) -> Iterator[TestClient]:
    """A client of ``app`` in this process; its requests (from any thread) share one event
    loop, as they do under uvicorn."""
    with TestClient(app) as client:
        yield client


def mimetype(answer: httpx.Response) -> str:
    return answer.headers.get("Content-Type", "").split(";", 1)[0]


@contextlib.contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port (a thread of this process), its URL
    ending in ``/``, until the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(30)
