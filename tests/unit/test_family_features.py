"""Hy-MT2's and Chimera's templates, the formatted-text field, and how the request fields of the
families are checked (one feature per request, required fields, limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hymt_serve.core.config import Loading, spec_of
from hymt_serve.core.settings import Settings
from hymt_serve.request.errors import InvalidRequest, PayloadTooLarge
from hymt_serve.request.families import (
    CHIMERA,
    HUNYUAN_MT_7B,
    HY_MT2,
    HY_MT15,
    MARKER_FILE,
    PROFILES,
    detect_profile,
)
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import PromptOptions, build_prompt
from hymt_serve.request.protocol import parse_request

L = LANGUAGES
SETTINGS = Settings.from_mapping(
    {"model_path": "/m", "max_instruction_chars": 30, "max_chars_per_text": 50}, environ={}
)


def test_every_profile_is_a_setting_choice() -> None:
    assert spec_of(Loading, "prompt_family").choices == ("auto", *PROFILES)


def test_hy_mt2_plain_and_terminology_in_both_languages() -> None:
    assert build_prompt("Hi.", L["en"], L["fr"], profile=HY_MT2) == (
        "Translate the following text into French. Note that you should only output the "
        "translated result without any additional explanation:\n\nHi.",
        "en",
    )
    assert build_prompt("你好。", L["zh"], L["en"], profile=HY_MT2)[0] == (
        "将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n\n你好。"
    )
    glossary = (("GPU", "carte graphique"), ("CPU", "processeur"))
    prompt, template = build_prompt(
        "A GPU and a CPU.", L["en"], L["fr"], profile=HY_MT2, options=PromptOptions(glossary)
    )
    assert template == "terminology"
    assert prompt == (
        "Reference the following translations:\nGPU translates to carte graphique\n"
        "CPU translates to processeur\n\nTranslate the following text into French. Note that "
        "you must ONLY output the translated result without any additional explanation:\n\n"
        "A GPU and a CPU."
    )
    prompt, _ = build_prompt(
        "一个GPU。", L["zh"], L["en"], profile=HY_MT2, options=PromptOptions((("GPU", "显卡"),))
    )
    assert prompt == (
        "参考下面的翻译：\nGPU 翻译成 显卡\n"
        "将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n\n一个GPU。"
    )


def test_hy_mt2_style_preferences_delimiters() -> None:
    style = build_prompt(
        "Hi.", L["en"], L["de"], profile=HY_MT2, options=PromptOptions(style="formal")
    )
    assert style == (
        "Please translate the following text into German. Note that the translation style must "
        "strictly conform to [formal]:\n\nHi.",
        "style",
    )
    assert build_prompt(
        "你好", L["zh"], L["ja"], profile=HY_MT2, options=PromptOptions(style="口语")
    )[0] == ("请将以下文本翻译为日语。\n注意翻译的风格要严格符合【口语】\n\n你好")
    preferences = PromptOptions(preferences=("Keep names in English", "Use metric units"))
    assert build_prompt("Hi.", L["en"], L["de"], profile=HY_MT2, options=preferences)[0] == (
        "[Source Text]\nHi.\n\n[Translation Tasks]\n1. Keep names in English\n"
        "2. Use metric units\n3. Translate the [Source Text] into German."
    )
    assert build_prompt("你好", L["zh"], L["en"], profile=HY_MT2, options=preferences)[0] == (
        "【待翻译文本】\n你好\n\n【翻译任务】\n1、Keep names in English\n2、Use metric units\n"
        "3、将【待翻译文本】翻译为英语。"
    )
    prompt, template = build_prompt(
        "a | b", L["en"], L["zh"], profile=HY_MT2, options=PromptOptions(delimiters=True)
    )
    assert template == "delimiters" and prompt.startswith("请将以下文本准确翻译为中文。\n你必须")


def test_hy_mt2_structured_data_keeps_the_placeholder_examples_literal() -> None:
    options = PromptOptions(data_format="JSON")
    prompt, template = build_prompt(
        '{"a": "{x}"}', L["zh"], L["en"], profile=HY_MT2, options=options
    )
    assert template == "structured"
    assert "将下方数据输入中的JSON格式数据翻译为英语。" in prompt
    assert "（如 {{var}}、${var}、%s、%d 等）" in prompt
    assert prompt.endswith('# 数据输入\n{"a": "{x}"}')
    english, _ = build_prompt("a: b", L["en"], L["de"], profile=HY_MT2, options=options)
    assert english.startswith("### Task\nTranslate the user-facing text within the following JSON")
    assert english.endswith("### Source Data\na: b")


def test_hy_mt2_background_information_is_its_context() -> None:
    prompt, template = build_prompt(
        "He left.", L["en"], L["fr"], profile=HY_MT2, options=PromptOptions(context="Tom: a cat.")
    )
    assert template == "context"
    assert prompt == (
        "[Background Information]\nTom: a cat.\n\nPlease translate the following text into "
        "French, taking the provided background information into consideration.\n\n"
        "[Source Text]\nHe left."
    )


def test_chimera_numbers_the_candidates_in_the_cards_template() -> None:
    prompt, template = build_prompt(
        "你好", L["zh"], L["en"], profile=CHIMERA, candidates=("Hello", "Hi")
    )
    assert template == "refine"
    assert prompt == (
        "Analyze the following multiple English translations of the Chinese segment surrounded "
        "in triple backticks and generate a single refined English translation. Only output the "
        "refined translation, do not explain.\n\nThe Chinese segment:\n```你好```\n\n"
        "The multiple `English` translations:\n1. ```Hello```\n2. ```Hi```\n"
    )


def test_hy_mt15_formatted_template_names_the_target() -> None:
    options = PromptOptions(preserve_format="tags")
    prompt, template = build_prompt(
        "<s1>Hi</s1>", L["en"], L["zh"], profile=HY_MT15, options=options
    )
    assert template == "formatted"
    assert prompt == (
        "将以下<source></source>之间的文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释，"
        "原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。"
        "输出格式为：<target>str</target>\n\n<source><s1>Hi</s1></source>"
    )
    other = build_prompt("<s1>Hi</s1>", L["en"], L["fr"], profile=HY_MT15, options=options)
    assert "之间的文本翻译为法语，" in other[0]


def test_marker_file_names_the_family(tmp_path: Path) -> None:
    (tmp_path / MARKER_FILE).write_text("hy-mt2\n")
    assert detect_profile(tmp_path) is HY_MT2
    assert detect_profile(tmp_path, "hy-mt1.5") is HY_MT15  # the setting wins
    assert detect_profile(tmp_path.parent / "Hunyuan-MT-Chimera-7B") is CHIMERA
    assert detect_profile(tmp_path.parent / "Hy-MT2-7B") is HY_MT2


BODY: dict[str, Any] = {"text": "Hello world", "target_lang": "zh", "source_lang": "en"}


@pytest.mark.parametrize(
    ("profile", "fields", "error", "match"),
    [
        (HY_MT2, {"style": "x" * 31}, PayloadTooLarge, "31 characters"),
        (HY_MT2, {"style": 3}, InvalidRequest, "non-empty string"),
        (HY_MT2, {"preferences": []}, InvalidRequest, "non-empty list"),
        (HY_MT2, {"preferences": ["a"] * 17}, PayloadTooLarge, "17 items"),
        (HY_MT2, {"preferences": ["a\nb"]}, InvalidRequest, "several lines"),
        (HY_MT2, {"delimiters": False}, InvalidRequest, "must be true"),
        (HY_MT2, {"data_format": "docx"}, InvalidRequest, "data_format"),
        (HY_MT2, {"style": "formal", "delimiters": True}, InvalidRequest, "cannot be combined"),
        (HY_MT2, {"preserve_format": True}, InvalidRequest, "does not support"),
        (HY_MT15, {"preserve_format": "rtf"}, InvalidRequest, "preserve_format must be"),
        (HY_MT15, {"preserve_format": True, "stream": True}, InvalidRequest, "cannot stream"),
        (HY_MT15, {"style": "formal"}, InvalidRequest, "does not support"),
        (HUNYUAN_MT_7B, {"candidates": ["a"]}, InvalidRequest, "does not support"),
        (CHIMERA, {}, InvalidRequest, "needs 'candidates'"),
        (CHIMERA, {"candidates": []}, InvalidRequest, "1 to 6"),
        (CHIMERA, {"candidates": ["a"] * 7}, InvalidRequest, "1 to 6"),
        (CHIMERA, {"candidates": ["a", ""]}, InvalidRequest, r"candidates\[1\]"),
        (CHIMERA, {"candidates": ["x" * 51]}, PayloadTooLarge, "51 characters"),
        (CHIMERA, {"candidates": ["a"], "source_lang": None}, InvalidRequest, "source_lang"),
        (CHIMERA, {"candidates": ["a"], "text": ["a", "b"]}, InvalidRequest, "per text"),
    ],
)
def test_bad_feature_fields(profile: Any, fields: dict[str, Any], error: type, match: str) -> None:
    body = {key: value for key, value in {**BODY, **fields}.items() if value is not None}
    with pytest.raises(error, match=match):
        parse_request(body, SETTINGS, profile)


def test_feature_fields_parse() -> None:
    request = parse_request(
        {**BODY, "text": ["a", "b"], "candidates": [["x"], ["y", "z"]]}, SETTINGS, CHIMERA
    )
    assert request.features.candidates == (("x",), ("y", "z"))
    options = parse_request({**BODY, "data_format": "yaml"}, SETTINGS, HY_MT2).features.options
    assert options.data_format == "YAML"
    options = parse_request({**BODY, "preserve_format": True}, SETTINGS, HY_MT15).features.options
    assert options.preserve_format == "tags"
    prefs = parse_request({**BODY, "preferences": [" a "]}, SETTINGS, HY_MT2).features.options
    assert prefs.preferences == ("a",)
