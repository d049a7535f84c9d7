"""The model family through the handler with the tiny model: HY-MT1.5's glossary and context
fields reach the prompt, a family without them refuses them per request, describe says which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.request.families import HY_MT15
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import PromptOptions, build_prompt


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
        text,
        None,
        LANGUAGES["zh"],
        profile=HY_MT15,
        options=PromptOptions(glossary=(("Hunyuan", "混元"),)),
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
        body["text"],
        None,
        LANGUAGES["zh"],
        profile=HY_MT15,
        options=PromptOptions(glossary=(("Hunyuan", "混元"),)),
    )
    ids = engine.encode_prompt(expected)
    assert reply["usage"]["input_tokens"] == len(ids)
    assert engine.decode(ids).endswith(body["text"])  # the text round-trips through its vocabulary
    assert 127960 not in engine.codec.stop_ids  # not the 7B's <|eos|> id


def test_formatted_text_and_refinement_through_the_handler(tiny_model_dir: Path) -> None:
    """preserve_format: the prompt holds the markup as <sN> tags, the reply says how many tags
    the (random) model lost and carries no tag of its own; Chimera: candidates in, echoed."""
    handler, context = start(tiny_model_dir, prompt_family="hy-mt1.5")
    text = "Press **Save** now."
    [(status, reply)] = handle(
        handler, context, [{"text": text, "target_lang": "zh", "preserve_format": "markdown"}]
    )
    item = reply["translations"][0]
    assert status == 200 and item["template"] == "formatted"
    assert 0 <= item["format_tags_lost"] <= 1 and "<s1>" not in item["text"]
    engine = handler._service().engine
    options = PromptOptions(preserve_format="markdown")
    expected, _ = build_prompt(
        "Press <s1>Save</s1> now.", None, LANGUAGES["zh"], profile=HY_MT15, options=options
    )
    assert item["input_tokens"] == len(engine.encode_prompt(expected))

    handler, context = start(tiny_model_dir, prompt_family="hunyuan-mt-chimera")
    body = {"text": "你好", "source_lang": "zh", "target_lang": "en", "candidates": ["Hi", "Hello"]}
    [(status, reply)] = handle(handler, context, [body])
    assert status == 200 and reply["translations"][0]["template"] == "refine"
    assert reply["translations"][0]["candidates"] == ["Hi", "Hello"]
    assert handler.describe()["model_family"]["required"] == ["candidates"]
