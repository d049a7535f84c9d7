"""Judging a translation's language against its target (request/target_check.py): wrong only
on clear evidence; short, mixed and copied text, and the pairs the detector confuses, never."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from hymt_serve.request import detect
from hymt_serve.request.languages import CHINESE_CODES, LANGUAGES, SUPPORTED_CODES
from hymt_serve.request.target_check import WRITTEN_IN, Verdict, verdict

REPO = Path(__file__).resolve().parents[2]
SURE = 0.8  # the setting's default

JAPANESE = "明日の朝、駅で会いましょう。"
HINDI = "कल सुबह स्टेशन पर मिलते हैं।"
ENGLISH = "Let us meet at the station tomorrow morning."
FRENCH = "Retrouvons-nous à la gare demain matin."


def judge(output: str, target: str, source: str = ENGLISH, confidence: float = SURE) -> Verdict:
    return verdict(output, source, LANGUAGES[target], confidence=confidence)


def sentences() -> list[tuple[str, str]]:
    """(language, text): the language identification benchmark's sentences (all 38 languages)
    and the load test's segments."""
    found = []
    for line in (REPO / "benchmarks/langid/sentences.jsonl").read_text("utf-8").splitlines():
        row = json.loads(line)
        found.append((row["lang"], row["text"]))
    for line in (REPO / "loadtest/data/segments.jsonl").read_text("utf-8").splitlines():
        row = json.loads(line)
        found.append((row["source_lang"], row["text"]))
    return found


def test_the_reported_case_is_wrong_and_the_right_answer_ok() -> None:
    assert judge(HINDI, "ja") == "wrong"  # English to Japanese came out in Hindi
    assert judge(JAPANESE, "ja") == "ok"
    assert judge(FRENCH, "en", source=JAPANESE) == "wrong"
    assert judge(ENGLISH, "en", source=JAPANESE) == "ok"


def test_no_sentence_is_wrong_for_its_own_language() -> None:
    """Hundreds of real sentences, each judged as the translation into its own language: a
    false alarm costs a retry and tells the client its good translation is suspect."""
    wrong = [(code, text) for code, text in sentences() if judge(text, code, source="") == "wrong"]
    assert wrong == []


def test_most_sentences_are_wrong_for_another_language() -> None:
    """The other direction: a sentence answered for any other target is nearly always caught
    (what is missed is short text, the pairs the detector confuses, Han for Japanese)."""
    caught = total = 0
    for code, text in sentences():
        for target in SUPPORTED_CODES:
            related = {code, target} <= CHINESE_CODES or target == code
            if not related:
                total += 1
                caught += judge(text, target, source="") == "wrong"
    assert caught / total > 0.95


@pytest.mark.parametrize(
    "output",
    ["OK", "42", "Tokyo", "3.14159", "iPhone 15", "—", "", "   ", "Hi!", "你好"],
)
def test_short_output_is_unsure(output: str) -> None:
    assert judge(output, "ja") == "unsure"


@pytest.mark.parametrize(
    ("source", "output"),
    [
        ("Angela Merkel", "Angela Merkel"),
        ("print(len(items))", "print(len(items))"),
        ("Order #A-1042, 3 x USB-C cable", "Order #A-1042, 3 x USB-C cable"),
        ("GitHub Copilot Visual Studio Code", "GitHub Copilot Visual Studio Code"),
    ],
)
def test_an_output_that_copies_its_source_is_unsure(source: str, output: str) -> None:
    assert judge(output, "ja", source=source) == "unsure"
    assert judge(output.upper(), "zh", source=source) == "unsure"  # compared case-folded


def test_words_copied_from_the_source_are_no_evidence() -> None:
    source = "Buy the Apple Watch Series 9 GPS Cellular Titanium Edition today"
    output = "Apple Watch Series 9 GPS Cellular Titanium Edition を購入"
    assert judge(output, "ja", source=source) != "wrong"
    # the same output, its English words not in the source: English for Japanese
    assert judge(output, "ja", source="今日、新しい時計を買ってください") == "wrong"


