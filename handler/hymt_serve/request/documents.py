"""Documents: plain text, Markdown, HTML or SRT split into segments for the model, and put back
together around their translations.

A document becomes *pieces*: literal text (structure, whitespace, code, markup, subtitle numbers
and timings) and segments (the prose to translate), alternating and in order, so that joining
them gives the document back byte for byte (:meth:`Document.assemble` with the segments
themselves is the identity). Splitting goes by structure first (paragraphs, headings, list
items, table cells, HTML text runs, subtitle cues); a block whose tokens exceed the budget is
then cut into sentences by `sentencex` (Wikimedia's segmenter: ~300 languages through language
fallbacks, linear time, character offsets) and the sentences are grouped back up to the budget.
A sentence still over it is cut at spaces or CJK clause marks, never inside a word or a
character; a run with no such place stays whole (the service refuses it with a 413 if its
prompt is too long). No cut falls inside inline code, a URL or a tag.

Inline markup stays inside its segment (the service turns it into ``<sN>`` tags,
:mod:`hymt_serve.request.markup`); fenced and indented code, front matter, HTML comments and
``<script>``/``<style>``/``<pre>`` elements, link definitions and table rules stay literal, and
so does a would-be segment with no letter outside its code, URLs and tags (numbers, symbols).

Every parser here is iterative and linear in the document's length: a 1 MB line, 100,000 nested
quotes or tags, or unclosed code cannot make it recurse or backtrack.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from sentencex import get_sentence_boundaries

from hymt_serve.request.errors import InvalidRequest

FORMATS = ("text", "markdown", "html", "srt")
# The inline markup a format's segments carry (the kinds of markup.to_tags).
MARKUP_KIND = {"text": "text", "markdown": "markdown", "html": "html", "srt": "html"}

Measure = Callable[[str], int]  # tokens of a text

_LETTER = re.compile(r"[^\W\d_]")
_URL = re.compile(r"\b(?:https?|ftp)://[^\s<>]+")
_TAG_AT = re.compile(r"</?([A-Za-z][A-Za-z0-9-]*)(?:\s[^<>]*)?/?>")
_TICKS = re.compile(r"`+")
_CLAUSE = re.compile(r"[\s，、；：,;:]+")  # where a sentence over the budget may be cut
# HTML elements that do not break a run of text (markup.to_tags tags them inside a segment).
_INLINE = frozenset(
    {
        *("a", "abbr", "b", "bdi", "bdo", "big", "br", "cite", "code", "data", "del", "dfn"),
        *("em", "font", "i", "img", "ins", "kbd", "mark", "q", "rp", "rt", "ruby", "s", "samp"),
        *("small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u", "var", "wbr"),
    }
)
# HTML elements whose content is never prose.
_RAW = frozenset(
    ("script", "style", "pre", "textarea", "svg", "math", "template", "noscript", "xmp")
)


@dataclass(frozen=True)
class Document:
    """A split document: ``pieces`` alternate literal, segment, literal, ..., literal."""

    format: str
    pieces: tuple[str, ...]

    @property
    def segments(self) -> tuple[str, ...]:
        return self.pieces[1::2]

    def line_of(self, index: int) -> int:
        """The 1-based line on which segment ``index`` starts (for error messages)."""
        before = self.pieces[: 2 * index + 1]
        return 1 + sum(piece.count("\n") for piece in before)

    def assemble(self, translations: Sequence[str]) -> str:
        """The document with each segment replaced by its translation, in order."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        parts = [self.pieces[0]]
        for translation, literal in zip(translations, self.pieces[2::2], strict=True):
            parts += (translation, literal)
        return "".join(parts)


