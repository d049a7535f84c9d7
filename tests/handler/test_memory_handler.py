"""The translation memory in the handler, with a fake engine and a real SQLite database: rows
served from memory never reach the engine, the request's say (``cache``, its namespace), the
usage the front end refunds, the metrics, and a database that fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fakes import FakeEngine, make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.request import memory as store
from hymt_serve.request.metrics import TorchServeRecorder

SRT = "1\n00:00:01,000 --> 00:00:02,000\nHello.\n\n2\n00:00:03,000 --> 00:00:04,000\nBye.\n\n"
SRT += "3\n00:00:05,000 --> 00:00:06,000\nHello.\n"


def make_handler(tmp_path: Path, **extra: Any) -> HunyuanMTHandler:
    settings = {
        "model_path": str(tmp_path / "model"),
        "max_new_tokens": 40,
        "memory_database_url": f"sqlite:///{tmp_path / 'hymt.db'}",
        "target_language_check": "off",
        **extra,
    }
    handler = HunyuanMTHandler()
    handler.initialize(make_context(settings))
    return handler


def run(handler: HunyuanMTHandler, *bodies: Any) -> list[tuple[int, dict[str, Any]]]:
    context = handler.context
    set_batch(context, len(bodies))
    out = handler.handle([{"body": body} for body in bodies], context)
    assert isinstance(out, list)
    replies = [(context.get_response_status(i)[0], json.loads(text)) for i, text in enumerate(out)]
    memory = handler.service.memory.memory  # type: ignore[union-attr]
    if memory is not None:
        memory.flush()  # what the batch kept is written (the writer thread's next turn)
    return replies


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The memory counters the handler sends, summed."""
    sent: dict[str, float] = {}
    original = TorchServeRecorder.memory

    def memory(self: TorchServeRecorder, *, hits: int, misses: int, evictions: int) -> None:
        for name, value in (("hits", hits), ("misses", misses), ("evictions", evictions)):
            sent[name] = sent.get(name, 0) + value
        original(self, hits=hits, misses=misses, evictions=evictions)

    monkeypatch.setattr(TorchServeRecorder, "memory", memory)
    return sent


def test_repeated_texts_cost_the_engine_nothing(
    tmp_path: Path, fake_engine: FakeEngine, metrics: dict[str, float]
) -> None:
    handler = make_handler(tmp_path)
    body = {"text": ["Hello.", "Bye.", "Hello."], "source_lang": "en", "target_lang": "de"}
    [(status, first)] = run(handler, body)
    assert status == 200
    assert [t["text"] for t in first["translations"]] == ["HELLO.", "BYE.", "HELLO."]
    assert len(fake_engine.rows) == 2  # the second "Hello." took the first one's result
    assert first["usage"]["memory_segments"] == 1 and first["usage"]["memory_characters"] == 6
    [(status, again)] = run(handler, body)
    assert status == 200 and len(fake_engine.rows) == 2  # all three from the memory
    assert again["translations"] == first["translations"]
    assert again["usage"] == {
        "input_tokens": first["usage"]["input_tokens"],
        "output_tokens": first["usage"]["output_tokens"],
        "memory_segments": 3,
        "memory_characters": 16,
    }
    assert metrics == {"hits": 4, "misses": 2, "evictions": 0}  # rows: 1 + 3 served, 2 made
    assert handler.describe()["memory"]["enabled"] is True


def test_cache_false_skips_lookup_and_store(tmp_path: Path, fake_engine: FakeEngine) -> None:
    handler = make_handler(tmp_path)
    body = {"text": "Good night.", "target_lang": "fr", "cache": False}
    run(handler, body)
    [(_, again)] = run(handler, {k: v for k, v in body.items() if k != "cache"})
    assert len(fake_engine.rows) == 2 and "memory_segments" not in again["usage"]
    [(_, third)] = run(handler, {"text": "Good night.", "target_lang": "fr"})
    assert len(fake_engine.rows) == 2 and third["usage"]["memory_segments"] == 1
    [(status, refused)] = run(handler, {"text": "x", "target_lang": "fr", "cache": "no"})
    assert status == 400 and refused["field"] == "cache"


