"""The model's output made whole against the source's markup: HY-MT1.5 drops, repeats, moves
and crosses ``<sN>`` tags now and then (the tiny test model all the time), and a document must
still come back with every URL, attribute and marker its source had.

:func:`repair` turns an output into the final text with each tag of its
:class:`~hymt_serve.request.markup_tokens.Markup` exactly once, well nested; where a lost tag
goes is :mod:`hymt_serve.request.markup_placement`'s part.
"""

from __future__ import annotations

import itertools
import re

from hymt_serve.request.markup_placement import WORK, Placement
from hymt_serve.request.markup_tokens import (
    BARE_URL,
    EMAIL,
    TAG,
    Mark,
    Markup,
    Token,
    is_text,
    tag_number,
)

_LINK = re.compile(r"\[|<a[\s>]", re.IGNORECASE)  # an opening tag that makes a link
_LINKISH = re.compile(r"!?\[|<a[\s>]", re.IGNORECASE)  # ... or an image
_CUT = re.compile(r"(?:</(?:s\d*)?|<s\d*)\Z")  # a tag cut off by max_new_tokens


def repair(output: str, markup: Markup) -> str:
    """``output`` with every tag of ``markup`` turned back into its markup exactly once (see
    :class:`_Repair`)."""
    return _Repair(output, markup).text()


