"""The model's output made whole against the source's markup: HY-MT1.5 drops, repeats, moves
and crosses ``<sN>`` tags now and then (the tiny test model all the time), and a document must
still come back with every URL, attribute and marker its source had.

:class:`Markup` records what each tag stands for and where it sat in the source text;
:func:`repair` turns an output into the final text with each tag exactly once, well nested.
"""

from __future__ import annotations

import itertools
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


def repair(output: str, markup: Markup) -> str:
    """``output`` with every tag of ``markup`` turned back into its markup exactly once (see
    :class:`_Repair` for where a lost one goes)."""
    return _Repair(output, markup).text()


def tag_number(match: re.Match[str]) -> int:
    """A tag's number (0, which no tag has, for one too long to be ours)."""
    return int(match[2]) if len(match[2]) <= 6 else 0


class _Mark(NamedTuple):
    """Tag ``number`` in the output: its "open" or "close" tag, a stand-in ("unit"), or the
    surviving half of a pair ("half-open", "half-close") that marks where to put it back."""

    role: str
    number: int


_Token = str | _Mark
_WORK = 200_000  # token visits for careful placements in one output
_LINK = re.compile(r"\[|<a[\s>]", re.IGNORECASE)  # an opening tag that makes a link
_LINKISH = re.compile(r"!?\[|<a[\s>]", re.IGNORECASE)  # ... or an image
_CUT = re.compile(r"(?:</(?:s\d*)?|<s\d*)\Z")  # a tag cut off by max_new_tokens


