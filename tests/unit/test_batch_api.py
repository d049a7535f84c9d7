"""OpenAI's Files and Batch API on the web front end, through the official openai SDK, against
the stub TorchServe: a batch's lines answered once each in OpenAI's output shape, lines the
route would refuse in the error file (and not billed), cancelling, and each key's own files."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from web_stub import MODEL, PREDICTIONS, Upstream, client_keys, serving, workdir
from werkzeug.wrappers import Request, Response

from hymt_serve.web import keys as keys_module
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json", names=("alice", "bob"))


@pytest.fixture
def base_url(upstream: Upstream, tmp_path: Path, keys: ClientKeys) -> Iterator[str]:
    with serving(create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys)) as url:
        yield url + "v1"


def chat_reply(request: Request) -> Response:
    """The handler's chat-form reply: the last message's text upper-cased."""
    body = json.loads(request.get_data())
    text = body["messages"][-1]["content"].upper()
    reply = {
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "output_tokens": 3}],
        "usage": {"input_tokens": 9, "output_tokens": 3},
        "prompt": "chat",
        "request_id": "req-1",
    }
    return Response(json.dumps(reply), content_type="application/json")


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def line(custom_id: str, text: str, model: str = MODEL) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def wait(client: openai.OpenAI, batch_id: str) -> Any:
    for _ in range(500):
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled"):
            return batch
        time.sleep(0.02)
    raise AssertionError("the batch never ended")


def used(keys: ClientKeys, index: int = 0) -> int:
    time.sleep(2 * keys_module.SAVE_EVERY_S + 0.2)  # a turn reads the database's usage back
    return keys.used(keys.keys[index])


def test_a_batch_through_the_sdk(upstream: Upstream, base_url: str, keys: ClientKeys) -> None:
    upstream.replies[PREDICTIONS] = chat_reply
    client = openai.OpenAI(base_url=base_url, api_key=keys.keys[0].key, max_retries=0)
    texts = [f"sentence {n}" for n in range(20)]
    lines = [line(f"r{n}", text) for n, text in enumerate(texts)]
    lines.append(line("bad", "no such model", model="gpt-4"))  # the route's 404: error file
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes == len(jsonl(lines))
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.request_counts is not None
    done = wait(client, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (21, 20, 1)
    assert done.output_file_id and done.error_file_id
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in output] == [f"r{n}" for n in range(20)]
    first = output[0]["response"]
    assert first["status_code"] == 200 and output[0]["error"] is None
    assert first["body"]["object"] == "chat.completion"
    assert first["body"]["choices"][0]["message"]["content"] == "SENTENCE 0"
    (error,) = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 404
    assert len(upstream.forwarded()) == 20  # each line once; the bad one never sent
    assert used(keys) == sum(len(text) for text in texts)  # the failed line not billed
    listed = client.batches.list()
    assert [b.id for b in listed.data] == [batch.id]
    assert client.files.retrieve(upload.id).filename == "in.jsonl"


def test_cancelling_refunds_what_was_not_answered(
    upstream: Upstream, base_url: str, keys: ClientKeys
) -> None:
    gate = threading.Event()

    def held(request: Request) -> Response:
        gate.wait(10)
        return chat_reply(request)

    upstream.replies[PREDICTIONS] = held
    client = openai.OpenAI(base_url=base_url, api_key=keys.keys[0].key, max_retries=0)
    data = jsonl([line(f"r{n}", "abcd") for n in range(5)])
    upload = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    try:
        cancelled = client.batches.cancel(batch.id)
    finally:
        gate.set()
    assert cancelled.status == "cancelled" and cancelled.output_file_id is None
    assert used(keys) == 0
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_files_and_batches_are_their_keys_own(
    upstream: Upstream, base_url: str, keys: ClientKeys
) -> None:
    alice = openai.OpenAI(base_url=base_url, api_key=keys.keys[0].key, max_retries=0)
    bob = openai.OpenAI(base_url=base_url, api_key=keys.keys[1].key, max_retries=0)
    upload = alice.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(upload.id)
    with pytest.raises(openai.BadRequestError) as refused:  # a line without custom_id
        alice.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert "custom_id" in refused.value.message
    with pytest.raises(openai.BadRequestError):
        alice.files.create(file=("x.jsonl", io.BytesIO(b"")), purpose="fine-tune")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="nope", max_retries=0).batches.list()
    assert alice.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.content(upload.id)
