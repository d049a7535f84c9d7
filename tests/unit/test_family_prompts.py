"""HY-MT1.5's prompts (the model card's templates, exactly), the glossary and context fields,
and choosing the model family from the model folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.request.errors import InvalidRequest, PayloadTooLarge
from hymt_serve.request.families import HUNYUAN_MT_7B, HY_MT15, detect_profile
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import PromptOptions, build_prompt, relevant_terms
from hymt_serve.request.protocol import parse_request

L = LANGUAGES
SETTINGS = Settings.from_mapping(
    {"model_path": "/m", "max_glossary_terms": 3, "max_term_chars": 20, "max_context_chars": 60},
    environ={},
)


def test_hy_mt15_plain_templates() -> None:
    assert build_prompt("你好。", L["zh"], L["en"], profile=HY_MT15) == (
        "将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n\n你好。",
        "zh",
    )
    assert build_prompt("Hello.", L["en"], L["fr"], profile=HY_MT15) == (
        "Translate the following segment into French, without additional explanation.\n\nHello.",
        "en",
    )


def test_terminology_template_lists_only_the_terms_in_the_text() -> None:
    glossary = [("Hunyuan", "混元"), ("GPU", "图形处理器"), ("absent", "缺席")]
    prompt, template = build_prompt(
        "Hunyuan runs on a gpu.",
        L["en"],
        L["zh"],
        profile=HY_MT15,
        options=PromptOptions(glossary=tuple(glossary)),
    )
    assert template == "terminology"
    assert prompt == (
        "参考下面的翻译：\nHunyuan 翻译成 混元\nGPU 翻译成 图形处理器\n\n"
        "将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\nHunyuan runs on a gpu."
    )
    # No term occurs: the plain template, as if there were no glossary.
    plain = build_prompt(
        "Nothing here.",
        L["en"],
        L["de"],
        profile=HY_MT15,
        options=PromptOptions(glossary=tuple(glossary)),
    )
    assert plain[1] == "en"
    assert relevant_terms("ÉCOLE", [("école", "school")]) == [("école", "school")]


def test_context_template() -> None:
    prompt, template = build_prompt(
        "He left.",
        L["en"],
        L["ja"],
        profile=HY_MT15,
        options=PromptOptions(context="Tom is a cat."),
    )
    assert template == "context"
    assert prompt == (
        "Tom is a cat.\n"
        "参考上面的信息，把下面的文本翻译成日语，注意不需要翻译上文，也不要额外解释：\n"
        "He left.\n"
    )


def test_user_text_with_braces_stays_verbatim() -> None:
    prompt, _ = build_prompt(
        "{target} {text}", L["en"], L["zh"], profile=HY_MT15, options=PromptOptions(context="{x}")
    )
    assert prompt.startswith("{x}\n") and prompt.endswith("\n{target} {text}\n")


def write_config(folder: Path, name: str = "") -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"_name_or_path": name}))
    return folder


def test_family_from_the_folder_name_or_config(tmp_path: Path) -> None:
    assert detect_profile(write_config(tmp_path / "HY-MT1.5-7B")) is HY_MT15
    cache = tmp_path / "models--tencent--HY-MT1.5-1.8B" / "snapshots" / "abc"
    assert detect_profile(write_config(cache)) is HY_MT15
    assert detect_profile(write_config(tmp_path / "x", "tencent/HY-MT1.5-7B")) is HY_MT15
    assert detect_profile(write_config(tmp_path / "Hunyuan-MT-7B")) is HUNYUAN_MT_7B
    assert detect_profile(write_config(tmp_path / "anything")) is HUNYUAN_MT_7B
    assert detect_profile(tmp_path / "anything", "hy-mt1.5") is HY_MT15
    with pytest.raises(ConfigurationError, match="prompt_family"):
        detect_profile(tmp_path, "gpt")
    with pytest.raises(ConfigurationError, match="prompt_family"):
        Settings.from_mapping({"model_path": "/m", "prompt_family": "gpt"}, environ={})


BODY: dict[str, Any] = {"text": "Hunyuan MT", "target_lang": "zh"}


def test_glossary_and_context_parse_for_hy_mt15() -> None:
    glossary = [{"source": " Hunyuan ", "target": "混元"}]
    request = parse_request({**BODY, "glossary": glossary}, SETTINGS, HY_MT15)
    options = request.features.options
    assert options.glossary == (("Hunyuan", "混元"),) and options.context is None
    options = parse_request(
        {**BODY, "context": "A product name."}, SETTINGS, HY_MT15
    ).features.options
    assert options.context == "A product name." and options.glossary == ()


def test_a_field_the_model_does_not_support_names_the_model() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_request({**BODY, "context": "x"}, SETTINGS, HUNYUAN_MT_7B)
    assert refused.value.status == 400 and refused.value.field == "context"
    assert "Hunyuan-MT-7B" in refused.value.message
    assert refused.value.allowed == {"model": "Hunyuan-MT-7B", "features": []}


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"glossary": []}, InvalidRequest, "non-empty list"),
        ({"glossary": {"a": "b"}}, InvalidRequest, "non-empty list"),
        ({"glossary": [{"source": "a"}]}, InvalidRequest, "exactly the keys"),
        ({"glossary": [{"source": "a", "target": " "}]}, InvalidRequest, "non-empty string"),
        ({"glossary": [{"source": "a", "target": 3}]}, InvalidRequest, "non-empty string"),
        ({"glossary": [{"source": "a\nb", "target": "c"}]}, InvalidRequest, "several lines"),
        ({"glossary": [{"source": "a" * 21, "target": "c"}]}, PayloadTooLarge, "21 characters"),
        ({"glossary": [{"source": "a", "target": "b"}] * 4}, PayloadTooLarge, "4 pairs"),
        ({"context": ""}, InvalidRequest, "non-empty string"),
        ({"context": 5}, InvalidRequest, "non-empty string"),
        ({"context": "x" * 61}, PayloadTooLarge, "61 characters"),
        (
            {"context": "x", "glossary": [{"source": "a", "target": "b"}]},
            InvalidRequest,
            "cannot be combined",
        ),
    ],
)
def test_bad_glossary_or_context(fields: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        parse_request({**BODY, **fields}, SETTINGS, HY_MT15)
