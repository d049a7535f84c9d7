"""What the localisation tests share: the service's document path without a model (split, tag,
translate, restore, reassemble), a translator that marks every word it translates, and words in
many scripts."""

from __future__ import annotations

import re
from collections.abc import Callable

from hymt_serve.request.documents import MARKUP_KIND, split_document
from hymt_serve.request.markup import restore, to_tags

TAG = re.compile(r"(</?s\d+>)")
WORD = re.compile(r"[^\W\d_]+")
Translator = Callable[[str], str]

# Words in many scripts: Latin, RTL Arabic and Hebrew, CJK runs, Devanagari and a Latin word
# with combining marks (e + U+0301), Thai without spaces.
WORDS = [
    "parts",
    "order",
    "Ada",
    "مرحبا",
    "بالعالم",
    "שלום",
    "עולם",
    "你好世界",
    "こんにちは",
    "안녕하세요",
    "नमस्ते",
    "e\u0301te\u0301",
    "สวัสดีครับ",
]


def mark_word(word: str) -> str:
    return f"«{word}»"


def mark_words(text: str) -> str:
    """A translator that marks every run of letters and keeps tags where they are."""
    return "".join(
        part if TAG.fullmatch(part) else WORD.sub(lambda m: mark_word(m[0]), part)
        for part in TAG.split(text)
    )


def translate_file(
    document: str, kind: str, translate: Translator, target: str = "fr", budget: int = 64
) -> str:
    """What the service does with a document (tokenising.py and replies.py), the model being
    ``translate``; segments cost a token per 4 characters."""
    split = split_document(
        document, kind, budget=budget, measure=lambda text: len(text) // 4 + 1, target=target
    )
    texts = []
    for segment in split.segments:
        tagged, markup = to_tags(segment, MARKUP_KIND[kind], tags_in_text=True)
        restored, _ = restore(translate(tagged), markup, keep_lost=True)
        texts.append(restored.strip() or segment)
    return split.assemble(texts)
