"""Documents: plain text, Markdown, HTML or SRT split into segments for the model, and put back
together around their translations.

A document becomes *pieces*: literal text (structure, whitespace, code, markup, subtitle numbers
and timings) and segments (the prose to translate), alternating and in order, so that joining
them gives the document back byte for byte. Splitting goes by structure first (paragraphs,
headings, list items, table cells, HTML text runs, subtitle cues; :mod:`.document_formats`); a
block over the token budget is cut into sentences by `sentencex` (linear, ~300 languages) and
the sentences are grouped back up to the budget. A sentence still over it is cut at spaces or
CJK clause marks, never inside a word, inline code, a URL, an e-mail address or a tag; a run
with no such place stays whole (its prompt may then be refused as too long).

Inline markup stays inside its segment (the service turns it into ``<sN>`` tags). Code blocks,
front matter, HTML comments, raw elements (``<script>``, ``<pre>``, ...), link definitions,
table rules, a byte-order mark and a would-be segment with no letter outside its code, URLs and
tags stay literal. A translation takes its segment's line endings and cannot break the structure
around it (:meth:`Document.assemble`). Parsing and splitting are iterative and linear in the
document's length: no input makes them recurse or backtrack.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sentencex import get_sentence_boundaries

from hymt_serve.request.document_formats import PARSERS, TAG_AT
from hymt_serve.request.localisation import LocalisationFile
from hymt_serve.request.localisation_po import parse_po
from hymt_serve.request.localisation_xliff import parse_xliff
from hymt_serve.request.markup import EMAIL
from hymt_serve.request.office import OFFICE_FORMATS, parse_office

FORMATS = ("text", "markdown", "html", "srt")  # text split into pieces, joined back
# The inline markup a format's segments carry (the kinds of markup.to_tags); a localisation
# file's inline codes travel as HTML-like tags (:class:`.localisation.Codes`).
MARKUP_KIND = {"text": "text", "markdown": "markdown", "html": "html", "srt": "html"}
MARKUP_KIND |= {"xliff": "html", "po": "html"} | dict.fromkeys(OFFICE_FORMATS, "html")
# Localisation files and Office packages (sent in base64): units to translate and a rebuilt
# file, not pieces of text.
LOCALISATION: dict[str, Callable[[str], LocalisationFile]] = {"xliff": parse_xliff, "po": parse_po}
LOCALISATION |= {kind: functools.partial(parse_office, kind=kind) for kind in OFFICE_FORMATS}
DOCUMENT_FORMATS = (*FORMATS, *LOCALISATION)  # what a request's "format" may name

Measure = Callable[[str], int]  # tokens of a text

_LETTER = re.compile(r"[^\W\d_]")
_URL = re.compile(r"\b(?:https?|ftp)://[^\s<>]+|" + EMAIL.pattern)
_BOM = "\ufeff"
_NEWLINE = re.compile(r"\r?\n")
_LINE_BREAK = re.compile(r"[ \t]*\r?\n[ \t]*")
_BLANK_LINES = re.compile(r"(\r?\n)(?:[ \t]*\r?\n)+")
_TICKS = re.compile(r"`+")
_CLAUSE = re.compile(r"[\s，、；：,;:]+")  # where a sentence over the budget may be cut


@dataclass(frozen=True)
class Document:
    """A split document: ``pieces`` alternate literal, segment, literal, ..., literal."""

    format: str
    pieces: tuple[str, ...]

    @property
    def segments(self) -> tuple[str, ...]:
        return self.pieces[1::2]

    def context_of(self, index: int) -> str | None:
        """The context the file gives segment ``index`` (a PO msgctxt), if any."""
        return None

    def line_of(self, index: int) -> int:
        """The 1-based line on which segment ``index`` starts (for error messages)."""
        before = self.pieces[: 2 * index + 1]
        return 1 + sum(piece.count("\n") for piece in before)

    def before(self, index: int) -> str | None:
        """The source of the segment before segment ``index`` (its previous context)."""
        return self.segments[index - 1] if index > 0 else None

    def reply_fields(self, translations: Sequence[str]) -> dict[str, Any]:
        """What the reply says of the document once its segments are translated."""
        return {"document": self.assemble(translations)}

    def assemble(self, translations: Sequence[str]) -> str:
        """The document with each segment replaced by its translation, in order; each
        translation keeps its segment's line endings (and the structure, :func:`_fit`)."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        newline = _newline("".join(self.pieces[0::2])) or "\n"
        parts = [self.pieces[0]]
        for translation, segment, literal in zip(
            translations, self.segments, self.pieces[2::2], strict=True
        ):
            parts += (_fit(translation, segment, self.format, newline), literal)
        return "".join(parts)


