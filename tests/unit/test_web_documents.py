"""DeepL's document API on the web front end: uploads, status, downloads for their owner only,
per-key limits and billing, against the stub TorchServe (no TorchServe)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from starlette.testclient import TestClient
from web_stub import MODEL, PREDICTIONS, Upstream, client_keys, opened, workdir
from werkzeug.http import parse_options_header
from werkzeug.wrappers import Request, Response

from hymt_serve.web import jobs_documents
from hymt_serve.web.app import create_app
from hymt_serve.web.deepl_documents import content_disposition
from hymt_serve.web.keys import ClientKeys


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json")


@contextmanager
def _app(upstream: Upstream, tmp_path: Path, keys: ClientKeys) -> Iterator[TestClient]:
    with opened(create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys)) as client:
        yield client


def _upload(client: TestClient, keys: ClientKeys, index: int = 0, name: str = "a.md") -> Any:
    files = {"file": (name, b"# Hi\n")}
    # DeepL's auth_key field (bob's key is not ASCII: a header of the test client would be
    # UTF-8, where HTTP clients send ISO-8859-1)
    data = {"target_lang": "DE", "auth_key": keys.keys[index].key}
    return client.post("/v2/document", data=data, files=files)


def _call(
    client: TestClient, keys: ClientKeys, path: str, document_key: str, index: int = 0
) -> Any:
    return client.post(path, data={"document_key": document_key, "auth_key": keys.keys[index].key})


def _wait_done(client: TestClient, keys: ClientKeys, document_id: str, key: str) -> dict[str, Any]:
    for _ in range(200):
        status = _call(client, keys, f"/v2/document/{document_id}", key).json()
        if status["status"] in ("done", "error"):
            return status  # type: ignore[no-any-return]
        time.sleep(0.01)
    raise AssertionError("the document never finished")


def test_a_document_with_any_name_downloads_again_and_only_for_its_owner(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, {"document": "# Hallo\n", "usage": {}})
    with _app(upstream, tmp_path, keys) as client:
        name = "ünïcødé 文件.md"
        job = _upload(client, keys, name=name).json()
        document_id, document_key = job["document_id"], job["document_key"]
        assert _wait_done(client, keys, document_id, document_key)["status"] == "done"
        result = f"/v2/document/{document_id}/result"
        assert _call(client, keys, result, document_key, index=1).status_code == 404  # bob's key
        assert (
            _call(client, keys, f"/v2/document/{document_id}", document_key, index=1).status_code
            == 404
        )
        for _ in range(2):  # a download that broke off can be tried again
            answer = _call(client, keys, result, document_key)
            assert answer.status_code == 200 and answer.content == b"# Hallo\n"
            _, options = parse_options_header(answer.headers["Content-Disposition"])
            assert options["filename"] == name  # werkzeug reads filename* (RFC 5987) first
            assert answer.headers["Content-Disposition"].isascii()


@pytest.mark.parametrize(
    ("name", "fallback"),
    [("ünïcødé 文件.md", "unicde .md"), ("文件.md", "document.md"), ('a"b\\c.md', "a_b_c.md"),
     ("../../etc/x.srt", "x.srt"), ("line\nbreak.txt", "linebreak.txt")],
)  # fmt: skip
def test_content_disposition(name: str, fallback: str) -> None:
    header = content_disposition(name)
    assert header.isascii() and "\n" not in header
    _, options = parse_options_header(header)
    assert options["filename"] == name.replace("\n", "").rsplit("/", 1)[-1]
    assert header.split('filename="', 1)[1].split('"', 1)[0] == fallback
    assert unquote(header.split("filename*=UTF-8''", 1)[1]) == options["filename"]


def test_one_keys_documents_never_block_another_key(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.reply(PREDICTIONS, {"document": "x", "usage": {}})
    monkeypatch.setattr(jobs_documents, "PER_KEY_KEPT", 5)
    with _app(upstream, tmp_path, keys) as client:
        jobs = [_upload(client, keys).json() for _ in range(5)]
        for job in jobs:
            _wait_done(client, keys, job["document_id"], job["document_key"])
        refused = _upload(client, keys)
        assert (
            refused.status_code == 429 and "download the finished ones" in refused.json()["message"]
        )
        assert _upload(client, keys, index=1).status_code == 200  # bob is not blocked


def test_too_many_documents_in_translation_for_one_key_get_429(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    gate = threading.Event()

    def held(request: Request) -> Response:
        gate.wait(10)
        return Response(json.dumps({"document": "x"}), content_type="application/json")

    upstream.replies[PREDICTIONS] = held
    with _app(upstream, tmp_path, keys) as client:
        try:
            for _ in range(jobs_documents.PER_KEY_ACTIVE):
                assert _upload(client, keys).status_code == 200
            refused = _upload(client, keys)
            assert refused.status_code == 429 and "in translation" in refused.json()["message"]
            assert _upload(client, keys, index=1).status_code == 200
        finally:
            gate.set()


def test_a_failed_document_is_not_billed(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, {"error": "cue 1 is broken", "error_type": "invalid_request"}, 400)
    with _app(upstream, tmp_path, keys) as client:
        job = _upload(client, keys).json()
        status = _wait_done(client, keys, job["document_id"], job["document_key"])
        assert status["status"] == "error" and "cue 1" in status["error_message"]
        assert keys.used(keys.keys[0]) == 0
