"""Documents that lose nothing: a deliberately careless translator drops, repeats and moves the
<sN> tags at random (and translates most words), and every URL, e-mail address, attribute,
title and structural marker of the source must still come back, well formed, in all four
formats. The pipeline is the service's: split, tag, translate, restore, reassemble."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from hymt_serve.request.documents import MARKUP_KIND, split_document
from hymt_serve.request.markup import restore, to_tags

TAG = re.compile(r"(</?s\d+>)")
WORD = re.compile(r"[A-Za-z]+")
Translator = Callable[[str], str]


def careless(rng: random.Random) -> Translator:
    """A translator that reverses and upper-cases most words and mistreats tags: each is
    dropped, repeated somewhere else, moved, or kept, at random."""

    def translate(text: str) -> str:
        atoms: list[str] = []
        tags: list[tuple[int, str]] = []  # (how many atoms precede it, tag)
        for part in TAG.split(text):
            if TAG.fullmatch(part):
                tags.append((len(atoms), part))
                continue
            for atom in re.split(r"(\s+)", part):
                keep = atom.isspace() or rng.random() < 0.2
                atoms.append(atom if keep else WORD.sub(lambda m: m[0][::-1].upper(), atom))
        placed: list[tuple[int, str]] = []
        for position, tag in tags:
            luck = rng.random()
            if luck < 0.25:
                continue  # dropped
            anywhere = rng.randint(0, len(atoms))
            if luck < 0.35:
                placed += [(position, tag), (anywhere, tag)]  # repeated
            else:
                placed.append((anywhere if luck < 0.5 else position, tag))  # moved or kept
        out: list[str] = []
        for index in range(len(atoms) + 1):
            out += [tag for position, tag in placed if position == index]
            out += atoms[index : index + 1]
        return "".join(out)

    return translate


def translate_document(document: str, kind: str, translate: Translator) -> str:
    """What the service does with a document (service.py and replies.py)."""
    split = split_document(document, kind, budget=64, measure=lambda text: len(text) // 4 + 1)
    texts = []
    for segment in split.segments:
        tagged, markup = to_tags(segment, MARKUP_KIND[kind], tags_in_text=True)
        restored, _ = restore(translate(tagged), markup, keep_lost=True)
        texts.append(restored.strip() or segment)
    return split.assemble(texts)


# Documents built from pieces that carry payloads; {w} is words, {n} a number.
INLINE = {
    "text": ["https://example.org/t/{n}?q=1", "user{n}@example.com"],
    "markdown": [
        "[{w}](https://example.com/p?id={n})",
        '![{w}](img/{n}.png "Title {n}")',
        "**{w}**",
        "*{w}*",
        "`code{n}`",
        "https://example.org/m/{n}",
        "<https://auto.example/{n}>",
        "mail.{n}@example.com",
        '[{w} `x{n}`](docs/{n}.md "Doc {n}")',
        "<b>{w}</b>",
    ],
    "html": [
        '<a href="https://example.com/p?id={n}" title="T{n}">{w}</a>',
        '<time datetime="2024-01-{n}">{w}</time>',
        "<b>{w}</b>",
        "<i>{w} <em>{w}</em></i>",
        '<img src="i{n}.png" alt="A{n}">',
        "<br>",
        "user{n}@example.com",
        "https://example.org/h/{n}",
        "<code>x{n}()</code>",
        '<span class="c{n}">{w} <b>{w}</b></span>',
    ],
    "srt": [
        "<i>{w}</i>",
        "<b>{w}</b>",
        '<font color="#ff{n}">{w}</font>',
        "user{n}@example.com",
        "https://example.org/s/{n}",
    ],
}
BLOCKS = {
    "text": ["{s}", "{s}\n{s}"],
    "markdown": ["# {s}", "## {s} ##", "- {s}", "1. {s}", "> {s}", "{s}", "{s}\n{s}"],
    "html": ["<p>{s}</p>", "<h2>{s}</h2>", "<ul><li>{s}</li></ul>", "<div>{s}\n{s}</div>"],
    "srt": ["{s}", "{s}\n{s}"],
}
WORDS = ["parts", "order", "ships", "today", "Ada", "red", "boxes", "soon"]


@st.composite
def documents(draw: st.DrawFn, kind: str) -> str:
    numbers = iter(range(10, 100))

    def sentence() -> str:
        pieces = []
        for _ in range(draw(st.integers(1, 4))):
            pieces.append(" ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))))
            if draw(st.booleans()):
                inline = draw(st.sampled_from(INLINE[kind]))
                words = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=2)))
                pieces.append(inline.format(w=words, n=next(numbers)))
        return " ".join(pieces) + draw(st.sampled_from(["", ".", "!"]))

    blocks = []
    for index in range(draw(st.integers(1, 5))):
        block = draw(st.sampled_from(BLOCKS[kind]))
        while "{s}" in block:
            block = block.replace("{s}", sentence(), 1)
        if kind == "srt":
            block = f"{index + 1}\n00:00:0{index},000 --> 00:00:0{index},900\n{block}"
        blocks.append(block)
    document = ("\n" if kind == "html" else "\n\n").join(blocks) + "\n"
    if draw(st.booleans()):
        document = document.replace("\n", "\r\n")
    return ("\ufeff" if draw(st.booleans()) else "") + document


PAYLOAD = re.compile(
    r"https?://[^\s<>()\"]*[^\s<>()\".,;:!?*_~]|[\w.]+@example\.com"
    r"|\"[^\"\n]*\"|`[^`\n]+`|\]\([^()\s]*(?: \"[^\"]*\")?\)"
)


class Tags(HTMLParser):
    """An HTML document's tags, each with its attributes, and whether they nest properly."""

    VOID = frozenset({"br", "img"})

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: Counter[str] = Counter()
        self.stack: list[str] = []
        self.well_formed = True
        self.feed(text)
        self.close()
        self.well_formed &= not self.stack

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[f"<{tag} {sorted(attrs)}>"] += 1
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self.tags[f"</{tag}>"] += 1
        self.well_formed &= bool(self.stack) and self.stack.pop() == tag


