from __future__ import annotations

import pytest

from hymt_serve.request.languages import CHINESE_CODES, LANGUAGES, SUPPORTED_CODES, lookup

MODEL_CARD_CODES = [
    *[
        "zh",
        "en",
        "fr",
        "pt",
        "es",
        "ja",
        "tr",
        "ru",
        "ar",
        "ko",
        "th",
        "it",
        "de",
        "vi",
        "ms",
        "id",
        "tl",
        "hi",
        "zh-Hant",
        "pl",
        "cs",
        "nl",
        "km",
        "my",
        "fa",
    ],
    *["gu", "ur", "te", "mr", "he", "bn", "ta", "uk", "bo", "kk", "mn", "ug", "yue"],
]


def test_all_38_model_card_languages_are_supported() -> None:
    assert list(SUPPORTED_CODES) == MODEL_CARD_CODES
    assert len(SUPPORTED_CODES) == 38


def test_every_language_has_both_names() -> None:
    for language in LANGUAGES.values():
        assert language.english.isascii() and language.english
        assert language.chinese and not language.chinese.isascii()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("zh", "zh"),
        ("ZH", "zh"),
        ("zh-hant", "zh-Hant"),
        ("zh_Hant", "zh-Hant"),
        (" en ", "en"),
        ("YUE", "yue"),
    ],
)
def test_lookup_is_case_insensitive(raw: str, code: str) -> None:
    found = lookup(raw)
    assert found is not None and found.code == code


@pytest.mark.parametrize("raw", ["", "xx", "zh-Hans", "english", "zh-TW", "eng"])
def test_unknown_codes(raw: str) -> None:
    assert lookup(raw) is None


def test_chinese_side() -> None:
    assert {c for c, lang in LANGUAGES.items() if lang.is_chinese} == set(CHINESE_CODES)
    assert {"zh", "zh-Hant", "yue"} == CHINESE_CODES
