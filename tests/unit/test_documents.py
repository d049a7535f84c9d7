"""Splitting documents into segments and back: byte-exact round trips, structure kept literal,
cuts only where allowed, and adversarial inputs that must neither hang nor lose text."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hymt_serve.request.documents import FORMATS, Document, split_document
from hymt_serve.request.errors import InvalidRequest


def measure(text: str) -> int:
    """About a token per 4 characters (what a BPE tokenizer gives for English prose)."""
    return len(text) // 4 + 1


def split(text: str, kind: str, budget: int = 256, language: str | None = None) -> Document:
    return split_document(text, kind, budget=budget, measure=measure, language=language)


README = """\
---
title: Quick start
tags: [demo]
---
# Hunyuan-MT quick start #

Install the package with `pip install hunyuan-mt-torchserve` and read
<https://example.com/docs>. The server answers on http://127.0.0.1:8080/predictions/hunyuan-mt.

## Steps

1. Build the archive.
2. Start the server: **never** expose the management port.
   It can load code.
- [ ] Check the [health page](docs/health.md "Health").
* Nested lists
    * work too

| Setting | Meaning |
|:--------|--------:|
| `batchSize` | Requests per batch |
| 42 | 3.14 |

```python
print("Hello. World.")  # never translated
```

~~~
fenced with tildes
~~~

    indented code stays
    as it is

> A quote with *emphasis*.
> > And a nested one.

<details><summary>More details</summary>
<p align="center"><img src="logo.png" alt="logo"> The logo.</p>
</details>

<!-- a comment
over two lines -->

$$
E = mc^2
$$

Setext heading
==============

***

[docs]: https://example.com/docs "The docs"
"""

CHINESE_MARKDOWN = (
    "# 快速开始\n\n混元翻译模型支持三十三种语言。请先安装软件包，然后启动服务。\n\n"
    "- 第一步：下载模型\n- 第二步：运行 `hymt start`\n"
)
JAPANESE_TEXT = (
    "はじめに\r\n\r\nこれはテスト文書です。二つ目の文です！\r\n"
    "改行のある段落。\r\n\r\n\r\n終わり。\r\n"
)
RUSSIAN_HTML = """<!DOCTYPE html>
<html lang="ru"><head><meta charset="utf-8"><title>Перевод документов</title>
<style>p { color: red; } /* Не переводить. */</style>
<script>var s = "Не переводить. Никогда.";</script></head>
<body>
<h1>Заголовок страницы</h1>
<p>Первый абзац с <b>жирным</b> текстом и <a href="https://example.ru/a.b">ссылкой</a>.
Второе предложение.</p>
<ul><li>Пункт один</li><li>Пункт <code>два()</code></li></ul>
<pre>код
  остаётся</pre>
<table><tr><td>Ячейка</td><td>123</td></tr></table>
</body></html>
"""
ARABIC_SRT = """\ufeff1
00:00:01,000 --> 00:00:03,500
مرحبا بالعالم.

2
00:00:04,000 --> 00:00:06,000 X1:100 X2:200
<i>سطر أول</i>
سطر ثان

