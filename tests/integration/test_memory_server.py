"""The translation memory in a real TorchServe as shipped (on: `hymt start`'s work folder holds
its SQLite database): a text or a document sent again is answered from it with the same
translation and shows so in its usage; ``"cache": false`` skips it. The other integration
servers turn it off (their tests repeat texts and count the model's work)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import MODEL, running_server

from hymt_serve.ops.launcher import Server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def memory_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    overrides = {"handler.max_new_tokens": 12}
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("memory"), overrides) as server:
        yield server


def translate(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    answer = requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json=body,
        headers=server.headers("inference"),
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    reply: dict[str, Any] = answer.json()
    return reply


def test_a_text_sent_again_comes_from_the_memory(memory_server: Server) -> None:
    body = {"text": "The memory keeps what was translated.", "target_lang": "de"}
    first = translate(memory_server, body)
    assert "memory_segments" not in first["usage"]
    again = translate(memory_server, body)
    assert again["translation"] == first["translation"]
    assert again["usage"]["memory_segments"] == 1
    assert again["usage"]["memory_characters"] == len(body["text"])
    skipped = translate(memory_server, {**body, "cache": False})
    assert "memory_segments" not in skipped["usage"]
    assert skipped["translation"] == first["translation"]  # greedy: the same words


def test_a_document_sent_again_comes_from_the_memory(memory_server: Server) -> None:
    document = "# Notes\n\nThe first paragraph says one thing.\n\nThe second says another.\n"
    body = {"document": document, "format": "markdown", "target_lang": "fr"}
    first = translate(memory_server, body)
    again = translate(memory_server, body)
    assert again["document"] == first["document"]
    assert again["usage"]["memory_segments"] == again["segments"] >= 1
