"""What the localisation formats (XLIFF: :mod:`.localisation_xliff`, gettext PO:
:mod:`.localisation_po`) hand the document pipeline, and how their inline codes travel.

A localisation file becomes *units* (a text to translate each: an XLIFF source, a PO msgid) and
a function that writes the file back with each unit's translation in its place. A unit's inline
codes (XLIFF's ``<g>``, ``<ph/>``, ``<bpt>``...; a PO string's ``%s`` placeholders) become
HTML-like tags of a name the file never uses (:class:`Codes`): the pipeline turns them into the
model's ``<sN>`` tags and restores them as every HTML tag (:mod:`hymt_serve.request.markup`),
and :meth:`Codes.render` reads them back, tolerating what a careless model and segments cut
inside a pair can still leave (a pair crossing another, a half missing): each code comes back
exactly once, and pairs well nested.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """A text to translate (inline codes as :class:`Codes` tags), the file's line it comes
    from, and the context the file gives it (a PO msgctxt), if any."""

    text: str
    line: int
    context: str | None = None


# The unit translations in order and the target language's code -> the translated file.
Rebuild = Callable[[Sequence[str], str], str]


@dataclass(frozen=True)
class LocalisationFile:
    units: tuple[Unit, ...]
    rebuild: Rebuild


class Codes:
    """The inline codes of one unit, numbered: a pair (its raw opening and closing markup) or
    a standalone code (its raw markup). ``tag_name`` is a name no text of the file holds
    (:func:`unused_name`), so that no text passes for a code."""

    def __init__(self, tag_name: str) -> None:
        self.tag_name = tag_name
        self.opens: list[str] = []
        self.closes: list[str | None] = []  # None: a standalone code
        self._tag = re.compile(rf'<(/?){self.tag_name}(?: n="(\d+)")?(/?)>', re.IGNORECASE)

    def pair(self, opening: str, closing: str) -> tuple[str, str]:
        """The tags that stand for a pair of codes around text."""
        self.opens.append(opening)
        self.closes.append(closing)
        return f'<{self.tag_name} n="{len(self.opens)}">', f"</{self.tag_name}>"

    def standalone(self, raw: str) -> str:
        """The tag that stands for a code with no text to translate."""
        self.opens.append(raw)
        self.closes.append(None)
        return f'<{self.tag_name} n="{len(self.opens)}"/>'

    def render(self, translated: str, escape: Callable[[str], str]) -> str:
        """``translated`` (a unit's translation, tags as :meth:`pair` and :meth:`standalone`
        made them) with each code's raw markup in its place and the text through ``escape``.
        Each code comes back once: a repeated tag is dropped, a pair crossing another is closed
        where that one closes, a pair left open is closed at the end, a code the translation
        lost is put at the end. The closing tag of a pair carries no number: it closes the
        innermost open pair, as the HTML tags it stood in for did."""
        out: list[str] = []
        stack: list[int] = []
        seen: set[int] = set()
        position = 0
        for match in self._tag.finditer(translated):
            out.append(escape(translated[position : match.start()]))
            position = match.end()
            closing, number = bool(match[1]), int(match[2] or 0)
            if closing:
                if stack:
                    out.append(self._close(stack.pop()))
                continue
            if not 0 < number <= len(self.opens) or number in seen:
                continue
            seen.add(number)
            out.append(self.opens[number - 1])
            if self.closes[number - 1] is not None and not match[3]:
                stack.append(number)
            elif self.closes[number - 1] is not None:  # a pair written as one tag: empty
                out.append(self._close(number))
        out.append(escape(translated[position:]))
        out += [self._close(number) for number in reversed(stack)]
        for number in range(1, len(self.opens) + 1):
            if number not in seen:
                out.append(self.opens[number - 1] + (self.closes[number - 1] or ""))
        return "".join(out)

    def _close(self, number: int) -> str:
        return self.closes[number - 1] or ""


def unused_name(text_of_file: str) -> str:
    """A tag name for :class:`Codes` that ``text_of_file`` does not hold in any case."""
    text = text_of_file.lower()
    name = "hymt-code"
    while name in text:
        name += "-x"
    return name
