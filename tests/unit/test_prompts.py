"""Golden prompt strings: the model card's templates, exactly."""

from __future__ import annotations

import pytest

from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import build_prompt

L = LANGUAGES


@pytest.mark.parametrize(
    ("text", "source", "target", "expected", "template"),
    [
        (
            "你好，世界。",
            "zh",
            "en",
            "把下面的文本翻译成英语，不要额外解释。\n\n你好，世界。",
            "zh",
        ),
        (
            "Hello, world.",
            "en",
            "zh",
            "把下面的文本翻译成中文，不要额外解释。\n\nHello, world.",
            "zh",
        ),
        (
            "Good morning.",
            "en",
            "fr",
            "Translate the following segment into French, without additional explanation."
            "\n\nGood morning.",
            "en",
        ),
        (
            "مرحبا بالعالم",
            "ar",
            "en",
            "Translate the following segment into English, without additional explanation."
            "\n\nمرحبا بالعالم",
            "en",
        ),
        (
            "Good night.",
            "en",
            "ar",
            "Translate the following segment into Arabic, without additional explanation."
            "\n\nGood night.",
            "en",
        ),
        ("こんにちは", "ja", "zh", "把下面的文本翻译成中文，不要额外解释。\n\nこんにちは", "zh"),
        (
            "こんにちは",
            "ja",
            "en",
            "Translate the following segment into English, without additional explanation."
            "\n\nこんにちは",
            "en",
        ),
        ("早晨", "yue", "en", "把下面的文本翻译成英语，不要额外解释。\n\n早晨", "zh"),
        ("你好", "zh", "zh-Hant", "把下面的文本翻译成繁体中文，不要额外解释。\n\n你好", "zh"),
        ("Hello", "en", "yue", "把下面的文本翻译成粤语，不要额外解释。\n\nHello", "zh"),
    ],
)
def test_golden_prompts(text: str, source: str, target: str, expected: str, template: str) -> None:
    assert build_prompt(text, L[source], L[target]) == (expected, template)


@pytest.mark.parametrize(
    ("text", "target", "template"),
    [
        ("今天天气很好", "en", "zh"),  # Han only: Chinese side
        ("今日はいい天気", "en", "en"),  # kana: Japanese, not Chinese
        ("오늘 날씨가 좋네요", "en", "en"),
        ("The weather is nice", "fr", "en"),
        ("The weather is nice", "zh", "zh"),  # target Chinese decides
        ("GPU 很快很好", "en", "zh"),
        ("Use the GPU, it is 快", "en", "en"),  # mostly Latin letters
    ],
)
def test_missing_source_uses_a_script_check(text: str, target: str, template: str) -> None:
    assert build_prompt(text, None, L[target])[1] == template
