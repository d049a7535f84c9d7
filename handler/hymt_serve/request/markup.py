"""Formatted text for HY-MT1.5's ``<sN>`` tags: inline Markdown or HTML markup becomes numbered
tags for the model and comes back as the same markup; the ``<target>`` wrapper the formatted
template asks for is removed.

Each piece of markup that wraps text (``**bold**``, ``[a link](url)``, ``<b>…</b>``; Markdown
may hold HTML too) becomes
``<sN>text</sN>``: the model translates the text and keeps the tags where the translated words
go, and the original opening and closing markup replaces them. Markup with no text of its own
to translate (inline code, an autolink, a bare URL or e-mail address, ``<br>``, ``<img>``, an
HTML comment, a ``<code>``/``<pre>``/``<script>``/``<style>`` element with its content, an
unpaired tag) becomes an empty ``<sN></sN>`` that stands for the original text, untranslated.
:func:`restore` counts the tags the model lost (or kept only half of); with ``keep_lost`` (every
reply, text or document) they are put back: the output is repaired so that every tag comes back
once, well nested, around the best span it can find (:mod:`hymt_serve.request.markup_repair`).

Inline markup only: block structure (headings, lists, tables) is the documents feature's job.
"""

from __future__ import annotations

import re

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.markup_repair import repair
from hymt_serve.request.markup_tokens import BARE_URL, EMAIL, TAG, Markup, tag_number

__all__ = ["EMAIL", "TAG", "Markup", "restore", "to_tags", "unwrap_target"]

_LINKS = (
    r"(?P<autolink><(?:https?|mailto|ftp):[^\s<>]+>)"
    rf"|(?P<url>{BARE_URL.pattern})"
)
_URLS = re.compile(_LINKS + "|" + EMAIL.pattern)
_MD = re.compile(
    r"(?P<code>(?P<ticks>`+)(?!`).+?(?<!`)(?P=ticks)(?!`))|"
    + _LINKS
    + r"|(?P<link>!?\[(?P<label>[^\[\]]+)\](?P<dest>\([^()\s]*(?:\s+\"[^\"]*\")?\)))"
    r"|(?P<strong>(?P<sm>\*\*|__|~~)(?=\S)(?P<sinner>.+?)(?<=\S)(?P=sm))"
    r"|(?P<em>(?<![*\w])(?P<em_m>[*_])(?![*_\s])(?P<einner>.+?)(?<![\s*_])(?P=em_m)(?![*\w]))",
    re.DOTALL,
)
_HTML_TOKEN = re.compile(
    r"<!--.*?-->|<(?P<close>/)?(?P<name>[A-Za-z][A-Za-z0-9-]*)(?:\s[^<>]*?)?(?P<self>/)?>",
    re.DOTALL,
)
# Elements that never close, and elements whose content is not prose.
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta"})
_VOID |= {"source", "track", "wbr"}
_OPAQUE = frozenset({"code", "pre", "script", "style", "kbd", "samp", "var", "math", "svg"})


def to_tags(text: str, kind: str, *, tags_in_text: bool = False) -> tuple[str, Markup]:
    """``text`` with its ``kind`` ("markdown" or "html") inline markup as ``<sN>`` tags; kind
    "text" (plain text) stands in for its URLs only. ``<sN>`` tags already in the text are a
    400, or with ``tags_in_text`` (a document that writes about them) stand-ins of their own."""
    if TAG.search(text) and not tags_in_text:
        raise InvalidRequest(
            f"the text already holds <sN> tags; send it with preserve_format 'tags', not {kind!r}",
            allowed="tags, or markup without <sN> tags",
            field="preserve_format",
        )
    builder = _Builder()
    convert = {"text": builder.urls, "markdown": builder.markdown}.get(kind, builder.html)
    parts: list[str] = []
    position = 0
    for match in TAG.finditer(text):
        parts += (convert(text[position : match.start()]), builder._stand_in(match[0]))
        position = match.end()
    parts.append(convert(text[position:]))
    tagged = "".join(parts)
    return tagged, Markup(tuple(builder.opens), tuple(builder.closes), *_layout(tagged))


def _layout(tagged: str) -> tuple[str, tuple[tuple[int, int], ...], tuple[int, ...]]:
    """``tagged`` (well nested, as the builder makes it) without its tags, each tag's span in
    that text and the tag it sits in."""
    plain: list[str] = []
    spans: dict[int, tuple[int, int]] = {}
    parents: dict[int, int] = {}
    stack: list[int] = []
    offset = position = 0
    for match in TAG.finditer(tagged):
        plain.append(tagged[position : match.start()])
        offset += match.start() - position
        position = match.end()
        number = int(match[2])
        if not match[1]:
            parents[number] = stack[-1] if stack else 0
            spans[number] = (offset, offset)
            stack.append(number)
        elif stack and stack[-1] == number:
            stack.pop()
            spans[number] = (spans[number][0], offset)
    plain.append(tagged[position:])
    numbers = sorted(spans)
    return "".join(plain), tuple(spans[n] for n in numbers), tuple(parents[n] for n in numbers)