def test_tags_urls_and_addresses_are_no_evidence() -> None:
    """Counted, their Latin letters would make these Japanese outputs mixed (unsure)."""
    output = "<s1>詳しくは</s1> https://example.com/some/very/long/english/path を参照"
    assert judge(output, "ja") == "ok"
    assert judge("詳細は someone.important@example.com までご連絡ください", "ja") == "ok"
    assert judge("<target>明日の朝、駅で会いましょう。</target>", "ja") == "ok"


def test_mixed_scripts_are_unsure() -> None:
    assert judge("Meeting 明日の朝 station at nine 駅で", "ja") == "unsure"


@pytest.mark.parametrize(
    ("output", "target", "told"),
    [
        ("Saya akan pergi ke stesen kereta api esok pagi.", "id", "ms"),
        ("Saya akan pergi ke stasiun kereta besok pagi.", "ms", "id"),
        ("मी उद्या सकाळी स्टेशनवर जाईन.", "hi", "mr"),
        ("मैं कल सुबह स्टेशन जाऊंगा।", "mr", "hi"),
    ],
)
def test_the_pairs_the_detector_confuses_are_never_wrong(
    output: str, target: str, told: str
) -> None:
    assert judge(output, target) == "ok"


def test_traditional_and_simplified_need_clear_evidence() -> None:
    simplified = "我们这个时间说话会来不及。"
    traditional = "我們這個時間說話會來不及。"
    neutral = "今天天气很好。"  # 气 alone is written the simplified way
    assert judge(simplified, "zh-Hant") == "wrong"
    assert judge(traditional, "zh") == "wrong"
    assert judge(traditional, "zh-Hant") == "ok" and judge(simplified, "zh") == "ok"
    assert judge(neutral, "zh-Hant") == "ok"  # a single differing character is not enough
    assert judge(simplified, "yue") == "ok" and judge(traditional, "yue") == "ok"


def test_han_is_japanese_or_chinese_and_never_korean() -> None:
    chinese = "我们明天早上在火车站见面吧。"
    assert judge(chinese, "ja") == "unsure"  # no kana to tell it from Japanese
    assert judge(chinese, "ko") == "wrong"
    assert judge(JAPANESE, "zh") == "wrong"  # kana: Japanese, for Chinese


def test_kazakh_and_mongolian_in_the_scripts_of_china() -> None:
    kazakh_arabic = "ەرتەڭ تاڭەرتەڭ ۆوكزالدا كەزدەسەيىك"
    mongolian_script = "ᠮᠠᠷᠭᠠᠰᠢ ᠦᠭᠡᠯᠡᠭᠡ ᠸᠠᠭᠵᠠᠯ ᠳᠤ ᠤᠴᠠᠷᠠᠯᠴᠠᠶ᠎ᠠ"
    assert judge(kazakh_arabic, "kk") == "unsure"  # the detector ranks no Kazakh there
    assert judge(mongolian_script, "mn") == "ok"
    assert judge(mongolian_script, "ja") == "wrong"


def test_the_threshold_decides_a_ranked_language() -> None:
    """Within a shared script the ranker's probability, times the script's share, must reach
    the threshold; the ranker here stands in for the library with fixed probabilities."""

    def fairly_sure(text: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
        return [("fr", 0.85), ("en", 0.15)]

    for confidence, expected in ((0.8, "wrong"), (0.9, "unsure")):
        found = verdict(FRENCH, "", LANGUAGES["en"], confidence=confidence, ranker=fairly_sure)
        assert found == expected


def test_a_script_alone_is_wrong_only_when_it_holds_enough_of_the_letters() -> None:
    output = "कल सुबह स्टेशन पर मिलते हैं abc"  # 15 Devanagari letters, 3 Latin: 0.83
    assert judge(output, "ja", confidence=0.8) == "wrong"
    assert judge(output, "ja", confidence=0.95) == "unsure"


def test_every_language_writes_the_script_the_detector_gives_it() -> None:
    """WRITTEN_IN agrees with the detector: each language's own sentences are in one of the
    scripts it is said to write."""
    assert set(WRITTEN_IN) == set(SUPPORTED_CODES)
    for code, text in sentences():
        counts = detect.script_counts(text)
        if counts:
            script = max(counts.items(), key=lambda item: item[1])[0]
            assert script in WRITTEN_IN[code], (code, text)
