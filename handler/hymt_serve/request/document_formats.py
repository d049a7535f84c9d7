"""The structure of each document format, read line by line (or tag by tag): what is literal
(markup, code, whitespace, subtitle numbers and timings) and what is prose, handed in order to
:class:`Pieces` (:func:`hymt_serve.request.documents.split_document` makes segments of the
prose). Iterative and linear in the document's length, as the splitting module says.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

from hymt_serve.request.errors import InvalidRequest

TAG_AT = re.compile(r"</?([A-Za-z][A-Za-z0-9-]*)(?:\s[^<>]*)?/?>")
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


class Pieces(Protocol):
    """Where a parser puts the document, in order."""

    def literal(self, text: str) -> None: ...

    def prose(self, text: str) -> None: ...


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


def _text(text: str, out: Pieces) -> None:
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


def _markdown(text: str, out: Pieces) -> None:
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
        if bare.lstrip().startswith("<") and TAG_AT.match(bare.lstrip()):  # an HTML line
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


def _heading_text(rest: str, out: Pieces) -> None:
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


def _table_row(line: str, out: Pieces) -> None:
    position = 0
    for bar in _CELL.finditer(line):
        out.prose(line[position : bar.start()])
        out.literal("|")
        position = bar.end()
    out.prose(line[position:])


# HTML: runs of text between block-level tags; inline tags stay inside their run.
def _html(text: str, out: Pieces) -> None:
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
        elif match := TAG_AT.match(text, start):
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
_SRT_TIMING = re.compile(rf"[ \t]*{_SRT_TIME}[ \t]*-->[ \t]*{_SRT_TIME}(?:[ \t].*)?$")


def _srt(text: str, out: Pieces) -> None:
    lines = _lines(text)
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


PARSERS: dict[str, Callable[[str, Pieces], None]] = {
    "text": _text,
    "markdown": _markdown,
    "html": _html,
    "srt": _srt,
}