class _Builder:
    def __init__(self) -> None:
        self.opens: list[str] = []
        self.closes: list[str] = []

    def _tag(self, opening: str, closing: str) -> int:
        self.opens.append(opening)
        self.closes.append(closing)
        return len(self.opens)

    def _stand_in(self, original: str) -> str:
        number = self._tag(original, "")
        return f"<s{number}></s{number}>"

    def _wrap(self, opening: str, inner: str, closing: str) -> str:
        number = self._tag(opening, closing)
        return f"<s{number}>{inner}</s{number}>"

    def urls(self, text: str) -> str:
        return _URLS.sub(lambda match: self._stand_in(match[0]), text)

    def markdown(self, text: str) -> str:
        parts, position = [], 0
        for match in _MD.finditer(text):
            parts.append(self.html(text[position : match.start()]))  # inline HTML
            position = match.end()
            whole = match.group(0)
            if match["code"] or match["autolink"] or match["url"]:
                parts.append(self._stand_in(whole))
            elif match["link"]:
                opening = whole[: whole.index("[") + 1]
                number = self._tag(opening, "]" + match["dest"])
                parts.append(f"<s{number}>{self.markdown(match['label'])}</s{number}>")
            else:
                marker = match["sm"] or match["em_m"]
                inner = match["sinner"] if match["sm"] else match["einner"]
                number = self._tag(marker, marker)
                parts.append(f"<s{number}>{self.markdown(inner)}</s{number}>")
        parts.append(self.html(text[position:]))
        return "".join(parts)

    def html(self, text: str) -> str:
        tokens = list(_HTML_TOKEN.finditer(text))
        partner = _pair_elements(tokens)
        parts, position, index = [], 0, 0
        pending: list[int] = []  # tag numbers of the open pairs, innermost last
        while index < len(tokens):
            token = tokens[index]
            parts.append(self.urls(text[position : token.start()]))
            position = token.end()
            name = (token["name"] or "").lower()
            mate = partner.get(index)
            if mate is not None and token["close"] is None and name in _OPAQUE:
                position = tokens[mate].end()
                parts.append(self._stand_in(text[token.start() : position]))
                index = mate + 1
                continue
            if mate is None:
                parts.append(self._stand_in(token.group(0)))
            elif token["close"] is None:
                number = self._tag(token.group(0), tokens[mate].group(0))
                pending.append(number)
                parts.append(f"<s{number}>")
            else:
                parts.append(f"</s{pending.pop()}>")
            index += 1
        parts.append(self.urls(text[position:]))
        return "".join(parts)


def _pair_elements(tokens: list[re.Match[str]]) -> dict[int, int]:
    """Token index to its partner's, for opening and closing tags that pair up properly."""
    partner: dict[int, int] = {}
    stack: list[tuple[str, int]] = []
    for index, token in enumerate(tokens):
        name = (token["name"] or "").lower()
        if not name or token["self"] or name in _VOID:
            continue
        if token["close"] is None:
            stack.append((name, index))
        elif stack and stack[-1][0] == name:
            _, opened = stack.pop()
            partner[opened], partner[index] = index, opened
        elif any(open_name == name for open_name, _ in stack):
            while stack[-1][0] != name:  # elements left open inside it stay unpaired
                stack.pop()
            _, opened = stack.pop()
            partner[opened], partner[index] = index, opened
    return partner


def restore(output: str, markup: Markup, *, keep_lost: bool = False) -> tuple[str, int]:
    """The model's ``output`` with its ``<sN>`` tags turned back into markup, and how many of
    the source's tags did not come back whole. Without ``keep_lost`` a lost tag's text stays
    plain (a stand-in's original text is missing) and tags the source did not have are
    dropped; with it (documents) nothing is lost: :func:`.markup_repair.repair` puts every tag
    back."""
    count = len(markup.opens)
    found = [(bool(m[1]), tag_number(m)) for m in TAG.finditer(output)]
    seen_open = {n for closing, n in found if not closing}
    seen_close = {n for closing, n in found if closing}
    whole = {
        n
        for n in range(1, count + 1)
        if n in seen_open and (n in seen_close or not markup.closes[n - 1])
    }
    if keep_lost:
        return repair(output, markup), count - len(whole)

    def replace(match: re.Match[str]) -> str:
        number = tag_number(match)
        if number not in whole:
            return ""
        return markup.closes[number - 1] if match[1] else markup.opens[number - 1]

    return TAG.sub(replace, output), count - len(whole)


def unwrap_target(output: str) -> str:
    """The text inside the ``<target>…</target>`` wrapper the formatted template asks for (the
    output as it is when the model left the wrapper out)."""
    stripped = output.strip()
    if stripped.startswith("<target>"):
        stripped = stripped[len("<target>") :]
        end = stripped.rfind("</target>")
        return stripped[:end] if end >= 0 else stripped
    return stripped[: -len("</target>")] if stripped.endswith("</target>") else output