3
00:00:07,000 --> 00:00:08,000
♪ ♪
"""

DOCUMENTS = [
    ("markdown", README),
    ("markdown", CHINESE_MARKDOWN),
    ("text", JAPANESE_TEXT),
    ("html", RUSSIAN_HTML),
    ("srt", ARABIC_SRT),
    ("srt", ARABIC_SRT.replace("\n", "\r\n")),
    ("markdown", README.replace("\n", "\r\n")),
]


@pytest.mark.parametrize(("kind", "text"), DOCUMENTS)
def test_the_identity_translation_gives_the_document_back_byte_for_byte(
    kind: str, text: str
) -> None:
    document = split(text, kind)
    assert document.segments
    assert document.assemble(document.segments) == text
    assert len(document.pieces) == 2 * len(document.segments) + 1
    for segment in document.segments:
        assert segment == segment.strip() and re.search(r"[^\W\d_]", segment)


def test_markdown_structure_stays_literal_and_prose_is_segmented() -> None:
    segments = split(README, "markdown").segments
    joined = "\n".join(segments)
    for literal in (
        "title: Quick start",
        'print("Hello. World.")',
        "fenced with tildes",
        "indented code stays",
        "E = mc^2",
        "a comment",
        "[docs]:",
        "|:--------|",
    ):
        assert literal not in joined, literal
    assert "Hunyuan-MT quick start" in segments  # the closing hashes stay literal
    assert "Steps" in segments
    assert "Build the archive." in segments
    assert (
        "Start the server: **never** expose the management port.\n   It can load code." in segments
    )
    assert "Setting" in segments and "Meaning" in segments
    assert "`batchSize`" not in segments  # a cell that is only code
    assert "Requests per batch" in segments
    assert "A quote with *emphasis*." in segments and "And a nested one." in segments
    assert "More details" in segments
    assert '<img src="logo.png" alt="logo"> The logo.' in segments  # inline: a stand-in
    assert "Setext heading" in segments
    assert "42" not in segments and "3.14" not in segments
    assert any("`pip install hunyuan-mt-torchserve`" in s for s in segments)  # inline code rides


def test_html_text_runs_are_segments_and_raw_elements_are_literal() -> None:
    segments = split(RUSSIAN_HTML, "html").segments
    assert segments[0] == "Перевод документов"
    assert "Заголовок страницы" in segments
    assert any(s.startswith("Первый абзац с <b>жирным</b>") for s in segments)
    assert "Пункт <code>два()</code>" in segments
    assert "Ячейка" in segments and "123" not in segments
    joined = "\n".join(segments)
    assert "Не переводить" not in joined and "остаётся" not in joined


def test_srt_numbers_and_timings_are_literal() -> None:
    document = split(ARABIC_SRT, "srt")
    assert document.segments == ("مرحبا بالعالم.", "<i>سطر أول</i>\nسطر ثان")
    for literal in ("00:00:01,000 --> 00:00:03,500", "X1:100 X2:200", "\ufeff1\n", "♪ ♪"):
        assert literal in "".join(document.pieces[0::2])


def test_text_paragraphs_keep_their_line_breaks_and_blank_lines() -> None:
    document = split(JAPANESE_TEXT, "text")
    assert document.segments == (
        "はじめに",
        "これはテスト文書です。二つ目の文です！\r\n改行のある段落。",
        "終わり。",
    )
    assert document.pieces[2] == "\r\n\r\n"


def test_a_block_over_the_budget_is_cut_between_sentences_within_the_budget() -> None:
    sentences = [f"Sentence number {n} says something about the weather today." for n in range(60)]
    paragraph = " ".join(sentences)
    document = split(f"Intro.\n\n{paragraph}\n", "markdown", budget=64)
    assert document.assemble(document.segments) == f"Intro.\n\n{paragraph}\n"
    body = document.segments[1:]
    assert len(body) > 5
    for segment in body:
        assert measure(segment) <= 64
        assert segment.endswith("today.")  # whole sentences only
    assert " ".join(body) == paragraph


def test_cjk_sentences_are_cut_at_their_full_stops() -> None:
    paragraph = "今天天气很好。" * 200
    segments = split(paragraph, "text", budget=32, language="zh").segments
    assert len(segments) > 10
    assert all(not s.replace("今天天气很好。", "") for s in segments)  # whole sentences
    assert "".join(segments) == paragraph


def test_a_sentence_over_the_budget_is_cut_at_spaces_never_inside_a_word() -> None:
    words = [f"word{n}" for n in range(2000)]
    sentence = " ".join(words)  # no sentence end at all
    document = split(sentence, "text", budget=50)
    assert len(document.segments) > 10
    for segment in document.segments:
        assert set(segment.split()) <= set(words)
    assert document.assemble(document.segments) == sentence
    assert " ".join(document.segments) == sentence


def test_no_cut_falls_inside_inline_code_or_a_url() -> None:
    code = "`a. B. c. D. e. F. g. H. i. J.`"
    url = "https://example.com/Some.Path. Next/x"
    paragraph = " ".join(f"Plain sentence {n}. Use {code} or {url} here." for n in range(40))
    for segment in split(paragraph, "markdown", budget=40).segments:
        assert segment.count("`") % 2 == 0
        assert "https://example.com/Some.Path." not in segment or url in segment


def test_segments_respect_unicode_characters_and_graphemes() -> None:
    family = "👨\u200d👩\u200d👧"
    paragraph = " ".join(f"{family} é{n}\u0301 text." for n in range(500))
    document = split(paragraph, "text", budget=20)
    assert document.assemble(document.segments) == paragraph
    for segment in document.segments:
        assert not segment.startswith(("\u200d", "\u0301"))


# Adversarial documents: each either splits (and reassembles exactly) or is a clear 400.
ADVERSARIAL = [
    ("markdown", "> " * 100_000 + "deep quote"),
    ("markdown", "- " * 50_000 + "deep list"),
    ("html", "<div>" * 50_000 + "deep text" + "</div>" * 50_000),
    ("html", "<p>unclosed <b>bold <i>and <a href='x'>broken" + "<" * 1000 + " < > <<>>"),
    ("html", "<script>never closed " * 2000),
    ("html", "<!-- never closed " + "text " * 10_000),
    ("markdown", "`" * 1_000_000),
    ("markdown", "`a" * 300_000),
    ("markdown", "*" * 500_000 + "x"),
    ("markdown", "#" * 1_000_000),
    ("markdown", "| a " * 100_000 + "\n|" + "---|" * 100_000),
    ("text", "A sentence that goes on. " * 40_000),  # a single line of 1 MB
    ("text", "x" * 1_000_000),  # one line, no place to cut: one segment (the service: 413)
    ("markdown", "```\n" + "code\n" * 100_000),  # an unclosed fence
]


@pytest.mark.parametrize(
    ("kind", "text"), ADVERSARIAL, ids=[f"{k}-{t[:12]!r}" for k, t in ADVERSARIAL]
)
def test_adversarial_documents_split_linearly_and_lose_nothing(kind: str, text: str) -> None:
    document = split(text, kind)
    assert document.assemble(document.segments) == text


def test_a_line_without_places_to_cut_stays_one_segment() -> None:
    assert split("x" * 100_000, "text").segments == ("x" * 100_000,)


@pytest.mark.parametrize(
    ("text", "cue", "line"),
    [
        ("1\n00:00:01,000 --> 00:00:02,000\nHi\n\nTwo\n00:00:03,000 --> 00:00:04,000\nYo\n", 2, 5),
        ("1\nnot a timing line\nHi\n", 1, 2),
        ("1\n00:00:01,000 --> 00:00:02,000\nHi\n\n2\n", 2, 6),
        ("Just text, not subtitles.\n", 1, 1),
    ],
)
def test_a_malformed_srt_file_is_a_clear_400(text: str, cue: int, line: int) -> None:
    with pytest.raises(InvalidRequest) as caught:
        split(text, "srt")
    assert caught.value.status == 400
    assert f"cue {cue}" in str(caught.value) and caught.value.field == "document"
    if "before" not in str(caught.value):
        assert f"(line {line})" in str(caught.value)


PIECES = [*"ab Z.!?。，\n\r\t#>-*_`|<>/![]()~:=$1é字😀", "<b>", "</b>", "```", "http://x.y/", "1\n"]
PIECES += ["00:00:01,000 --> 00:00:02,000\n", "<script>", "</script>", "<!--", "-->", "    "]


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(FORMATS),
    text=st.lists(st.sampled_from(PIECES), max_size=120).map("".join),
    budget=st.integers(min_value=1, max_value=40),
)
def test_any_document_reassembles_byte_for_byte(kind: str, text: str, budget: int) -> None:
    try:
        document = split_document(text, kind, budget=budget, measure=measure)
    except InvalidRequest:
        assert kind == "srt"
        return
    assert document.assemble(document.segments) == text
    assert (
        document.assemble([s.upper() for s in document.segments]).lower()
        == "".join(
            piece if i % 2 == 0 else piece.upper() for i, piece in enumerate(document.pieces)
        ).lower()
    )
    for segment in document.segments:
        assert segment and segment == segment.strip()


def test_assemble_needs_one_translation_per_segment() -> None:
    document = split("One.\n\nTwo.\n", "text")
    with pytest.raises(ValueError):
        document.assemble(["Eins."])
    assert document.assemble(["Eins.", "Zwei."]) == "Eins.\n\nZwei.\n"
    assert document.line_of(1) == 3


@pytest.mark.parametrize(
    ("kind", "text", "segments"),
    [
        ("markdown", "\ufeff# Title\n\nText.\n", ("Title", "Text.")),
        ("markdown", "\ufeff---\ntitle: x\n---\nText.\n", ("Text.",)),
        ("text", "\ufeffHello.\r\n", ("Hello.",)),
        ("html", "\ufeff<p>Hello.</p>", ("Hello.",)),
        ("srt", "\ufeff1\r\n00:00:01,000 --> 00:00:02,000\r\nHello.\r\n", ("Hello.",)),
    ],
)
def test_a_byte_order_mark_stays_literal_before_the_first_block(
    kind: str, text: str, segments: tuple[str, ...]
) -> None:
    document = split(text, kind)
    assert document.segments == segments and document.pieces[0].startswith("\ufeff")
    assert document.assemble([s.upper() for s in segments]).startswith("\ufeff")


def test_translations_keep_the_line_endings_and_structure_of_their_segments() -> None:
    markdown = split(
        "# Title\r\n\r\nOne\r\ntwo.\r\n\r\n| a | b |\n|---|---|\n| c | d |\n", "markdown"
    )
    assert markdown.segments == ("Title", "One\r\ntwo.", "a", "b", "c", "d")
    translated = markdown.assemble(["Ti\ntel", "Eins\nzwei.", "A", "B\r\nb", "C", "D"])
    assert translated == "# Ti tel\r\n\r\nEins\r\nzwei.\r\n\r\n| A | B b |\n|---|---|\n| C | D |\n"
    srt = split("1\r\n00:00:01,000 --> 00:00:02,000\r\nHello.\r\n", "srt")
    assert srt.assemble(["Hallo.\n\n  \nDu."]) == (
        "1\r\n00:00:01,000 --> 00:00:02,000\r\nHallo.\r\nDu.\r\n"  # no blank line ends the cue
    )
    text = split("Eins\nzwei\r\ndrei.\r\n\r\nVier\nfünf.\r\n\r\nSechs.\r\n", "text")
    assert text.assemble(["One\r\ntwo\nthree.", "Four\r\nfive.", "Six\nseven."]) == (
        "One\r\ntwo\nthree.\r\n\r\nFour\nfive.\r\n\r\nSix\r\nseven.\r\n"  # mixed: as is
    )


def test_email_addresses_are_never_cut_nor_prose() -> None:
    document = split("me@example.com\n\nWrite to first.last@example.co.uk. " * 30, "text", 12)
    assert "me@example.com" not in document.segments
    for segment in document.segments:
        assert "@" not in segment or "first.last@example.co.uk" in segment
    assert split("<i>♪ me@x.org ♪</i>\n", "html").segments == ()