def block_markers(text: str) -> list[str]:
    """Each line's Markdown block marker (heading, list item, quote), in order."""
    return [
        match[0] if (match := re.match(r"#+ |- |\d+\. |> ", line)) else ""
        for line in text.splitlines()
    ]


def link_labels(text: str) -> list[str | None]:
    """The label of each Markdown link or image (None where its "[" is missing)."""
    labels: list[str | None] = []
    for target in re.finditer(r"\]\([^()\s]*(?: \"[^\"]*\")?\)", text):
        depth, index = 0, target.start() - 1
        while index >= 0 and (text[index] != "[" or depth):
            depth += {"]": 1, "[": -1}.get(text[index], 0)
            index -= 1
        labels.append(text[index + 1 : target.start()] if index >= 0 else None)
    return labels


def assert_nothing_lost(source: str, output: str, kind: str) -> None:
    assert output.startswith("\ufeff") == source.startswith("\ufeff")
    assert ("\r\n" in output) == ("\r\n" in source)
    assert output.count("\n") == source.count("\n")  # no line lost or made
    if "\r\n" in source:
        assert output.count("\r\n") == output.count("\n")
    assert Counter(PAYLOAD.findall(output)) == Counter(PAYLOAD.findall(source))
    if kind in ("html", "srt"):
        tags = Tags(output)
        assert tags.tags == Tags(source).tags and tags.well_formed, output
    if kind == "srt":
        timing = re.compile(r"^\d+\r?\n\S+ --> \S+$", re.MULTILINE)
        assert timing.findall(output) == timing.findall(source)
    if kind == "markdown":
        assert block_markers(output) == block_markers(source)
        labels = link_labels(output)
        assert len(labels) == len(link_labels(source)) and output.count("![") == source.count("![")
        for label in labels:  # a label of text, with no link inside (an image may be)
            assert label is not None and label.strip(), output
            assert not re.search(r"(?<!!)\[[^\]]*\]\(", label), output


@settings(max_examples=100, deadline=None)
@given(st.data(), st.sampled_from(["text", "markdown", "html", "srt"]), st.randoms())
def test_a_careless_translator_loses_nothing(
    data: st.DataObject, kind: str, rng: random.Random
) -> None:
    source = data.draw(documents(kind))
    output = translate_document(source, kind, careless(rng))
    assert_nothing_lost(source, output, kind)


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from(["text", "markdown", "html", "srt"]))
def test_a_translator_that_drops_every_tag_loses_nothing(data: st.DataObject, kind: str) -> None:
    source = data.draw(documents(kind))
    output = translate_document(source, kind, lambda text: TAG.sub("", text).upper())
    assert_nothing_lost(source, output, kind)


def test_the_examples_of_the_issue() -> None:
    markdown = "\ufeff# Title\r\n\r\nOrder [parts](https://example.com/p?id=42) from a@b.org.\r\n"
    output = translate_document(markdown, "markdown", lambda text: TAG.sub("", text).upper())
    assert output == (
        "\ufeff# TITLE\r\n\r\nORDER [PARTS](https://example.com/p?id=42) FROM a@b.org.\r\n"
    )
    html = '<p>At <time datetime="2024-05-01">noon</time> <b>read</b> <a href="/x" title="T">it</a>'
    output = translate_document(html, "html", lambda text: TAG.sub("", text).upper())
    assert output == (
        '<p>AT <time datetime="2024-05-01">NOON</time> <b>READ</b> <a href="/x" title="T">IT</a>'
    )
    srt = "1\n00:00:01,000 --> 00:00:02,000\n<i>Hello there.</i>\n"
    output = translate_document(srt, "srt", lambda text: TAG.sub("", text).upper())
    assert output == "1\n00:00:01,000 --> 00:00:02,000\n<i>HELLO THERE.</i>\n"
