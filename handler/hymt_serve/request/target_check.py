"""Whether a translation came out in its target language: "ok", "unsure" or "wrong".

The model now and then answers in another language than the one asked for (English to Japanese
coming out in Hindi). :func:`verdict` judges one output against its target, on evidence only:

1. **What the output copied is no evidence.** Tags, URLs and e-mail addresses are set aside,
   and so is every word the output shares with its source (names, numbers, code, brands kept
   as they are; an output that equals its source is left with nothing). Fewer than
   :data:`MIN_LETTERS` letters left (a Han, kana or Hangul character counts as 2): unsure.
2. **Script first.** No script holding most of what is left (mixed text): unsure. A script the
   target never writes (Devanagari for Japanese, Han for Korean) is wrong when it holds at
   least ``confidence`` of the letters.
3. **Then the language within the script.** A script only the target writes (kana, Hangul,
   Thai, ...): ok. Han for a Chinese target: ok, unless the characters clearly say the other
   Chinese script (at least :data:`MIN_VARIANT_CHARS` characters written differently in
   traditional and simplified, all of them the other way): zh-Hant written in simplified is
   wrong, and so is zh written in traditional; Cantonese may be written either way. Han for
   Japanese: unsure (no kana to tell it from Chinese). A script several of our languages
   share (Latin, Cyrillic, Arabic, Devanagari): the detector's ranker
   (:mod:`hymt_serve.request.detect`) among that script's languages; the target or a close
   relative the detector confuses with it (:data:`CLOSE`: Malay and Indonesian, Hindi and
   Marathi) is ok; another language is wrong when its confidence reaches ``confidence`` on at
   least :data:`MIN_RANKED_LETTERS` letters, else unsure. A script the target writes that the
   detector cannot rank for it (Kazakh in Arabic letters): unsure.

Pure Python (py3langid's model, loaded once by :mod:`.detect`); under a millisecond a sentence.
"""

from __future__ import annotations

import re
from typing import Literal

from hymt_serve.request.detect import (
    DOMINANT_SHARE,
    SHARED,
    Ranker,
    py3langid_ranker,
    script_counts,
    variant_evidence,
)
from hymt_serve.request.languages import Language
from hymt_serve.request.markup_tokens import BARE_URL, EMAIL

Verdict = Literal["ok", "unsure", "wrong"]

MIN_LETTERS = 8  # letters an output needs before its script says anything
MIN_RANKED_LETTERS = 16  # letters before the ranker's language may call it wrong
MIN_VARIANT_CHARS = 2  # traditional/simplified characters before they may call it wrong

# The scripts each of our languages is written in (script names as detect.script_of gives them).
# Kazakh and Mongolian have the scripts of China beside Cyrillic.
WRITTEN_IN: dict[str, frozenset[str]] = {
    **{code: frozenset({script}) for script, codes in SHARED.items() for code in codes},
    "zh": frozenset({"HAN"}),
    "zh-Hant": frozenset({"HAN"}),
    "yue": frozenset({"HAN"}),
    "ja": frozenset({"KANA", "HAN"}),
    "ko": frozenset({"HANGUL"}),
    "th": frozenset({"THAI"}),
    "km": frozenset({"KHMER"}),
    "my": frozenset({"MYANMAR"}),
    "gu": frozenset({"GUJARATI"}),
    "te": frozenset({"TELUGU"}),
    "ta": frozenset({"TAMIL"}),
    "bn": frozenset({"BENGALI"}),
    "he": frozenset({"HEBREW"}),
    "bo": frozenset({"TIBETAN"}),
    "kk": frozenset({"CYRILLIC", "ARABIC"}),
    "mn": frozenset({"CYRILLIC", "MONGOLIAN"}),
}
# Languages the detector confuses with each other on short text (docs/api.md): one answered
# for the other is no evidence of a wrong language.
CLOSE: tuple[frozenset[str], ...] = (frozenset({"ms", "id"}), frozenset({"hi", "mr"}))

_SET_ASIDE = re.compile(rf"<[^<>]{{0,64}}>|{BARE_URL.pattern}|{EMAIL.pattern}")
_WORD = re.compile(r"\w+")


def verdict(
    output: str,
    source: str,
    target: Language,
    *,
    confidence: float,
    ranker: Ranker | None = None,
) -> Verdict:
    """Whether ``output``, a translation of ``source``, is in ``target`` (see the module doc);
    ``confidence`` in (0, 1] is how sure the evidence must be to say "wrong"."""
    text = _own_words(output, source)
    counts = script_counts(text)
    total = sum(counts.values())
    if total < MIN_LETTERS:
        return "unsure"
    script, weight = max(counts.items(), key=lambda item: item[1])
    share = weight / total
    if share < DOMINANT_SHARE:
        return "unsure"
    if script not in WRITTEN_IN[target.code]:
        return "wrong" if share >= confidence else "unsure"
    if script == "HAN":
        return _han(text, target.code)
    candidates = SHARED.get(script, ())
    if target.code not in candidates:
        return "ok" if script not in SHARED else "unsure"
    ranked = (ranker or py3langid_ranker)(text, candidates)
    if not ranked:
        return "unsure"
    language, probability = max(ranked, key=lambda item: item[1])
    if language == target.code or _close(language, target.code):
        return "ok"
    sure = probability * share >= confidence and total >= MIN_RANKED_LETTERS
    return "wrong" if sure else "unsure"


def _own_words(output: str, source: str) -> str:
    """``output`` without tags, URLs, e-mail addresses and the words it shares with
    ``source`` (compared case-folded)."""
    copied = {word.casefold() for word in _WORD.findall(_SET_ASIDE.sub(" ", source))}
    kept = _SET_ASIDE.sub(" ", output)
    return _WORD.sub(lambda word: "" if word[0].casefold() in copied else word[0], kept)


def _han(text: str, target: str) -> Verdict:
    """Han text for a target that writes Han: Japanese cannot be told from Chinese here;
    traditional against simplified only on clear evidence."""
    if target == "ja":
        return "unsure"
    traditional, simplified = variant_evidence(text)
    if target == "zh-Hant" and simplified >= MIN_VARIANT_CHARS and not traditional:
        return "wrong"
    if target == "zh" and traditional >= MIN_VARIANT_CHARS and not simplified:
        return "wrong"
    return "ok"


def _close(language: str, target: str) -> bool:
    return any(language in group and target in group for group in CLOSE)