class _Repair(Placement):
    """The model's output made whole: each source tag exactly once, pairs well nested around
    text, tags the source did not have dropped.

    Of repeated tags the first whole pair (or stand-in) counts; a pair given close-first wraps
    the text between. Crossing pairs are nested by closing the outer one later. Lost pairs and
    stand-ins are put back (:class:`Placement`). No link ends up inside a link, and a bare URL
    or address the model glued to a word gets a space."""

    def __init__(self, output: str, markup: Markup):
        self.markup = markup
        self.tokens: list[Token] = []
        cut = _CUT.search(output)
        if cut and not markup.plain.endswith(cut[0]):
            output = output[: cut.start()]
        position = 0
        for match in TAG.finditer(output):
            self.tokens.append(output[position : match.start()])
            position = match.end()
            if 1 <= tag_number(match) <= len(markup.opens):
                self.tokens.append(Mark("close" if match[1] else "open", tag_number(match)))
        self.tokens.append(output[position:])

    def text(self) -> str:
        lost = self._select()
        self._nest()
        lost += self._empty_pairs()
        self._put_back(sorted(lost, key=lambda n: (not self.markup.closes[n - 1], n)))
        self._unnest_links(rounds=max(8, WORK // (len(self.tokens) + len(self.markup.plain))))
        self._trim()
        return self._render()

    def _render(self) -> str:
        """The tokens as text, each tag as its markup, bare URLs and addresses kept apart."""
        parts = [self._markup_of(token) for token in self.tokens]
        for index, token in enumerate(self.tokens):
            if isinstance(token, Mark) and token.role == "unit":
                before = "".join(self._run(parts, range(index - 1, -1, -1))[::-1])
                after = "".join(self._run(parts, range(index + 1, len(parts))))
                parts[index] = _delimited(parts[index], before, after)
        return "".join(parts)

    def _run(self, parts: list[str], indices: range) -> list[str]:
        """The text at ``indices`` (markup included), about 200 characters of it."""
        run: list[str] = []
        for index in itertools.islice(indices, 64):
            if sum(map(len, run)) > 200:
                break
            run.append(parts[index])
        return run

    def _markup_of(self, token: Token) -> str:
        if isinstance(token, str):
            return token
        if token.role == "close":
            return self.markup.closes[token.number - 1]
        return self.markup.opens[token.number - 1] if token.role in ("open", "unit") else ""

    def _select(self) -> list[int]:
        """Keeps one stand-in or whole pair per number; the numbers left to put back."""
        where: dict[int, list[int]] = {}
        for index, token in enumerate(self.tokens):
            if isinstance(token, Mark):
                where.setdefault(token.number, []).append(index)
        keep: dict[int, Mark] = {}
        lost = []
        for number in range(1, len(self.markup.opens) + 1):
            chosen = self._choose(number, where.get(number, []))
            keep.update(chosen)
            if not chosen or any(mark.role.startswith("half") for mark in chosen.values()):
                lost.append(number)
        self.tokens = [
            keep.get(index, "") if isinstance(token, Mark) else token
            for index, token in enumerate(self.tokens)
        ]
        return lost

    def _choose(self, number: int, indices: list[int]) -> dict[int, Mark]:
        if not self.markup.closes[number - 1]:
            return {indices[0]: Mark("unit", number)} if indices else {}
        marks = [(index, self.tokens[index]) for index in indices]
        opens = [i for i, mark in marks if isinstance(mark, Mark) and mark.role == "open"]
        closes = [i for i, mark in marks if isinstance(mark, Mark) and mark.role == "close"]
        if opens:
            after = [i for i in closes if i > opens[0]]
            if after:
                return {opens[0]: Mark("open", number), after[0]: Mark("close", number)}
            if closes:  # close first: the text between
                return {closes[-1]: Mark("open", number), opens[0]: Mark("close", number)}
            return {opens[0]: Mark("half-open", number)}
        return {closes[-1]: Mark("half-close", number)} if closes else {}

    def _nest(self) -> None:
        """Crossing pairs nested: a close met while pairs opened after it are still open
        waits until they close."""
        nested: list[Token] = []
        stack: list[int] = []
        waiting: set[int] = set()
        for token in self.tokens:
            if not isinstance(token, Mark) or token.role not in ("open", "close"):
                nested.append(token)
            elif token.role == "open":
                stack.append(token.number)
                nested.append(token)
            elif stack[-1] != token.number:
                waiting.add(token.number)
            else:
                nested.append(token)
                stack.pop()
                while stack and stack[-1] in waiting:
                    waiting.discard(stack[-1])
                    nested.append(Mark("close", stack.pop()))
        self.tokens = nested

    def _empty_pairs(self) -> list[int]:
        """Pairs the model left empty around text the source had: taken out, to be put back."""
        emptied = []
        texts = list(itertools.accumulate((is_text(t) for t in self.tokens), initial=0))
        for number, (start, end) in self._pairs().items():
            a, b = self.markup.spans[number - 1]
            if self.markup.plain[a:b].strip() and texts[end] == texts[start + 1]:
                emptied.append(number)
        gone = set(emptied)
        self.tokens = ["" if isinstance(t, Mark) and t.number in gone else t for t in self.tokens]
        return emptied

    def _unnest_links(self, rounds: int) -> None:
        """No link inside a link or image (Markdown and HTML have none): the outer one ends
        before the inner one (pairs still open in it end there too, or begin again after it
        when they have no text before it), or begins after it when it has no text before it."""
        for _ in range(rounds):
            found = self._link_in_link()
            if found is None:
                return
            outer, inner, between = found
            pairs = self._pairs()
            start = pairs[inner][0]
            if not self._has_text(pairs[outer][0] + 1, start):
                self._begin_after(outer, pairs[inner][1])
                continue
            cut = [n for n in between if self._has_text(pairs[n][0] + 1, start)]
            again = [n for n in between if n not in cut]
            dropped = {pairs[n][1] for n in (*cut, outer)} | {pairs[n][0] for n in again}
            added: list[Token] = [
                *(Mark("close", n) for n in reversed(cut)),
                Mark("close", outer),
                *(Mark("open", n) for n in again),
            ]
            kept = [t for i, t in enumerate(self.tokens) if i not in dropped]
            at = start - sum(i < start for i in dropped)
            self.tokens = kept[:at] + added + kept[at:]

    def _link_in_link(self) -> tuple[int, int, list[int]] | None:
        """The first link inside a link or image: the outer, the inner and the pairs open
        between them."""
        stack: list[int] = []
        for token in self.tokens:
            if isinstance(token, Mark) and token.role == "open":
                if _LINK.match(self.markup.opens[token.number - 1]):
                    outer = [
                        i for i, n in enumerate(stack) if _LINKISH.match(self.markup.opens[n - 1])
                    ]
                    if outer:
                        return stack[outer[-1]], token.number, stack[outer[-1] + 1 :]
                stack.append(token.number)
            elif isinstance(token, Mark) and token.role == "close":
                stack.pop()
        return None

    def _begin_after(self, number: int, index: int) -> None:
        """Pair ``number``'s opening tag moved past ``tokens[index]`` (with its source text
        when no text is left for it), nested again."""
        self.tokens.insert(index + 1, Mark("open", number))
        self.tokens.remove(Mark("open", number))
        opened, closed = self._pairs()[number]
        if not self._has_text(opened + 1, closed):
            a, b = self.markup.spans[number - 1]
            self.tokens.insert(opened + 1, self.markup.plain[a:b].strip())
            self.tokens.insert(opened, " ")
        self._nest()

    def _trim(self) -> None:
        """Spaces at the inner ends of a pair moved out (``** word **`` is no emphasis),
        unless its source had them."""
        plain, spans = self.markup.plain, self.markup.spans
        index = len(self.tokens) - 1
        while index >= 0:  # openings, innermost first
            token = self.tokens[index]
            if isinstance(token, Mark) and token.role == "open" and index + 1 < len(self.tokens):
                a, b = spans[token.number - 1]
                after = self.tokens[index + 1]
                if isinstance(after, str) and after[:1].isspace() and not plain[a:b][:1].isspace():
                    stripped = after.lstrip()
                    self.tokens[index + 1 : index + 2] = [stripped]
                    self.tokens[index:index] = [after[: len(after) - len(stripped)]]
            index -= 1
        index = 0
        while index < len(self.tokens):  # closings, innermost first
            token = self.tokens[index]
            if isinstance(token, Mark) and token.role == "close" and index > 0:
                a, b = spans[token.number - 1]
                before = self.tokens[index - 1]
                source = plain[a:b]
                if isinstance(before, str) and before[-1:].isspace() and not source[-1:].isspace():
                    stripped = before.rstrip()
                    self.tokens[index - 1] = stripped
                    self.tokens.insert(index + 1, before[len(stripped) :])
            index += 1


def _delimited(bare: str, before: str, after: str) -> str:
    """A stand-in's text, with a space on a side where the model put a bare URL or e-mail
    address against text that would run into it (``https://x.org/a`` + ``word``)."""
    pattern = EMAIL if EMAIL.fullmatch(bare) else BARE_URL if BARE_URL.fullmatch(bare) else None
    if pattern is None:  # code, an autolink, an HTML tag: delimited already
        return bare
    lead = before[-1:]
    starts = pattern.match(lead + bare + " ", len(lead)) is not None
    match = pattern.match(" " + bare + after, 1)
    ends = match is not None and match.end() == 1 + len(bare)
    return " " * (not starts) + bare + " " * (not ends)