def split_document(
    text: str, kind: str, *, budget: int, measure: Measure, language: str | None = None
) -> Document:
    """Split ``text`` (a ``kind`` document) into segments of at most ``budget`` tokens where
    it has places to cut. Raises InvalidRequest for a malformed SRT file."""
    pieces = _Pieces(kind, budget, measure, language or "en")
    {"text": _text, "markdown": _markdown, "html": _html, "srt": _srt}[kind](text, pieces)
    document = Document(kind, pieces.done())
    assert "".join(document.pieces) == text, "a document must reassemble byte for byte"
    return document


class _Pieces:
    """Collects literal text and prose in order; prose becomes segments within the budget."""

    def __init__(self, kind: str, budget: int, measure: Measure, language: str):
        self.kind, self.budget, self.measure, self.language = kind, budget, measure, language
        self._pieces: list[str] = []
        self._literal: list[str] = []

    def literal(self, text: str) -> None:
        if text:
            self._literal.append(text)

    def prose(self, text: str) -> None:
        """A block of prose: whitespace at its ends stays literal, the rest is split to the
        budget; parts without a letter outside code, URLs and tags stay literal."""
        core = text.strip()
        tokens = self.measure(core) if core else 0
        if tokens <= self.budget:
            self._part(text)
            return
        start = text.index(core[0])
        self.literal(text[:start])
        protected = _protected(core, self.kind)
        # The block's own tokens per character turns the token budget into characters.
        chars = max(1, self.budget * len(core) // tokens)
        for begin, end in _split(core, protected, chars, self.language):
            self._part(core[begin:end])
        self.literal(text[start + len(core) :])

    def _part(self, text: str) -> None:
        core = text.strip()
        if not core:
            self.literal(text)
            return
        start = text.index(core[0])
        self.literal(text[:start])
        self._segment(core, _protected(core, self.kind))
        self.literal(text[start + len(core) :])

    def _segment(self, text: str, protected: list[tuple[int, int]]) -> None:
        if not _has_letter(text, protected):
            self.literal(text)
            return
        self._pieces.append("".join(self._literal))
        self._pieces.append(text)
        self._literal = []

    def done(self) -> tuple[str, ...]:
        return (*self._pieces, "".join(self._literal))


def _has_letter(text: str, protected: list[tuple[int, int]]) -> bool:
    position = 0
    for start, end in protected:
        if _LETTER.search(text, position, start):
            return True
        position = max(position, end)
    return _LETTER.search(text, position) is not None


def _protected(text: str, kind: str) -> list[tuple[int, int]]:
    """Sorted spans that are never cut and never count as prose: URLs, tags, and in Markdown
    inline code."""
    spans = [m.span() for m in _URL.finditer(text)]
    if kind in ("markdown", "html"):
        spans += _tags(text)
    if kind == "markdown":
        spans += _code_spans(text)
    return sorted(spans)


def _tags(text: str) -> list[tuple[int, int]]:
    """HTML tags and comments (each ``<`` looks no further than the next ``<`` or ``>``)."""
    spans, position = [], 0
    while (start := text.find("<", position)) >= 0:
        if text.startswith("<!--", start):
            end = text.find("-->", start + 4)
            end = len(text) if end < 0 else end + 3
            spans.append((start, end))
            position = end
            continue
        match = _TAG_AT.match(text, start)
        if match:
            spans.append(match.span())
            position = match.end()
        else:
            position = start + 1
    return spans


def _code_spans(text: str) -> list[tuple[int, int]]:
    """Markdown code spans: a run of backticks up to the next run of the same length (runs
    inside a span are its content). Linear: each length's runs are walked once."""
    ticks = list(_TICKS.finditer(text))
    by_length: dict[int, list[int]] = {}
    for index, run in enumerate(ticks):
        by_length.setdefault(len(run[0]), []).append(index)
    next_of = dict.fromkeys(by_length, 0)  # per length: the first run not yet passed
    spans, inside_until = [], -1
    for index, run in enumerate(ticks):
        if index <= inside_until:
            continue
        length = len(run[0])
        same = by_length[length]
        while next_of[length] < len(same) and same[next_of[length]] <= index:
            next_of[length] += 1
        if next_of[length] < len(same):
            closing = same[next_of[length]]
            spans.append((run.start(), ticks[closing].end()))
            inside_until = closing
    return spans


def _split(
    text: str, protected: list[tuple[int, int]], chars: int, language: str
) -> Iterator[tuple[int, int]]:
    """Spans of ``text`` (a block over the budget) of about ``chars`` characters each,
    covering it in order: sentences grouped, and a sentence over the budget cut at spaces or
    clause marks. No span ends inside a protected span."""
    inside = _Inside(protected)
    cuts = [
        boundary["end_index"]
        for boundary in get_sentence_boundaries(language, text)[:-1]
        if not inside(boundary["end_index"])
    ]
    group_start = 0
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        if start > group_start and end - group_start > chars:  # close the group before it
            yield group_start, start
            group_start = start
        if end - start > chars:  # one sentence over the budget
            yield from _cut_long(text, start, end, chars, inside)
            group_start = end
    if group_start < len(text):
        yield group_start, len(text)


def _cut_long(
    text: str, start: int, end: int, chars: int, inside: _Inside
) -> Iterator[tuple[int, int]]:
    """``text[start:end]`` cut after the last space or clause mark that keeps each part
    within ``chars``; a run with no such place stays whole."""
    best: re.Match[str] | None = None
    for place in _CLAUSE.finditer(text, start, end):
        if inside(place.start()):
            continue
        if place.start() - start > chars and best is not None:
            yield start, best.end()
            start, best = best.end(), None
        if place.start() > start:
            best = place
    if best is not None and end - start > chars:
        yield start, best.end()
        start = best.end()
    if start < end:
        yield start, end


class _Inside:
    """Whether an offset falls strictly inside one of the sorted spans (bisect)."""

    def __init__(self, spans: list[tuple[int, int]]):
        self._starts = [a for a, _ in spans]
        self._reach = list(itertools.accumulate((b for _, b in spans), max))

    def __call__(self, offset: int) -> bool:
        index = bisect.bisect_left(self._starts, offset) - 1
        return index >= 0 and offset < self._reach[index]


# Lines: split on "\n" only (never on the other characters str.splitlines treats as breaks),
# each line keeping its ending.
def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _bare(line: str) -> str:
    return line.rstrip("\r\n")


def _blank(line: str) -> bool:
    return not line.strip()


def _text(text: str, out: _Pieces) -> None:
    """Plain text: paragraphs between blank lines."""
    paragraph: list[str] = []
    for line in _lines(text):
        if _blank(line):
            out.prose("".join(paragraph))
            paragraph = []
            out.literal(line)
        else:
            paragraph.append(line)
    out.prose("".join(paragraph))


# Markdown (CommonMark's block structure, line by line).
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]+|$)")
_LIST_ITEM = re.compile(r"[ \t]*(?:[-*+]|\d{1,9}[.)])(?:[ \t]+(?:\[[ xX]\][ \t]+)?|$)")
_QUOTE = re.compile(r"(?:[ \t]{0,3}>[ \t]?)+")
_SETEXT = re.compile(r" {0,3}(?:=+|-+)[ \t]*$")
_LINK_DEFINITION = re.compile(r" {0,3}\[[^\]\n]{1,999}\]:[ \t]*\S")
_TABLE_RULE = re.compile(r"[ \t]*\|?(?:[ \t]*:?-+:?[ \t]*\|)+(?:[ \t]*:?-+:?[ \t]*)?$")
_CELL = re.compile(r"(?<!\\)\|")


