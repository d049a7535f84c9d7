"""What the translation memory served is not billed, on every route beyond ``/api/translate``
and OpenAI's (docs/translation-memory.md): the stub TorchServe's replies say
``usage.memory_characters`` (v2: ``parameters.memory_characters``) as the worker's do, and each
route's key is billed only the rest - LibreTranslate, DeepL (with ``billed_characters``), KServe
v2, DeepL documents (once, in the job's transaction), batch lines, and refinement's usage."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_stub import MODEL, PREDICTIONS, Upstream, client_keys, opened, workdir
from werkzeug.wrappers import Request, Response

from hymt_serve.request import oip, openai_api
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys
from hymt_serve.web.refine import refine

INFER = f"/v2/models/{MODEL}/infer"


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json", names=("alice", "bob"))


@pytest.fixture
def client(upstream: Upstream, tmp_path: Path, keys: ClientKeys) -> Iterator[TestClient]:
    with opened(create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys)) as client:
        yield client


def served_texts(*cached: str) -> Any:
    """The request API's reply: each text upper-cased, those in ``cached`` as served from the
    memory (their characters in ``usage.memory_characters``)."""

    def reply(request: Request) -> Response:
        texts = json.loads(request.get_data())["text"]
        hits = [text for text in texts if text in cached]
        usage = {"input_tokens": 5, "output_tokens": 5}
        if hits:
            usage |= {"memory_segments": len(hits), "memory_characters": sum(map(len, hits))}
        items = [{"text": text.upper(), "finish_reason": "stop"} for text in texts]
        body = {"translations": items, "usage": usage, "request_id": "r", "target_lang": "de"}
        return Response(json.dumps(body), content_type="application/json")

    return reply


def synced_use(keys: ClientKeys, index: int = 0) -> int:
    """The key's usage once the database's (where jobs bill) is read back."""
    keys.sync()
    return keys.used(keys.keys[index])


def test_libretranslate_bills_only_what_the_model_translated(
    upstream: Upstream, client: TestClient, keys: ClientKeys
) -> None:
    upstream.replies[PREDICTIONS] = served_texts("Hello")
    body = {"q": ["Hello", "Bye"], "source": "en", "target": "de", "api_key": keys.keys[0].key}
    answer = client.post("/translate", json=body)
    assert answer.status_code == 200 and answer.json()["translatedText"] == ["HELLO", "BYE"]
    assert keys.used(keys.keys[0]) == len("Bye")
    assert "cache_namespace" not in upstream.forwarded()[-1].json()  # not isolated


def test_deepl_bills_only_what_the_model_translated_and_says_so_per_text(
    upstream: Upstream, client: TestClient, keys: ClientKeys
) -> None:
    upstream.replies[PREDICTIONS] = served_texts("Hello", "Bye")
    headers = {"Authorization": f"DeepL-Auth-Key {keys.keys[0].key}"}
    body = {"text": ["Hello", "Bye"], "source_lang": "EN", "target_lang": "DE"}
    every = client.post("/v2/translate", json=body, headers=headers).json()["translations"]
    assert [t["billed_characters"] for t in every] == [0, 0] and keys.used(keys.keys[0]) == 0
    upstream.replies[PREDICTIONS] = served_texts("Hello")
    mixed = client.post("/v2/translate", json=body, headers=headers).json()["translations"]
    assert keys.used(keys.keys[0]) == len("Bye")
    # one reply for both texts: which one the memory served cannot be told, each is reported
    assert [t["billed_characters"] for t in mixed] == [5, 3]
    upstream.replies[PREDICTIONS] = served_texts()
    client.post("/v2/translate", json=body, headers=headers)
    assert keys.used(keys.keys[0]) == 3 + 8


def test_a_failed_chunk_refunds_the_request_once(
    upstream: Upstream, client: TestClient, keys: ClientKeys
) -> None:
    """A request in several chunks: one served from memory, one failing - the whole request
    is given back, and not the memory's characters a second time."""
    replies = iter([served_texts("a" * 20)])

    def reply(request: Request) -> Response:
        if "a" * 20 in json.loads(request.get_data())["text"]:
            return next(replies)(request)  # type: ignore[no-any-return]
        return Response(json.dumps({"error": "no", "error_type": "invalid_request"}), 400)

    upstream.replies[PREDICTIONS] = reply
    texts = ["a" * 20] * 16 + ["b"]  # two chunks: the handler takes 16 texts at once
    body = {"q": texts, "source": "en", "target": "de", "api_key": keys.keys[0].key}
    assert client.post("/translate", json=body).status_code == 400
    assert keys.used(keys.keys[0]) == 0


