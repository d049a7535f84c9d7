"""Where a tag the model lost goes back into its output.

A lost pair (or one left empty) is put back, inside its parent when that came back, around the
first of: its source text found again (a name, a number), the words after (before) the half
the model kept, its stand-ins, the words at the same relative place as in the source; with no
text at all it comes with its source text. A lost stand-in goes between the words at its
relative place, spaced as in the source.
"""

from __future__ import annotations

import re

from hymt_serve.request.markup_tokens import Mark, Token, TokenList

WORK = 200_000  # token visits for careful placements in one output


class Placement(TokenList):
    """Puts lost tags back into :attr:`tokens` (the module's docstring says where)."""

    def _put_back(self, lost: list[int]) -> None:
        """The lost tags placed, pairs (parents first) before stand-ins. Each careful placement
        walks the tokens and the text: past a budget of such steps (a segment of thousands of
        tags, all lost) the rest are appended."""
        work, size = 0, len(self.markup.plain) // 8
        for index, number in enumerate(lost):
            work += len(self.tokens) + size
            if work > WORK:
                self._append(lost[index:])
                return
            if self.markup.closes[number - 1]:
                self._place(number)
            else:
                self._place_unit(number)

    def _append(self, numbers: list[int]) -> None:
        """Lost tags past the budget: at the end, each pair around its source text."""
        if not numbers:
            return
        self.tokens = [t for t in self.tokens if not (isinstance(t, Mark) and t.role[0] == "h")]
        for number in numbers:
            if self.markup.closes[number - 1]:
                a, b = self.markup.spans[number - 1]
                text = self.markup.plain[a:b].strip()
                self.tokens += [" ", Mark("open", number), text, Mark("close", number)]
            else:
                self.tokens += [" ", Mark("unit", number)]

    def _place(self, number: int) -> None:
        """Lost pair ``number`` put back (the module's docstring says where)."""
        half = self._take_half(number)
        start, end = self._scope(number)
        offsets = self._offsets()
        s, e = offsets[start], offsets[end]
        plain = "".join(t for t in self.tokens if isinstance(t, str))
        span = self._found(number, plain, s, e)
        if span is None and half is not None:
            span = self._beside(number, half, plain, s, e)
        units = None if span else self._stand_ins_of(number, start, end)
        if span is None and units is None:
            span = self._proportional(number, plain, s, e)
        if units is not None:
            first, last = units
        elif span is not None:
            first = self._at(span[0], after_marks=True)
            last = self._at(span[1], after_marks=False)
        else:  # no text to wrap: the pair with its source text
            a, b = self.markup.spans[number - 1]
            added = [*self._space_before(end), self.markup.plain[a:b].strip()]
            self.tokens[end:end] = added
            first, last = end + len(added) - 1, end + len(added)
        first, last = self._balanced(first, last)
        self.tokens[last:last] = [Mark("close", number)]
        self.tokens[first:first] = [Mark("open", number)]

    def _take_half(self, number: int) -> tuple[str, int] | None:
        """The surviving half of pair ``number`` (its role and plain offset), taken out."""
        offsets = self._offsets()
        for index, token in enumerate(self.tokens):
            if isinstance(token, Mark) and token.number == number and token.role[0] == "h":
                self.tokens[index] = ""
                return token.role, offsets[index]
        return None

    def _found(self, number: int, plain: str, s: int, e: int) -> tuple[int, int] | None:
        """Where the pair's source text appears in the output (a name, a number)."""
        a, b, _, _ = self._frame(number)
        inner = self.markup.plain[a:b].strip()
        if not inner:
            return None
        edge_before = r"(?<![A-Za-z0-9])" if inner[0].isascii() and inner[0].isalnum() else ""
        edge_after = r"(?![A-Za-z0-9])" if inner[-1].isascii() and inner[-1].isalnum() else ""
        pattern = re.compile(edge_before + re.escape(inner) + edge_after, re.IGNORECASE)
        match = pattern.search(plain, s, e)
        return match.span() if match else None

    def _beside(
        self, number: int, half: tuple[str, int], plain: str, s: int, e: int
    ) -> tuple[int, int] | None:
        """The words after a surviving opening tag (before a closing one), as many as the
        pair wrapped in the source."""
        a, b, ps, pe = self._frame(number)
        size = max(1, round((b - a) * (e - s) / max(1, pe - ps)))
        role, at = half[0], min(max(half[1], s), e)
        start, end = (at, min(e, at + size)) if role == "half-open" else (max(s, at - size), at)
        return _words(plain, start, end, s, e)

    def _stand_ins_of(self, number: int, start: int, end: int) -> tuple[int, int] | None:
        """The token range from the first to the last stand-in the pair held in the source."""
        inside = [
            index
            for index in range(start, end)
            if isinstance(token := self.tokens[index], Mark)
            and token.role == "unit"
            and self.markup.parents[token.number - 1] == number
        ]
        return (inside[0], inside[-1] + 1) if inside else None

    def _proportional(self, number: int, plain: str, s: int, e: int) -> tuple[int, int] | None:
        """The words at the place of the output that the pair had in its source."""
        a, b, ps, pe = self._frame(number)
        length, size = max(1, pe - ps), e - s
        start, end = s + (a - ps) * size // length, s - (-(b - ps) * size // length)
        if not plain[start:end].strip():  # landed on spaces: the nearest word
            after = next((i for i in range(end, e) if not plain[i].isspace()), None)
            before = next((i for i in range(start - 1, s - 1, -1) if not plain[i].isspace()), None)
            nearest = after if after is not None else before
            if nearest is None:
                return None
            start, end = nearest, nearest + 1
        return _words(plain, start, end, s, e)

    def _place_unit(self, number: int) -> None:
        """A lost stand-in between the words at its source's relative place in its parent (or
        the segment), spaced as in the source."""
        start, end = self._scope(number)
        offsets = self._offsets()
        s, e = offsets[start], offsets[end]
        plain = "".join(t for t in self.tokens if isinstance(t, str))
        a, _, ps, pe = self._frame(number)
        at = _boundary(plain, s + (a - ps) * (e - s) // max(1, pe - ps), s, e)
        index = end if s == e else self._at(at, after_marks=at < e)
        source = self.markup.plain
        space_before = source[a - 1 : a].isspace() and plain[at - 1 : at].strip()
        space_after = source[a : a + 1].isspace() and plain[at : at + 1].strip()
        unit: list[Token] = [" "] * bool(space_before) + [Mark("unit", number)]
        self.tokens[index:index] = unit + [" "] * bool(space_after)

    def _space_before(self, index: int) -> list[Token]:
        """A space to insert at ``index`` when the text before it ends in a word or markup."""
        before = next((t for t in reversed(self.tokens[:index]) if t), "")
        if isinstance(before, Mark):
            return [] if before.role == "open" else [" "]
        return [" "] if before and not before[-1].isspace() else []


def _boundary(plain: str, at: int, s: int, e: int) -> int:
    """``at``, or where the text between ``s`` and ``e`` has spaces, the nearer end of the
    word ``at`` falls in."""
    if not (plain[at - 1 : at].strip() and plain[at : at + 1].strip()):
        return at
    if not any(c.isspace() for c in plain[s:e]):
        return at
    left, right = at, at
    while left > s and not plain[left - 1].isspace():
        left -= 1
    while right < e and not plain[right].isspace():
        right += 1
    return left if at - left < right - at else right


def _words(plain: str, start: int, end: int, s: int, e: int) -> tuple[int, int] | None:
    """``plain[start:end]`` without spaces at its ends and, where the text between ``s`` and
    ``e`` has spaces between words, with its ends moved to the nearer word boundaries (or
    widened to whole words when that leaves nothing); None if nothing is left."""
    if any(c.isspace() for c in plain[s:e]):
        nearer = _boundary(plain, start, s, e), _boundary(plain, end, s, e)
        if plain[nearer[0] : nearer[1]].strip():
            start, end = nearer
        else:
            while start > s and not plain[start - 1].isspace():
                start -= 1
            while end < e and not plain[end].isspace():
                end += 1
    while start < end and plain[start].isspace():
        start += 1
    while end > start and plain[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None
