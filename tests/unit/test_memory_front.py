"""The translation memory through the web front end: the stub TorchServe answers through a real
TranslationService (a character engine) keeping its memory in the front end's own database;
the front end answers a plain request whose texts are all there without TorchServe, bills
nothing for what the memory served, and names each key to an isolated memory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from web_stub import DESCRIBE, MODEL, PREDICTIONS, Upstream, client_keys, opened, workdir
from werkzeug.wrappers import Request, Response

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationResult, GenerationRow, OnTokens
from hymt_serve.request.memory_key import marker_key
from hymt_serve.request.memory_rows import open_memory
from hymt_serve.request.service import TranslationService
from hymt_serve.web.access import memory_refund, with_namespace
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys


class Letters:
    """An engine whose prompt ids are characters and whose translation is the prompt's last
    line upper-cased."""

    def encode_prompt(self, user_turn: str) -> list[int]:
        return [ord(c) for c in user_turn]

    def encode_chat(self, turns: Sequence[ChatTurn]) -> list[int]:
        return [ord(c) for c in turns[-1].content]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(map(chr, token_ids))

    def submit(self, row: GenerationRow, on_tokens: OnTokens | None = None) -> Future[Any]:
        text = self.decode(row.prompt_ids).rsplit("\n", 1)[-1].upper()
        future: Future[GenerationResult] = Future()
        future.set_result(GenerationResult(text, tuple(map(ord, text)), "stop"))
        return future

    def run(self, futures: Sequence[Future[Any]]) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"engine": "letters"}


def worker(upstream: Upstream, tmp_path: Path, keys: ClientKeys, **extra: Any) -> list[int]:
    """The stub's predictions answered by a service on the keys' database; returns the list
    that counts the rows its engine generated."""
    url = keys.store.engine.url.render_as_string(hide_password=False)
    raw = {"model_path": str(tmp_path / "model"), "memory_database_url": url, **extra}
    settings = Settings.from_mapping({"target_language_check": "off", **raw}, environ={})
    memory = open_memory(settings, MODEL, {})
    assert memory is not None
    service = TranslationService(Letters(), settings, memory=memory)  # type: ignore[arg-type]
    generated: list[int] = []

    def predict(request: Request) -> Response:
        outcomes = service.prepare([service.parse(request.get_json())])
        before = memory.misses
        results = service.generate(outcomes)
        generated.append(memory.misses - before)
        [reply] = service.render(outcomes, results, ["req"])
        memory.flush()
        return Response(json.dumps(reply.body), reply.status, mimetype="application/json")

    described = {
        "model_family": service.profile.describe(),
        "settings": settings.public(),
        "memory": service.memory.describe(),
    }
    upstream.replies[PREDICTIONS] = predict
    upstream.reply(DESCRIBE, [{"modelName": MODEL, "customizedMetadata": described}])
    return generated


def translate(client: Any, keys: ClientKeys, body: dict[str, Any], who: int = 0) -> Any:
    headers = {"Authorization": f"Bearer {keys.keys[who].key}"}
    return client.post("/api/translate", json=body, headers=headers)


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json", ("alice", "bob"))


def test_a_cached_sentence_never_reaches_torchserve_and_is_not_billed(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    generated = worker(upstream, tmp_path, keys)
    app = create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys, require_keys=True)
    alice = keys.keys[0]
    body = {"text": "Good morning.", "source_lang": "en", "target_lang": "de", "stream": False}
    with opened(app) as client:
        first = translate(client, keys, body).json()
        assert first["translation"] == "GOOD MORNING." and keys.used(alice) == 13
        again = translate(client, keys, body)
        assert len(upstream.forwarded()) == 1  # answered by the front end
        assert again.json()["translations"] == first["translations"]
        assert again.json()["usage"]["memory_characters"] == 13 and keys.used(alice) == 13
        streamed = translate(client, keys, {k: v for k, v in body.items() if k != "stream"})
        lines = [json.loads(line) for line in streamed.text.splitlines()]
        assert lines[0]["delta"] == "GOOD MORNING." and lines[1]["translation"] == lines[0]["delta"]
        # one text missing: TorchServe answers, the worker serves the other from memory, and
        # only the new text's characters stay billed
        mixed = translate(client, keys, {**body, "text": ["Good morning.", "Thanks."]}).json()
        assert len(upstream.forwarded()) == 2 and mixed["usage"]["memory_characters"] == 13
        assert keys.used(alice) == 13 + 7 and generated == [1, 1]
        translate(client, keys, {**body, "cache": False})  # the client said no
        assert len(upstream.forwarded()) == 3 and generated[-1] == 0
        assert "cache_namespace" not in upstream.forwarded()[-1].json()  # not isolated


def test_a_model_that_changed_is_never_answered_from_the_old_ones_entries(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    worker(upstream, tmp_path, keys)
    app = create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys, require_keys=True)
    body = {"text": "Hello.", "source_lang": "en", "target_lang": "fr", "stream": False}
    with opened(app) as client:
        translate(client, keys, body)
        translate(client, keys, body)
        assert len(upstream.forwarded()) == 1
        fast = app.state.fast
        fast.memory.announce(MODEL, marker_key(MODEL))  # a worker loaded another model...
        fast.memory.model = "another"  # (this one's identity, written as the current one)
        translate(client, keys, body)
        assert len(upstream.forwarded()) == 2


def test_isolated_keys_get_their_own_memory(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    worker(upstream, tmp_path, keys, memory_isolation=True)
    app = create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys, require_keys=True)
    body = {"text": "See you.", "source_lang": "en", "target_lang": "it", "stream": False}
    with opened(app) as client:
        translate(client, keys, {**body, "cache_namespace": "bob"})  # not the client's to say
        assert upstream.forwarded()[-1].json().get("cache_namespace") in ("alice", None)
        translate(client, keys, body)
        translate(client, keys, body, who=1)  # bob: another memory
        assert upstream.forwarded()[-1].json()["cache_namespace"] == "bob"
        forwarded = len(upstream.forwarded())
        translate(client, keys, body)  # alice again: from memory
        translate(client, keys, body, who=1)
        assert len(upstream.forwarded()) == forwarded


def test_the_refund_and_namespace_helpers(keys: ClientKeys) -> None:
    alice = keys.keys[0]
    assert keys.reserve(alice, 50)
    assert memory_refund(keys, alice, {"usage": {"memory_characters": 20}}) == 20
    assert keys.used(alice) == 30
    for body in ({}, {"usage": {}}, {"usage": {"memory_characters": True}}, []):
        assert memory_refund(keys, alice, body) == 0
    assert with_namespace({"text": "x", "cache_namespace": "b"}, alice, False) == {"text": "x"}
    assert with_namespace({"text": "x"}, alice, True)["cache_namespace"] == "alice"
    assert with_namespace({"text": "x"}, None, True)["cache_namespace"] == ""
