"""The tag model of formatted text: what each ``<sN>`` tag stands for (:class:`Markup`), and a
model's output as text and tag tokens (:class:`TokenList`) with the queries that repairing it
asks: where each pair is, where a tag goes at a text offset, a tag's source span.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

TAG = re.compile(r"<(/?)s(\d+)>")
# A bare URL ends as GitHub's autolinks do: not in punctuation, nor in * _ ~ (emphasis).
BARE_URL = re.compile(r"\bhttps?://[^\s<>()\[\]]*[^\s<>()\[\].,;:!?'\"*_~]")
# An e-mail address; the lookbehind keeps each run of address characters to one attempt.
EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
    r"(?![A-Za-z0-9-])"
)


@dataclass(frozen=True)
class Markup:
    """The markup behind each tag number (``opens[n - 1]``, ``closes[n - 1]``); an empty
    close marks a stand-in (an empty ``<sN></sN>``). ``plain`` is the tagged text without its
    tags (what the model translates), ``spans[n - 1]`` the part of it tag n wrapped and
    ``parents[n - 1]`` the tag it sat in (0: none): where to look when the model drops a tag."""

    opens: tuple[str, ...] = ()
    closes: tuple[str, ...] = ()
    plain: str = ""
    spans: tuple[tuple[int, int], ...] = ()
    parents: tuple[int, ...] = ()


def tag_number(match: re.Match[str]) -> int:
    """A tag's number (0, which no tag has, for one too long to be ours)."""
    return int(match[2]) if len(match[2]) <= 6 else 0


class Mark(NamedTuple):
    """Tag ``number`` in the output: its "open" or "close" tag, a stand-in ("unit"), or the
    surviving half of a pair ("half-open", "half-close") that marks where to put it back."""

    role: str
    number: int


Token = str | Mark


def is_text(token: Token) -> bool:
    """Whether a token is text (not only spaces) or a stand-in for some."""
    return bool(token.strip()) if isinstance(token, str) else token.role == "unit"


class TokenList:
    """An output as ``tokens`` (text and marks, in order) beside the ``markup`` of its source."""

    markup: Markup
    tokens: list[Token]

    def _has_text(self, start: int, end: int) -> bool:
        return any(map(is_text, self.tokens[start:end]))

    def _pairs(self) -> dict[int, tuple[int, int]]:
        """Each whole pair's open and close index."""
        opened: dict[int, int] = {}
        pairs = {}
        for index, token in enumerate(self.tokens):
            if isinstance(token, Mark) and token.role == "open":
                opened[token.number] = index
            elif isinstance(token, Mark) and token.role == "close":
                pairs[token.number] = (opened[token.number], index)
        return pairs

    def _scope(self, number: int) -> tuple[int, int]:
        """The token range to place tag ``number`` in: its parent's content, or everything."""
        parent = self.markup.parents[number - 1]
        pairs = self._pairs()
        if parent in pairs:
            return pairs[parent][0] + 1, pairs[parent][1]
        return 0, len(self.tokens)

    def _offsets(self) -> list[int]:
        """Each token's offset in the plain text (the text tokens joined), and its length."""
        offsets = [0]
        for token in self.tokens:
            offsets.append(offsets[-1] + (len(token) if isinstance(token, str) else 0))
        return offsets

    def _frame(self, number: int) -> tuple[int, int, int, int]:
        """Tag ``number``'s source span and its parent's content span (or the whole text)."""
        markup = self.markup
        a, b = markup.spans[number - 1]
        parent = markup.parents[number - 1]
        ps, pe = markup.spans[parent - 1] if parent else (0, len(markup.plain))
        return a, b, ps, pe

    def _at(self, offset: int, *, after_marks: bool) -> int:
        """The token index that puts a tag at plain ``offset``: past the tags already there
        (an opening tag) or before them (a closing one); a text token is split to make it."""
        position = 0
        for index, token in enumerate(self.tokens):
            if not isinstance(token, str) or not token:
                continue
            end = position + len(token)
            if position <= offset < end if after_marks else position < offset <= end:
                cut = offset - position
                if 0 < cut < len(token):
                    self.tokens[index : index + 1] = [token[:cut], token[cut:]]
                return index + (cut > 0)
            position = end
        return len(self.tokens) if after_marks else 0

    def _balanced(self, first: int, last: int) -> tuple[int, int]:
        """``tokens[first:last]`` widened until it holds every pair it holds part of."""
        pairs = self._pairs()
        changed = True
        while changed:
            changed = False
            for token in self.tokens[first:last]:
                if isinstance(token, Mark) and token.number in pairs:
                    opened, closed = pairs[token.number]
                    if opened < first or closed >= last:
                        first, last, changed = min(first, opened), max(last, closed + 1), True
        return first, last
