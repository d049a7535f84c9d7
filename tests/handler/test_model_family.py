"""The model family through the handler with the tiny model: HY-MT1.5's glossary and context
fields reach the prompt, a family without them refuses them per request, describe says which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import HY_MT15, build_prompt


def start(model_dir: Path, **settings: Any) -> tuple[HunyuanMTHandler, Any]:
    handler = HunyuanMTHandler()
    context = make_context({"model_path": str(model_dir), "max_new_tokens": 6, **settings})
    handler.initialize(context)
    return handler, context


def handle(handler: HunyuanMTHandler, context: Any, bodies: list[Any]) -> list[Any]:
    set_batch(context, len(bodies))
    replies = handler.handle([{"body": b} for b in bodies], context)
    assert isinstance(replies, list)
    return [(context.get_response_status(i)[0], json.loads(r)) for i, r in enumerate(replies)]


GLOSSARY = [{"source": "Hunyuan", "target": "混元"}, {"source": "absent", "target": "缺席"}]


def test_hy_mt15_serves_glossary_and_context(tiny_model_dir: Path) -> None:
    handler, context = start(tiny_model_dir, prompt_family="hy-mt1.5")
    assert handler.describe()["model_family"] == HY_MT15.describe()
    text = "Hunyuan translates."
    bodies = [
        {"text": text, "target_lang": "zh", "glossary": GLOSSARY},
        {"text": text, "target_lang": "zh", "context": "Hunyuan is a model family."},
        {"text": text, "target_lang": "zh"},
    ]
    replies = handle(handler, context, bodies)
    assert [status for status, _ in replies] == [200, 200, 200]
    assert [r["translations"][0]["template"] for _, r in replies] == [
        "terminology",
        "context",
        "zh",
    ]
    # The prompt carried only the term that occurs in the text: the input token counts agree.
    engine = handler._service().engine
    expected, _ = build_prompt(
        text, None, LANGUAGES["zh"], profile=HY_MT15, glossary=[("Hunyuan", "混元")]
    )
    assert "缺席" not in expected
    assert replies[0][1]["usage"]["input_tokens"] == len(engine.encode_prompt(expected))


@pytest.mark.parametrize("field", ["glossary", "context"])
def test_hunyuan_mt_7b_refuses_them_and_serves_the_rest_of_the_batch(
    tiny_model_dir: Path, field: str
) -> None:
    handler, context = start(tiny_model_dir, prompt_family="hunyuan-mt-7b")
    value = GLOSSARY if field == "glossary" else "some context"
    bodies = [
        {"text": "Hi", "target_lang": "zh", field: value},
        {"text": "Hi", "target_lang": "zh"},
    ]
    (status, refused), (ok, _) = handle(handler, context, bodies)
    assert (status, ok) == (400, 200)
    assert refused["field"] == field and "Hunyuan-MT-7B" in refused["error"]
    assert handler.describe()["model_family"]["model_family"] == "Hunyuan-MT-7B"


def test_the_profile_does_not_depend_on_the_7b_tokenizer_ids(fallback_model_dir: Path) -> None:
    """HY-MT1.5's prompts with the project's own fallback tokenizer (other ids, other special
    tokens): the prompt is encoded by that tokenizer's own template, nothing assumes 7B ids."""
    handler, context = start(fallback_model_dir, prompt_family="hy-mt1.5")
    body = {"text": "Hunyuan translates.", "target_lang": "zh", "glossary": GLOSSARY}
    [(status, reply)] = handle(handler, context, [body])
    assert status == 200 and reply["translations"][0]["template"] == "terminology"
    engine = handler._service().engine
    expected, _ = build_prompt(
        body["text"], None, LANGUAGES["zh"], profile=HY_MT15, glossary=[("Hunyuan", "混元")]
    )
    ids = engine.encode_prompt(expected)
    assert reply["usage"]["input_tokens"] == len(ids)
    assert engine.decode(ids).endswith(body["text"])  # the text round-trips through its vocabulary
    assert 127960 not in engine.codec.stop_ids  # not the 7B's <|eos|> id
