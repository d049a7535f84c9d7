"""Language identification among our codes: script rules, the Chinese split, the library."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hymt_serve.request import detect as detect_module
from hymt_serve.request.detect import Detection, detect
from hymt_serve.request.languages import SUPPORTED_CODES

GOLDEN = [
    ("The train leaves at half past seven.", "en"),
    ("Le train part à sept heures et demie.", "fr"),
    ("Der Zug fährt um halb acht ab.", "de"),
    ("Поезд отправляется в половине восьмого.", "ru"),
    ("Потяг відправляється о пів на восьму.", "uk"),
    ("يغادر القطار في السابعة والنصف.", "ar"),
    ("ٹرین ساڑھے سات بجے روانہ ہوتی ہے۔", "ur"),
    ("ئەتە ھېسابات قەغىزىنى ئەۋەتىمىز.", "ug"),
    ("ट्रेन साढ़े सात बजे निकलती है।", "hi"),
    ("電車は七時半に出発します。", "ja"),
    ("기차는 일곱 시 반에 출발합니다.", "ko"),
    ("รถไฟออกเวลาเจ็ดโมงครึ่ง", "th"),
    ("נשלח את החשבונית מחר.", "he"),
    ("སྟོད་ཐུང་འདིའི་གོང་ཚད་ག་ཚོད་རེད།", "bo"),
    ("អាវនេះតម្លៃប៉ុន្មាន?", "km"),
    ("今天天气很好，我们去公园散步吧。", "zh"),
    ("今天天氣很好，我們去公園散步吧。", "zh-Hant"),
    ("我哋聽日寄張單畀你。", "yue"),
]


@pytest.mark.parametrize(("text", "language"), GOLDEN)
def test_golden_sentences(text: str, language: str) -> None:
    found = detect(text)
    assert found is not None and found.language == language, found
    assert 0.5 <= found.confidence <= 1.0


def test_simplified_and_traditional_are_told_apart_by_characters() -> None:
    assert detect("请把这份文件发给我。") == Detection("zh", 1.0)
    assert detect("請把這份文件發給我。") == Detection("zh-Hant", 1.0)


@pytest.mark.parametrize("text", ["", "   ", "ok", "12345 !!!", "a1"])
def test_too_short_is_unsure(text: str) -> None:
    assert detect(text) is None


@pytest.mark.parametrize("text", ["Hello 你好世界", "hello мир", "Привет hello world там"])
def test_mixed_scripts_are_unsure(text: str) -> None:
    assert detect(text) is None


def test_a_script_none_of_ours_writes_is_unsure() -> None:
    assert detect("Το τρένο φεύγει στις επτά και μισή.") is None


def test_the_ranker_sees_only_the_candidates_of_the_script() -> None:
    seen: list[Sequence[str]] = []

    def ranker(text: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
        seen.append(candidates)
        return [(candidates[0], 0.9), (candidates[1], 0.1)]

    assert detect("Поезд отправляется", ranker) == Detection("ru", 0.9)
    assert seen == [("ru", "uk", "kk", "mn")]


def test_a_low_library_confidence_is_unsure() -> None:
    def unsure(text: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
        return [("ms", 0.45), ("id", 0.55 * 0.8)]

    assert detect("Saya lupa payung saya", unsure) is None


def test_every_answer_is_one_of_our_codes() -> None:
    shared = {code for codes in detect_module.SHARED.values() for code in codes}
    codes = shared | set(detect_module._SINGLE.values())
    assert codes <= set(SUPPORTED_CODES) - {"zh", "zh-Hant", "yue"}
    assert set(SUPPORTED_CODES) == codes | {"zh", "zh-Hant", "yue"}


def test_the_library_ranker_is_restricted_to_the_candidates() -> None:
    ranked = detect_module.py3langid_ranker("Saya lupa payung saya di kantor", ("ms", "id"))
    assert {code for code, _ in ranked} == {"ms", "id"}
    assert sum(p for _, p in ranked) == pytest.approx(1.0)