def test_kserve_v2_refunds_the_memory_characters_of_its_parameters(
    upstream: Upstream, client: TestClient, keys: ClientKeys
) -> None:
    parameters = {"target_lang": "de", "request_id": "r", "input_tokens": 1, "output_tokens": 1}
    reply = {"model_name": MODEL, "id": "r", "outputs": [], "parameters": parameters}
    reply["parameters"] |= {"memory_segments": 1, "memory_characters": 5}
    upstream.reply(INFER, reply)
    tensor = {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["Hello", "Bye"]}
    body = {"inputs": [tensor], "parameters": {"target_lang": "de", "cache": True}}
    headers = {"Authorization": f"Bearer {keys.keys[0].key}"}
    assert client.post(INFER, json=body, headers=headers).status_code == 200
    assert keys.used(keys.keys[0]) == len("Bye")
    assert upstream.forwarded(INFER)[-1].json()["parameters"]["cache"] is True


def test_cache_is_a_field_of_the_openai_and_v2_apis() -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "cache": False}
    assert openai_api.parse_chat(chat, (MODEL,)).forward["cache"] is False
    tensor = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Hi"]}
    fields, _ = oip.unwrap({"inputs": [tensor], "parameters": {"cache": False}}, {})
    assert fields["cache"] is False


def test_a_document_job_is_refunded_the_memory_characters_once(
    upstream: Upstream, client: TestClient, keys: ClientKeys
) -> None:
    def reply(request: Request) -> Response:
        body = {"document": "# HI\n", "segment_translations": {"0": "HI"}, "segments_total": 1}
        body |= {"usage": {"input_tokens": 1, "output_tokens": 1, "memory_characters": 2}}
        return Response(json.dumps(body), content_type="application/json")

    upstream.replies[PREDICTIONS] = reply
    data = {"target_lang": "DE", "auth_key": keys.keys[0].key}
    job = client.post("/v2/document", data=data, files={"file": ("a.md", b"# Hi\n")}).json()
    form = {"document_key": job["document_key"], "auth_key": keys.keys[0].key}
    for _ in range(300):
        status = client.post(f"/v2/document/{job['document_id']}", data=form).json()
        if status["status"] in ("done", "error"):
            break
        time.sleep(0.01)
    assert status["status"] == "done"
    assert synced_use(keys) == len("# Hi\n") - 2  # billed 5, the memory's 2 given back
    assert synced_use(keys) == 3  # and only once


def test_a_batch_line_is_not_billed_what_the_memory_served(
    upstream: Upstream, client: TestClient, keys: ClientKeys
) -> None:
    def chat(request: Request) -> Response:
        text = json.loads(request.get_data())["messages"][-1]["content"]
        usage = {"input_tokens": 9, "output_tokens": 3}
        if text == "cached":
            usage |= {"memory_segments": 1, "memory_characters": len(text)}
        choice = {"index": 0, "text": text.upper(), "finish_reason": "stop", "output_tokens": 3}
        body = {"choices": [choice], "usage": usage, "prompt": "chat", "request_id": "r"}
        return Response(json.dumps(body), content_type="application/json")

    upstream.replies[PREDICTIONS] = chat
    headers = {"Authorization": f"Bearer {keys.keys[0].key}"}
    lines = [
        {"custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "messages": [{"role": "user", "content": text}]}}
        for n, text in enumerate(["cached", "fresh"])
    ]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = client.post(
        "/v1/files",
        headers=headers,
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", content)},
    ).json()
    batch = {"input_file_id": upload["id"], "endpoint": "/v1/chat/completions"}
    batch_id = client.post(
        "/v1/batches", json={**batch, "completion_window": "24h"}, headers=headers
    )
    batch_id = batch_id.json()["id"]
    for _ in range(300):
        state = client.get(f"/v1/batches/{batch_id}", headers=headers).json()["status"]
        if state in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.01)
    assert state == "completed"
    assert synced_use(keys) == len("fresh")


def test_refinement_reports_the_share_the_memory_served() -> None:
    """Six candidate requests and a Chimera call over one text of 10 characters: the greedy
    candidate alone from memory is a seventh of the work; every call from memory, all of it."""
    text = "0123456789"

    def post_with(hits: set[str]) -> Any:
        async def post(model: str, body: dict[str, Any], bulk: bool = False) -> Any:
            kind = "refine" if "candidates" in body else body.get("temperature", "greedy")
            answer = f"{model} {kind}"  # every candidate differs: Chimera is called
            usage: dict[str, int] = {"input_tokens": 1, "output_tokens": 1}
            if kind in hits or "all" in hits:
                usage["memory_characters"] = len(text)
            item = {"text": answer, "finish_reason": "stop"}
            return 200, {"translations": [item], "usage": usage}

        return post

    body = {"text": text, "source_lang": "en", "target_lang": "de"}
    status, answer = asyncio.run(refine(body, post_with({"greedy"}), "mt", "chimera"))
    assert status == 200 and answer["usage"]["memory_characters"] == 10 // 7
    _, answer = asyncio.run(refine(body, post_with({"all"}), "mt", "chimera"))
    assert answer["usage"]["memory_characters"] == 10
    _, answer = asyncio.run(refine(body, post_with(set()), "mt", "chimera"))
    assert "memory_characters" not in answer["usage"]