def _markdown(text: str, out: _Pieces) -> None:
    lines = _lines(text)
    paragraph: list[str] = []
    index, in_list, in_table, after_blank = 0, False, False, True

    def flush() -> None:
        out.prose("".join(paragraph))
        paragraph.clear()

    if lines and _bare(lines[0]) == "---":  # YAML front matter
        end = next((i for i in range(1, len(lines)) if _bare(lines[i]) in ("---", "...")), None)
        if end is not None:
            out.literal("".join(lines[: end + 1]))
            index = end + 1
    while index < len(lines):
        line = lines[index]
        bare = _bare(line)
        index += 1
        if _blank(line):
            flush()
            out.literal(line)
            after_blank, in_table = True, False
            continue
        if fence := _FENCE.match(bare):
            flush()
            marker = fence[1]
            end = next(
                (i for i in range(index, len(lines)) if _closes_fence(_bare(lines[i]), marker)),
                len(lines) - 1,
            )
            out.literal("".join(lines[index - 1 : end + 1]))
            index = end + 1
            after_blank = False
            continue
        if bare.strip() in ("$$", "```math"):  # display math
            flush()
            end = next(
                (i for i in range(index, len(lines)) if _bare(lines[i]).strip() == "$$"), None
            )
            end = len(lines) - 1 if end is None else end
            out.literal("".join(lines[index - 1 : end + 1]))
            index = end + 1
            continue
        indented = bare.startswith(("    ", "\t"))
        if indented and after_blank and not in_list and not paragraph:  # indented code
            out.literal(line)
            continue
        after_blank = False
        if not indented and not bare.startswith(" ") and not _LIST_ITEM.match(bare):
            in_list = False
        if bare.lstrip().startswith("<!--"):  # an HTML comment block
            flush()
            end = next((i for i in range(index - 1, len(lines)) if "-->" in lines[i]), None)
            end = len(lines) - 1 if end is None else end
            out.literal("".join(lines[index - 1 : end + 1]))
            index = end + 1
            continue
        if paragraph and _SETEXT.match(bare):
            flush()
            out.literal(line)
            continue
        if _thematic_break(bare) or _LINK_DEFINITION.match(bare):
            flush()
            out.literal(line)
            continue
        if heading := _HEADING.match(bare):
            flush()
            out.literal(heading[0])
            _heading_text(line[heading.end() :], out)
            in_list = False
            continue
        if quote := _QUOTE.match(bare):
            flush()
            out.literal(quote[0])
            out.prose(line[quote.end() :])
            continue
        if "|" in bare and (in_table or _is_table_rule(lines, index)):
            flush()
            in_table = True
            if _TABLE_RULE.match(bare):
                out.literal(line)
            else:
                _table_row(line, out)
            continue
        if item := _LIST_ITEM.match(bare):
            flush()
            out.literal(item[0])
            paragraph.append(line[item.end() :])
            in_list = True
            continue
        if bare.lstrip().startswith("<") and _TAG_AT.match(bare.lstrip()):  # an HTML line
            flush()
            _html(line, out)
            continue
        paragraph.append(line)
    flush()


