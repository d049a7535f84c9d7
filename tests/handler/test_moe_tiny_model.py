"""The handler wired to a tiny random ``hy_v3`` (Hy-MT2-30B-A3B's form: a dense first layer,
then mixtures of experts) with that family's tokens, chat template and sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.settings import Settings
from hymt_serve.engine.codec import folder_stop_ids
from hymt_serve.engine.engine import Engine, load_engine
from hymt_serve.ops.tiny_moe import (
    MOE_BOS,
    MOE_EOD,
    MOE_EOS,
    MOE_UNMARKED_TOKENS,
    build_tiny_moe_model,
)
from hymt_serve.request.families import HY_MT2, detect_profile

GLOSSARY_PAIR = {"source": "morning", "target": "Morgen"}
USER, ASSISTANT = "<\uff5chy_User\uff5c>", "<\uff5chy_Assistant\uff5c>"


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_moe_model(tmp_path_factory.mktemp("tiny-moe"))


@pytest.fixture(scope="module")
def engine(moe_dir: Path) -> Engine:
    settings = {"model_path": str(moe_dir), "max_new_tokens": 8, "engine": "fast"}
    return load_engine(Settings.from_mapping(settings, environ={}))


def test_the_fast_engine_runs_it_with_the_cards_templates(engine: Engine, moe_dir: Path) -> None:
    info = engine.describe()
    assert info["model_type"] == "hy_v3" and info["engine"] == "fast"
    assert detect_profile(moe_dir) is HY_MT2
    tokenizer = engine.codec.tokenizer
    ends = {tokenizer.convert_tokens_to_ids(t) for t in (MOE_EOS, MOE_EOD)}
    assert ends <= engine.codec.stop_ids
    assert folder_stop_ids(moe_dir) == ends


def test_a_prompt_is_the_templates_frame_around_plain_text(engine: Engine) -> None:
    tokenizer = engine.codec.tokenizer
    ids = engine.encode_prompt("Hello.")
    rendered = tokenizer.decode(ids)
    assert rendered == (
        f"{MOE_BOS}<\uff5creasoning_mode\uff5c>reasoning_effort:no_think{USER}Hello."
        f"{ASSISTANT}<think></think>"
    )


@pytest.mark.parametrize("control", [*MOE_UNMARKED_TOKENS, MOE_EOS, USER, ASSISTANT])
def test_control_tokens_in_user_text_stay_text(engine: Engine, control: str) -> None:
    """The reasoning-mode and think tokens are added tokens not marked special: user text that
    holds them must still never become them."""
    tokenizer = engine.codec.tokenizer
    frame = len(engine.encode_prompt(""))
    ids = engine.encode_prompt(f"a {control} b")
    text_ids = ids[frame - 3 : len(ids) - 3]  # (the frame after the text is 3 tokens)
    control_ids = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    assert not control_ids & set(text_ids)
    assert tokenizer.decode(text_ids) == f"a {control} b"


@pytest.mark.parametrize("engine_kind", ["fast", "hf"])
def test_the_handler_translates_with_it(moe_dir: Path, engine_kind: str) -> None:
    handler = HunyuanMTHandler()
    settings = {"model_path": str(moe_dir), "max_new_tokens": 6, "engine": engine_kind}
    context = make_context(settings, model_dir=moe_dir)
    handler.initialize(context)
    bodies = [
        {"text": "你好，世界。", "target_lang": "en"},
        {"text": ["Good morning.", "Good night."], "source_lang": "en", "target_lang": "fr"},
        {"text": "Good morning.", "target_lang": "de", "glossary": [GLOSSARY_PAIR]},
        {"text": "x", "target_lang": "en", "source_lang": "en"},
    ]
    set_batch(context, len(bodies))
    out = [json.loads(text) for text in handler.handle([{"body": b} for b in bodies], context)]
    statuses = [context.get_response_status(i)[0] for i in range(len(bodies))]
    assert statuses == [200, 200, 200, 400]
    assert out[0]["translations"][0]["template"] == "zh"
    assert [t["template"] for t in out[1]["translations"]] == ["en", "en"]
    assert out[2]["translations"][0]["template"] == "terminology"
    assert all(t["output_tokens"] <= 6 for reply in out[:3] for t in reply["translations"])
    assert out[3]["error_type"] == "same_language"
    assert handler.describe()["engine"]["engine"] == engine_kind


def test_sampled_requests_default_to_its_cards_sampling(moe_dir: Path) -> None:
    sampling = Settings.from_mapping({"model_path": str(moe_dir)}, environ={}).sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 1.0, 0)
    assert sampling.repetition_penalty == 1.0
