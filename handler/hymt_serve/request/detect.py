"""Language identification among our 38 codes (:mod:`hymt_serve.request.languages`).

``detect(text)`` returns a :class:`Detection` (our code and a confidence in [0, 1]) or None when
unsure: too few letters, no script holding most of them (mixed text), or a confidence under
:data:`MIN_CONFIDENCE`.

Two stages:

1. **Script rules**, exact and cheap. A script that only one of our languages writes decides
   alone (Tibetan -> bo, Khmer -> km, Hangul -> ko, kana -> ja, ...). Han text is Chinese, and
   the characters decide which: Cantonese particles -> yue, else traditional against simplified
   forms -> zh-Hant or zh (no library tells these apart).
2. **The library** (py3langid: the most accurate of the candidates on our short sentences, its
   model inside the wheel, nothing downloaded) for scripts several of our languages share
   (Latin, Cyrillic, Arabic, Devanagari), its probabilities restricted to the candidates of
   that script. Uyghur letters that Arabic, Persian and Urdu lack decide ug first.

The ranker is a parameter so that the benchmark can compare libraries behind the same rules;
the default is py3langid, loaded once on first use.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hymt_serve.request.languages import SUPPORTED_CODES

MIN_CONFIDENCE = 0.5
MIN_LETTERS = 4  # Latin-like letters; a Han, kana or Hangul character counts as 2
DOMINANT_SHARE = 0.75  # a text whose main script has less of its letters is mixed: None

# A ranker takes a text and the candidate codes and returns (code, probability) pairs.
Ranker = Callable[[str, Sequence[str]], Sequence[tuple[str, float]]]


class Detection(NamedTuple):
    language: str  # one of our codes
    confidence: float  # 0..1


# Scripts that one of our languages alone writes.
_SINGLE = {
    "TIBETAN": "bo",
    "KHMER": "km",
    "MYANMAR": "my",
    "THAI": "th",
    "HANGUL": "ko",
    "KANA": "ja",
    "GUJARATI": "gu",
    "TELUGU": "te",
    "TAMIL": "ta",
    "BENGALI": "bn",
    "HEBREW": "he",
}
# Scripts several of ours share: the library chooses among these.
SHARED = {
    "LATIN": ("en", "fr", "pt", "es", "tr", "it", "de", "vi", "ms", "id", "tl", "pl", "cs", "nl"),
    "CYRILLIC": ("ru", "uk", "kk", "mn"),
    "ARABIC": ("ar", "fa", "ur", "ug"),
    "DEVANAGARI": ("hi", "mr"),
}
_UNICODE_NAMES = {"CJK": "HAN", "HIRAGANA": "KANA", "KATAKANA": "KANA"}
_WIDE = {"HAN", "KANA", "HANGUL"}  # one character carries about a word's worth of letters

# Letters of the Uyghur alphabet that Arabic, Persian and Urdu do not use.
_UYGHUR_LETTERS = frozenset("ېۆۈۇڭۋە")
# Words and particles written in Cantonese and not in standard written Chinese.
_CANTONESE = frozenset("嘅咗唔喺佢哋冇嘢啲乜嚟噉咁嗰啱咩睇揾搵嘞喇")
# Pairs (traditional, simplified) of common characters written differently in the two scripts.
_TRAD_SIMP = (
    "們们個个這这來来時时說说對对會会國国學学過过還还後后為为點点開开問问題题動动電电話话"
    "發发現现經经長长東东車车門门見见關关頭头應应樣样當当實实與与體体機机業业氣气無无麼么"
    "進进種种書书從从兩两錢钱買买賣卖報报網网務务單单號号線线請请謝谢間间邊边認认識识讓让"
    "連连設设計计訂订貨货運运費费換换紅红綠绿藍蓝黃黄馬马魚鱼鳥鸟雞鸡龍龙飛飞風风歡欢樂乐"
    "愛爱聽听讀读寫写語语誤误議议論论講讲變变離离難难雙双歲岁廣广場场華华萬万處处際际陸陆"
    "陽阳隊队醫医藥药師师員员閱阅區区級级紀纪約约結结給给統统續续總总維维練练組组織织終终"
    "塊块們们歷历縣县鄉乡壓压廠厂麗丽義义舊旧藝艺節节葉叶蘇苏衛卫視视覺觉親亲觀观計计記记"
    "詢询試试該该詳详誰谁課课調调談谈證证識识護护讚赞貝贝負负貴贵買买費费資资質质購购趕赶"
    "車车軟软較较輕轻輸输轉转辦办農农這这進进遠远適适選选還还郵邮鐘钟錯错鍵键門门問问閃闪"
    "陣阵隨随險险雖虽電电靜静順顺預预領领頁页題题類类顯显飯饭飲饮館馆騎骑驗验體体髮发"
    "黨党齊齐齒齿圖图園园團团圓圆價价備备傳传傷伤優优兒儿內内冊册劃划劇剧勞劳勢势"
    "區区協协參参叢丛吳吴啟启喚唤嚴严圍围夠够夢梦奮奋婦妇孫孙寧宁寶宝導导島岛幫帮幣币"
)
_TRADITIONAL = frozenset(_TRAD_SIMP[0::2])
_SIMPLIFIED = frozenset(_TRAD_SIMP[1::2])


def script_of(char: str) -> str | None:
    """The script of a letter (Unicode name's first word, CJK -> HAN, kana -> KANA), or None."""
    if not char.isalpha():
        return None
    try:
        first = unicodedata.name(char).split(" ", 1)[0]
    except ValueError:
        return None
    return _UNICODE_NAMES.get(first, first)


def script_counts(text: str) -> dict[str, int]:
    """Letter weights per script (a Han, kana or Hangul character counts as 2)."""
    counts: dict[str, int] = {}
    for char in text:
        script = script_of(char)
        if script is not None:
            counts[script] = counts.get(script, 0) + (2 if script in _WIDE else 1)
    # Japanese writes Han and kana together: with enough kana the Han characters are Japanese.
    kana, han = counts.get("KANA", 0), counts.get("HAN", 0)
    if kana and kana * 5 >= han:
        counts["KANA"] = kana + counts.pop("HAN", 0)
    return counts


def variant_evidence(text: str) -> tuple[int, int]:
    """How many characters of ``text`` are written the traditional way and how many the
    simplified way (among common characters the two scripts write differently)."""
    traditional = sum(char in _TRADITIONAL for char in text)
    simplified = sum(char in _SIMPLIFIED for char in text)
    return traditional, simplified


def chinese_variant(text: str) -> Detection:
    """yue, zh-Hant or zh for a Han text: Cantonese particles, then traditional vs simplified."""
    cantonese = sum(char in _CANTONESE for char in text)
    if cantonese:
        return Detection("yue", min(1.0, 0.6 + 0.2 * cantonese))
    traditional, simplified = variant_evidence(text)
    if traditional > simplified:
        return Detection("zh-Hant", traditional / (traditional + simplified))
    if simplified > traditional:
        return Detection("zh", simplified / (traditional + simplified))
    # Nothing tells the scripts apart: most characters are the same in both; say zh, less sure.
    return Detection("zh", 0.6)


def detect(text: str, ranker: Ranker | None = None) -> Detection | None:
    """The language of ``text`` among our codes, or None when unsure (see the module doc)."""
    counts = script_counts(text)
    total = sum(counts.values())
    if total < MIN_LETTERS:
        return None
    script, weight = max(counts.items(), key=lambda item: item[1])
    if weight < DOMINANT_SHARE * total:
        return None
    share = weight / total
    if script in _SINGLE:
        return Detection(_SINGLE[script], share)
    if script == "HAN":
        found = chinese_variant(text)
        return Detection(found.language, found.confidence * share)
    candidates = SHARED.get(script)
    if candidates is None:
        return None  # a script none of our languages writes (Greek, Armenian, ...)
    if script == "ARABIC" and any(char in _UYGHUR_LETTERS for char in text):
        return Detection("ug", share)
    ranked = (ranker or py3langid_ranker)(text, candidates)
    if not ranked:
        return None
    language, probability = max(ranked, key=lambda item: item[1])
    confidence = probability * share
    return Detection(language, confidence) if confidence >= MIN_CONFIDENCE else None


_LOCK = threading.Lock()
_IDENTIFIER: Any = None


def _identifier() -> Any:
    """py3langid's identifier restricted to our languages, built once on first use (about half
    a second to unpack its model): importing this module stays cheap for callers that never
    detect."""
    global _IDENTIFIER
    if _IDENTIFIER is not None:  # every detection after the first: no lock
        return _IDENTIFIER
    with _LOCK:
        if _IDENTIFIER is None:
            # Start-up cost: unpacking the model takes about half a second, paid on first use.
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
            known = set(identifier.nb_classes)
            identifier.set_languages([code for code in SUPPORTED_CODES if code in known])
            _IDENTIFIER = identifier
        return _IDENTIFIER


def py3langid_ranker(text: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
    """py3langid's probabilities over ``candidates``, renormalised to sum to 1."""
    scores = {code: float(p) for code, p in _identifier().rank(text) if code in candidates}
    total = sum(scores.values())
    return [(code, score / total) for code, score in scores.items()] if total > 0 else []


def preload() -> None:
    """Build the default identifier now (a server calls this at start so no request waits)."""
    _identifier()