def _closes_fence(bare: str, marker: str) -> bool:
    stripped = bare.strip()
    return (
        len(bare) - len(bare.lstrip(" ")) <= 3
        and stripped.startswith(marker)
        and not stripped.strip(marker[0])
    )


def _thematic_break(bare: str) -> bool:
    stripped = bare.replace(" ", "").replace("\t", "")
    indent = len(bare) - len(bare.lstrip(" "))
    return (
        indent <= 3
        and len(stripped) >= 3
        and stripped[0] in "-*_"
        and not stripped.strip(stripped[0])
    )


def _is_table_rule(lines: list[str], index: int) -> bool:
    return (
        0 <= index < len(lines)
        and "|" in lines[index]
        and bool(_TABLE_RULE.match(_bare(lines[index])))
    )


def _heading_text(rest: str, out: _Pieces) -> None:
    """A heading's text; its optional closing run of ``#`` stays literal."""
    bare = _bare(rest)
    trimmed = bare.rstrip(" \t")
    closing = len(trimmed) - len(trimmed.rstrip("#"))
    if closing and (closing == len(trimmed) or trimmed[-closing - 1] in " \t"):
        cut = len(trimmed) - closing
        out.prose(rest[:cut])
        out.literal(rest[cut:])
    else:
        out.prose(rest)


