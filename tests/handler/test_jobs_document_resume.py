"""A durable job's document calls through the handler (fake engine): max_segments translates
the first missing segments only, done_segments are never generated again, the call that leaves
none missing answers the whole document, and a fingerprint of another split is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import FakeEngine, make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler

SETTINGS: dict[str, Any] = {"model_path": "/unused", "max_new_tokens": 400}
DOCUMENT = "".join(f"Paragraph number {n} is here.\n\n" for n in range(7))


def start(engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> HunyuanMTHandler:
    import hymt_serve.engine.engine  # function-local: the fake replaces the loader per test

    monkeypatch.setattr(hymt_serve.engine.engine, "load_engine", lambda *args, **kw: engine)
    handler = HunyuanMTHandler()
    handler.initialize(make_context(SETTINGS))
    return handler


def call(handler: HunyuanMTHandler, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {"document": DOCUMENT, "format": "text", "target_lang": "de", **fields}
    set_batch(handler.context, 1)
    (out,) = handler.handle([{"body": body}], handler.context)
    return handler.context.get_response_status(0)[0], json.loads(out)


def test_a_document_in_three_calls_generates_each_segment_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = FakeEngine()
    handler = start(engine, monkeypatch)
    whole = call(handler)[1]["document"]
    generated_alone = len(engine.prompts)
    engine.prompts.clear()
    done: dict[str, str] = {}
    status, first = call(handler, max_segments=3)
    assert status == 200 and first["document"] is None
    assert first["segments_total"] == generated_alone == 7 and first["segments_done"] == 3
    assert sorted(first["segment_translations"]) == ["0", "1", "2"]
    done |= first["segment_translations"]
    fingerprint = first["segments_fingerprint"]
    status, second = call(
        handler, done_segments=done, segments_fingerprint=fingerprint, max_segments=3
    )
    assert status == 200 and sorted(second["segment_translations"]) == ["3", "4", "5"]
    done |= second["segment_translations"]
    status, last = call(handler, done_segments=done, segments_fingerprint=fingerprint)
    assert status == 200 and list(last["segment_translations"]) == ["6"]
    assert last["document"] == whole  # the same document as in one call
    assert len(engine.prompts) == 7  # every segment generated once over the three calls
    done |= last["segment_translations"]
    status, again = call(handler, done_segments=done, segments_fingerprint=fingerprint)
    assert status == 200 and again["document"] == whole and len(engine.prompts) == 7


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"done_segments": {"0": "x"}, "segments_fingerprint": "0" * 64}, "segments_fingerprint"),
        ({"done_segments": {"0": "x"}}, "segments_fingerprint"),
        ({"done_segments": {"a": "x"}, "segments_fingerprint": "f"}, "done_segments"),
        ({"done_segments": ["x"]}, "done_segments"),
        ({"max_segments": 0}, "max_segments"),
        ({"max_segments": True}, "max_segments"),
    ],
)
def test_resume_fields_that_do_not_fit_are_a_400_naming_the_field(
    fields: dict[str, Any], field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine()
    handler = start(engine, monkeypatch)
    status, reply = call(handler, **fields)
    assert status == 400 and reply["field"] == field, reply
    assert not engine.prompts


def test_a_segment_index_past_the_document_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = start(FakeEngine(), monkeypatch)
    fingerprint = call(handler, max_segments=1)[1]["segments_fingerprint"]
    status, reply = call(handler, done_segments={"7": "x"}, segments_fingerprint=fingerprint)
    assert status == 400 and reply["field"] == "done_segments" and "has 7" in reply["error"]