class _Repair:
    """The model's output made whole: each source tag exactly once, pairs well nested around
    text, tags the source did not have dropped.

    Of repeated tags the first whole pair (or stand-in) counts; a pair given close-first wraps
    the text between. Crossing pairs are nested by closing the outer one later. A lost pair
    (or one left empty) is put back, inside its parent when that came back, around the first
    of: its source text found again (a name, a number), the words after (before) the half the
    model kept, its stand-ins, the words at the same relative place as in the source; with no
    text at all it comes with its source text. A lost stand-in goes between the words at its
    relative place, spaced as in the source. No link ends up inside a link, and a bare URL or
    address the model glued to a word gets a space."""

    def __init__(self, output: str, markup: Markup):
        self.markup = markup
        self.tokens: list[_Token] = []
        cut = _CUT.search(output)
        if cut and not markup.plain.endswith(cut[0]):
            output = output[: cut.start()]
        position = 0
        for match in TAG.finditer(output):
            self.tokens.append(output[position : match.start()])
            position = match.end()
            if 1 <= tag_number(match) <= len(markup.opens):
                self.tokens.append(_Mark("close" if match[1] else "open", tag_number(match)))
        self.tokens.append(output[position:])

    def text(self) -> str:
        lost = self._select()
        self._nest()
        lost += self._empty_pairs()
        self._put_back(sorted(lost, key=lambda n: (not self.markup.closes[n - 1], n)))
        self._unnest_links(rounds=max(8, _WORK // (len(self.tokens) + len(self.markup.plain))))
        self._trim()
        return self._render()

    def _put_back(self, lost: list[int]) -> None:
        """The lost tags placed, pairs (parents first) before stand-ins. Each careful placement
        walks the tokens and the text: past a budget of such steps (a segment of thousands of
        tags, all lost) the rest are appended."""
        work, size = 0, len(self.markup.plain) // 8
        for index, number in enumerate(lost):
            work += len(self.tokens) + size
            if work > _WORK:
                self._append(lost[index:])
                return
            if self.markup.closes[number - 1]:
                self._place(number)
            else:
                self._place_unit(number)

    def _render(self) -> str:
        """The tokens as text, each tag as its markup, bare URLs and addresses kept apart."""
        parts = [self._markup_of(token) for token in self.tokens]
        for index, token in enumerate(self.tokens):
            if isinstance(token, _Mark) and token.role == "unit":
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

    def _markup_of(self, token: _Token) -> str:
        if isinstance(token, str):
            return token
        if token.role == "close":
            return self.markup.closes[token.number - 1]
        return self.markup.opens[token.number - 1] if token.role in ("open", "unit") else ""

    def _select(self) -> list[int]:
        """Keeps one stand-in or whole pair per number; the numbers left to put back."""
        where: dict[int, list[int]] = {}
        for index, token in enumerate(self.tokens):
            if isinstance(token, _Mark):
                where.setdefault(token.number, []).append(index)
        keep: dict[int, _Mark] = {}
        lost = []
        for number in range(1, len(self.markup.opens) + 1):
            chosen = self._choose(number, where.get(number, []))
            keep.update(chosen)
            if not chosen or any(mark.role.startswith("half") for mark in chosen.values()):
                lost.append(number)
        self.tokens = [
            keep.get(index, "") if isinstance(token, _Mark) else token
            for index, token in enumerate(self.tokens)
        ]
        return lost

    def _choose(self, number: int, indices: list[int]) -> dict[int, _Mark]:
        if not self.markup.closes[number - 1]:
            return {indices[0]: _Mark("unit", number)} if indices else {}
        marks = [(index, self.tokens[index]) for index in indices]
        opens = [i for i, mark in marks if isinstance(mark, _Mark) and mark.role == "open"]
        closes = [i for i, mark in marks if isinstance(mark, _Mark) and mark.role == "close"]
        if opens:
            after = [i for i in closes if i > opens[0]]
            if after:
                return {opens[0]: _Mark("open", number), after[0]: _Mark("close", number)}
            if closes:  # close first: the text between
                return {closes[-1]: _Mark("open", number), opens[0]: _Mark("close", number)}
            return {opens[0]: _Mark("half-open", number)}
        return {closes[-1]: _Mark("half-close", number)} if closes else {}

    def _nest(self) -> None:
        """Crossing pairs nested: a close met while pairs opened after it are still open
        waits until they close."""
        nested: list[_Token] = []
        stack: list[int] = []
        waiting: set[int] = set()
        for token in self.tokens:
            if not isinstance(token, _Mark) or token.role not in ("open", "close"):
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
                    nested.append(_Mark("close", stack.pop()))
        self.tokens = nested

    def _empty_pairs(self) -> list[int]:
        """Pairs the model left empty around text the source had: taken out, to be put back."""
        emptied = []
        texts = list(itertools.accumulate((_is_text(t) for t in self.tokens), initial=0))
        for number, (start, end) in self._pairs().items():
            a, b = self.markup.spans[number - 1]
            if self.markup.plain[a:b].strip() and texts[end] == texts[start + 1]:
                emptied.append(number)
        gone = set(emptied)
        self.tokens = ["" if isinstance(t, _Mark) and t.number in gone else t for t in self.tokens]
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
            added: list[_Token] = [
                *(_Mark("close", n) for n in reversed(cut)),
                _Mark("close", outer),
                *(_Mark("open", n) for n in again),
            ]
            kept = [t for i, t in enumerate(self.tokens) if i not in dropped]
            at = start - sum(i < start for i in dropped)
            self.tokens = kept[:at] + added + kept[at:]

    def _link_in_link(self) -> tuple[int, int, list[int]] | None:
        """The first link inside a link or image: the outer, the inner and the pairs open
        between them."""
        stack: list[int] = []
        for token in self.tokens:
            if isinstance(token, _Mark) and token.role == "open":
                if _LINK.match(self.markup.opens[token.number - 1]):
                    outer = [
                        i for i, n in enumerate(stack) if _LINKISH.match(self.markup.opens[n - 1])
                    ]
                    if outer:
                        return stack[outer[-1]], token.number, stack[outer[-1] + 1 :]
                stack.append(token.number)
            elif isinstance(token, _Mark) and token.role == "close":
                stack.pop()
        return None

    def _begin_after(self, number: int, index: int) -> None:
        """Pair ``number``'s opening tag moved past ``tokens[index]`` (with its source text
        when no text is left for it), nested again."""
        self.tokens.insert(index + 1, _Mark("open", number))
        self.tokens.remove(_Mark("open", number))
        opened, closed = self._pairs()[number]
        if not self._has_text(opened + 1, closed):
            a, b = self.markup.spans[number - 1]
            self.tokens.insert(opened + 1, self.markup.plain[a:b].strip())
            self.tokens.insert(opened, " ")
        self._nest()

    def _has_text(self, start: int, end: int) -> bool:
        return any(map(_is_text, self.tokens[start:end]))

    def _append(self, numbers: list[int]) -> None:
        """Lost tags past the budget: at the end, each pair around its source text."""
        if not numbers:
            return
        self.tokens = [t for t in self.tokens if not (isinstance(t, _Mark) and t.role[0] == "h")]
        for number in numbers:
            if self.markup.closes[number - 1]:
                a, b = self.markup.spans[number - 1]
                text = self.markup.plain[a:b].strip()
                self.tokens += [" ", _Mark("open", number), text, _Mark("close", number)]
            else:
                self.tokens += [" ", _Mark("unit", number)]

    def _pairs(self) -> dict[int, tuple[int, int]]:
        """Each whole pair's open and close index."""
        opened: dict[int, int] = {}
        pairs = {}
        for index, token in enumerate(self.tokens):
            if isinstance(token, _Mark) and token.role == "open":
                opened[token.number] = index
            elif isinstance(token, _Mark) and token.role == "close":
                pairs[token.number] = (opened[token.number], index)
        return pairs

    def _scope(self, number: int) -> tuple[int, int]:
        """The token range to place tag ``number`` in: its parent's content, or everything."""
        parent = self.markup.parents[number - 1]
        pairs = self._pairs()
        if parent in pairs:
            return pairs[parent][0] + 1, pairs[parent][1]
        return 0, len(self.tokens)

    def _place(self, number: int) -> None:
        """Lost pair ``number`` put back (the class's docstring says where)."""
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
        self.tokens[last:last] = [_Mark("close", number)]
        self.tokens[first:first] = [_Mark("open", number)]

    def _take_half(self, number: int) -> tuple[str, int] | None:
        """The surviving half of pair ``number`` (its role and plain offset), taken out."""
        offsets = self._offsets()
        for index, token in enumerate(self.tokens):
            if isinstance(token, _Mark) and token.number == number and token.role[0] == "h":
                self.tokens[index] = ""
                return token.role, offsets[index]
        return None

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
            if isinstance(token := self.tokens[index], _Mark)
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
                if isinstance(token, _Mark) and token.number in pairs:
                    opened, closed = pairs[token.number]
                    if opened < first or closed >= last:
                        first, last, changed = min(first, opened), max(last, closed + 1), True
        return first, last

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
        unit: list[_Token] = [" "] * bool(space_before) + [_Mark("unit", number)]
        self.tokens[index:index] = unit + [" "] * bool(space_after)

    def _space_before(self, index: int) -> list[_Token]:
        """A space to insert at ``index`` when the text before it ends in a word or markup."""
        before = next((t for t in reversed(self.tokens[:index]) if t), "")
        if isinstance(before, _Mark):
            return [] if before.role == "open" else [" "]
        return [" "] if before and not before[-1].isspace() else []

    def _trim(self) -> None:
        """Spaces at the inner ends of a pair moved out (``** word **`` is no emphasis),
        unless its source had them."""
        plain, spans = self.markup.plain, self.markup.spans
        index = len(self.tokens) - 1
        while index >= 0:  # openings, innermost first
            token = self.tokens[index]
            if isinstance(token, _Mark) and token.role == "open" and index + 1 < len(self.tokens):
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
            if isinstance(token, _Mark) and token.role == "close" and index > 0:
                a, b = spans[token.number - 1]
                before = self.tokens[index - 1]
                source = plain[a:b]
                if isinstance(before, str) and before[-1:].isspace() and not source[-1:].isspace():
                    stripped = before.rstrip()
                    self.tokens[index - 1] = stripped
                    self.tokens.insert(index + 1, before[len(stripped) :])
            index += 1


def _is_text(token: _Token) -> bool:
    """Whether a token is text (not only spaces) or a stand-in for some."""
    return bool(token.strip()) if isinstance(token, str) else token.role == "unit"


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