def _newline(text: str) -> str | None:
    """The line ending ``text`` uses throughout (CRLF or LF); None for none or a mix."""
    lines = text.count("\n")
    if not lines:
        return None
    crlf = text.count("\r\n")
    return "\r\n" if crlf == lines else "\n" if not crlf else None


def _fit(translation: str, segment: str, kind: str, newline: str) -> str:
    """A translation in its segment's place: a one-line Markdown segment (heading, list item,
    table cell) stays one line, a subtitle gets no blank line (that would end its cue), and
    line breaks take the segment's ending (the document's for a one-line segment)."""
    if "\n" not in segment and kind == "markdown":
        return _LINE_BREAK.sub(" ", translation)
    if kind == "srt":
        translation = _BLANK_LINES.sub(r"\1", translation)
    ending = _newline(segment) if "\n" in segment else newline
    if ending is None:  # the segment mixes endings: nothing to follow
        return translation
    return _NEWLINE.sub(ending, translation)


@dataclass(frozen=True)
class FileDocument(Document):
    """A localisation file split: each unit's pieces (literal, segment, ..., literal, as a
    document's), its line and context, and how the file is written back in ``target``.
    ``pieces`` holds every segment between empty literals, for :attr:`segments`."""

    unit_pieces: tuple[tuple[str, ...], ...]
    unit_lines: tuple[int, ...]
    unit_contexts: tuple[str | None, ...]
    segment_units: tuple[int, ...]  # each segment's unit
    file: LocalisationFile
    target: str
    bom: str

    def context_of(self, index: int) -> str | None:
        return self.unit_contexts[self.segment_units[index]]

    def line_of(self, index: int) -> int:
        return self.unit_lines[self.segment_units[index]]

    def assemble(self, translations: Sequence[str]) -> str:
        """The file with each unit's translation (its segments' translations between its
        literals) in place."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        given = iter(translations)
        texts = []
        for pieces in self.unit_pieces:
            parts = [pieces[0]]
            for literal in pieces[2::2]:
                parts += (next(given), literal)
            texts.append("".join(parts))
        return self.bom + self.file.rebuild(texts, self.target)


def split_document(
    text: str,
    kind: str,
    *,
    budget: int,
    measure: Measure,
    language: str | None = None,
    target: str | None = None,
) -> Document:
    """Split ``text`` (a ``kind`` document: :mod:`.document_formats` reads its structure) into
    segments of at most ``budget`` tokens where it has places to cut. A localisation file
    (XLIFF, PO) is written back in ``target``, its units split as prose blocks. Raises
    InvalidRequest for a malformed SRT, XLIFF or PO file."""
    if kind in LOCALISATION:
        if target is None:
            raise ValueError(f"a {kind} document needs its target language")
        return _split_file(text, kind, budget, measure, language or "en", target)
    pieces = _Pieces(kind, budget, measure, language or "en")
    body = text.removeprefix(_BOM)  # a byte order mark is no part of the first block
    pieces.literal(text[: len(text) - len(body)])
    PARSERS[kind](body, pieces)
    document = Document(kind, pieces.done())
    assert "".join(document.pieces) == text, "a document must reassemble byte for byte"
    return document


def _split_file(
    text: str, kind: str, budget: int, measure: Measure, language: str, target: str
) -> FileDocument:
    body = text.removeprefix(_BOM)
    parsed = LOCALISATION[kind](body)
    unit_pieces, segment_units = [], []
    for number, unit in enumerate(parsed.units):
        pieces = _Pieces(kind, budget, measure, language)
        pieces.prose(unit.text)
        unit_pieces.append(pieces.done())
        segment_units += [number] * (len(unit_pieces[-1]) // 2)
    segments = [segment for pieces in unit_pieces for segment in pieces[1::2]]
    return FileDocument(
        kind,
        ("", *(piece for segment in segments for piece in (segment, ""))),
        tuple(unit_pieces),
        tuple(unit.line for unit in parsed.units),
        tuple(unit.context for unit in parsed.units),
        tuple(segment_units),
        parsed,
        target,
        text[: len(text) - len(body)],
    )


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
    """Sorted spans that are never cut and never count as prose: URLs, e-mail addresses, tags,
    and in Markdown inline code."""
    spans = [m.span() for m in _URL.finditer(text)]
    if kind != "text":
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
        match = TAG_AT.match(text, start)
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
