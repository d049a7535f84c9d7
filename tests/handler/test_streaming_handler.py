"""Streaming through the handler with the tiny real model: deltas, then the final response."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.settings import Settings
from hymt_serve.engine.codec import TokenCodec
from hymt_serve.request import door
from hymt_serve.request.streaming import IncrementalDecoder


@pytest.mark.parametrize(
    "text",
    ["你好，世界。今天天气很好。", "日本語のテキストです", "emoji 😀👍🏽🇨🇳 ok", "עברית ועربية"],
)
def test_real_tokenizer_deltas_never_split_a_character(
    real_tokenizer_model_dir: Path, text: str
) -> None:
    engine = TokenCodec.load(
        Settings.from_mapping({"model_path": str(real_tokenizer_model_dir)}, environ={})
    )
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    if "😀" in text:  # emoji are split over byte tokens: the hold-back is exercised
        assert any("\ufffd" in engine.decode([i]) for i in ids)
    decoder = IncrementalDecoder(engine.decode)
    deltas = [decoder.push([i]) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + decoder.finish(text) == text


def test_stream_and_plain_requests_in_one_batch(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[dict[int, str], dict[int, str]]] = []
    monkeypatch.setattr(
        door,
        "send_intermediate_predict_response",
        lambda ret, ids, message, code, context: sent.append((ret, ids)),
    )
    handler = HunyuanMTHandler()
    context = make_context(
        {"model_path": str(tiny_model_dir), "max_new_tokens": 12}, model_dir=tiny_model_dir
    )
    handler.initialize(context)
    bodies: list[Any] = [
        {"text": "Hello there", "target_lang": "ja", "stream": True},
        {"text": "Good night", "target_lang": "de"},
        {"text": "x", "target_lang": "xx", "stream": True},
    ]
    set_batch(context, len(bodies))
    final = handler.handle([{"body": b} for b in bodies], context)
    assert {index for ret, ids in sent for index in ids} == {0}  # deltas go to request 0 only
    deltas = [json.loads(ret[0]) for ret, _ in sent]
    assert deltas and all(d["request_id"] == "req-0" for d in deltas)
    streamed = json.loads(final[0])
    assert final[0].endswith("\n")
    assert "".join(d["delta"] for d in deltas) == streamed["translation"]
    assert context.get_response_content_type(0) == "application/x-ndjson"
    assert context.get_response_content_type(1) == "application/json"
    assert json.loads(final[1])["translations"][0]["output_tokens"] == 12
    assert context.get_response_status(2)[0] == 400