def _table_row(line: str, out: _Pieces) -> None:
    position = 0
    for bar in _CELL.finditer(line):
        out.prose(line[position : bar.start()])
        out.literal("|")
        position = bar.end()
    out.prose(line[position:])


# HTML: runs of text between block-level tags; inline tags stay inside their run.
def _html(text: str, out: _Pieces) -> None:
    run_start, position = 0, 0
    closes_after: dict[str, int] = {}  # raw element name -> offset past which it has no close

    def boundary(start: int, end: int) -> None:
        nonlocal run_start
        out.prose(text[run_start:start])
        out.literal(text[start:end])
        run_start = end

    while (start := text.find("<", position)) >= 0:
        if text.startswith("<!--", start):
            end = text.find("-->", start + 4)
            end = len(text) if end < 0 else end + 3
        elif text.startswith(("<!", "<?"), start):
            end = text.find(">", start)
            end = len(text) if end < 0 else end + 1
        elif match := _TAG_AT.match(text, start):
            name = match[1].lower()
            end = match.end()
            if name in _INLINE:
                position = end
                continue
            if name in _RAW and not match[0].startswith("</"):
                end = _raw_end(text, name, end, closes_after)
        else:
            position = start + 1
            continue
        boundary(start, end)
        position = end
    out.prose(text[run_start:])


def _raw_end(text: str, name: str, start: int, closes_after: dict[str, int]) -> int:
    """The end of a raw element's closing tag (the document's end if it has none); a name with
    no close left is remembered, so unclosed elements cost one scan in all."""
    if closes_after.get(name, -1) >= start:
        return len(text)
    match = re.compile(rf"</{name}\s*>", re.IGNORECASE).search(text, start)
    if match is None:
        closes_after[name] = len(text)
        return len(text)
    return match.end()


# SRT: cues of an index line, a timing line and text lines, between blank lines.
_SRT_TIME = r"\d{1,3}:\d{2}:\d{2}[,.]\d{1,3}"
_SRT_TIME = r"\d{1,3}:\d{2}:\d{2}[,.]\d{1,3}"
_SRT_TIMING = re.compile(rf"[ \t]*{_SRT_TIME}[ \t]*-->[ \t]*{_SRT_TIME}(?:[ \t].*)?$")


def _srt(text: str, out: _Pieces) -> None:
    lines = _lines(text)
    if lines and lines[0].startswith("\ufeff"):
        out.literal("\ufeff")
        lines[0] = lines[0][1:]
    index, cue = 0, 0
    while index < len(lines):
        if _blank(lines[index]):
            out.literal(lines[index])
            index += 1
            continue
        cue += 1
        number, timing = (
            _bare(lines[index]).strip(),
            lines[index + 1] if index + 1 < len(lines) else "",
        )
        if not number.isdigit() or not number.isascii():
            raise _malformed(cue, index + 1, "a cue number", lines[index])
        if not _SRT_TIMING.match(_bare(timing)):
            raise _malformed(
                cue, index + 2, "a timing line such as 00:00:01,000 --> 00:00:02,500", timing
            )
        out.literal(lines[index] + timing)
        index += 2
        body: list[str] = []
        while index < len(lines) and not _blank(lines[index]):
            body.append(lines[index])
            index += 1
        out.prose("".join(body))


def _malformed(cue: int, line: int, expected: str, got: str) -> InvalidRequest:
    shown = _bare(got)[:40] + ("…" if len(_bare(got)) > 40 else "")
    return InvalidRequest(
        f"the SRT document is malformed: cue {cue} (line {line}) should start with {expected}, "
        f"got {shown!r}"
        if got
        else f"the SRT document ends in cue {cue} before {expected}",
        allowed="SubRip cues: a number, a timing line, text lines, a blank line",
        field="document",
    )