def test_sampled_rows_only_with_a_seed_and_an_opt_in(
    tmp_path: Path, fake_engine: FakeEngine
) -> None:
    handler = make_handler(tmp_path)
    sampled = {"text": "Hi there.", "target_lang": "fr", "sampling": True}
    run(handler, sampled)
    run(handler, sampled)
    assert len(fake_engine.rows) == 2  # never kept
    [(status, refused)] = run(handler, {**sampled, "cache": True})  # no seed in this API
    assert status == 400 and "seed" in refused["error"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0.5, "seed": 7}
    run(handler, chat)
    run(handler, chat)
    assert len(fake_engine.rows) == 4  # seeded but not opted in
    run(handler, {**chat, "cache": True})
    [(_, reply)] = run(handler, {**chat, "cache": True})
    assert len(fake_engine.rows) == 5 and reply["usage"]["memory_characters"] == 2


def test_isolation_gives_each_namespace_its_own_memory(
    tmp_path: Path, fake_engine: FakeEngine
) -> None:
    handler = make_handler(tmp_path, memory_isolation=True)
    body = {"text": "Thanks.", "target_lang": "es"}
    run(handler, {**body, "cache_namespace": "team-a"})
    run(handler, {**body, "cache_namespace": "team-b"})
    run(handler, {**body, "cache_namespace": "team-a"})
    assert len(fake_engine.rows) == 2
    run(handler, body)  # isolated: a request that names no namespace skips the memory
    run(handler, body)
    assert len(fake_engine.rows) == 4
    shared = make_handler(tmp_path / "shared")  # isolation off: the namespace plays no part
    run(shared, {**body, "cache_namespace": "team-a"})
    run(shared, {**body, "cache_namespace": "team-b"})
    assert len(fake_engine.rows) == 5


def test_a_documents_repeated_segments_and_its_second_run(
    tmp_path: Path, fake_engine: FakeEngine
) -> None:
    handler = make_handler(tmp_path)
    body = {"document": SRT, "format": "srt", "target_lang": "de", "source_lang": "en"}
    [(_, first)] = run(handler, body)
    assert len(fake_engine.rows) == 2 and first["usage"]["memory_segments"] == 1
    [(_, again)] = run(handler, body)
    assert len(fake_engine.rows) == 2 and again["document"] == first["document"]
    assert again["usage"]["memory_segments"] == 3


def test_a_wrong_language_is_kept_only_when_the_check_only_reports(
    tmp_path: Path, fake_engine: FakeEngine
) -> None:
    fake_engine.translate = lambda _: "明日の朝、駅で会いましょう。"
    body = {"text": "Let us meet at the station tomorrow morning.", "target_lang": "en"}
    body["source_lang"] = "fr"
    retry = make_handler(tmp_path, target_language_check="retry")
    run(retry, body)
    run(retry, body)
    assert len(fake_engine.rows) == 4  # each time generated and retried: never kept
    report = make_handler(tmp_path / "report", target_language_check="report")
    run(report, body)
    [(_, reply)] = run(report, body)
    assert len(fake_engine.rows) == 5 and reply["target_language"] == "mismatch"


def test_a_failing_database_never_fails_a_translation(
    tmp_path: Path, fake_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    handler = make_handler(tmp_path)
    memory = handler.service.memory.memory
    assert memory is not None
    with memory.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE translation_memory"))
    [(status, reply)] = run(handler, {"text": "Still here.", "target_lang": "it"})
    assert status == 200 and reply["translation"] == "STILL HERE."
    assert "translation memory lookup failed" in caplog.text
    unusable = make_handler(tmp_path, memory_database_url="sqlite:////proc/no/such/hymt.db")
    assert unusable.describe()["memory"] == {"enabled": False}
    [(status, _)] = run(unusable, {"text": "Still here.", "target_lang": "it"})
    assert status == 200


def test_the_worker_creates_the_table_the_front_end_migrates(tmp_path: Path) -> None:
    """No database yet: the memory creates the file 0600 (it will hold client keys)."""
    memory = store.TranslationMemory.open(f"sqlite:///{tmp_path / 'new.db'}", "m", 100)
    memory.close()
    assert (tmp_path / "new.db").stat().st_mode & 0o777 == 0o600
