"""The paragraphs of an Office XML part (WordprocessingML, DrawingML, SpreadsheetML strings) as
units to translate, and each paragraph written back around its translation.

A paragraph's runs become tags across its text, as an HTML paragraph's inline elements do: a
run whose formatting differs from the paragraph's commonest (bold, a hyperlink's style, a
font) is a pair of tags around its text, a container around runs (a Word hyperlink, an
insertion, a content control) a pair around theirs, and everything else inside the paragraph
(a tab, a break, an image, a footnote reference, a field code, a bookmark, a comment's anchor)
a standalone tag. Runs of the commonest formatting carry their text untagged, so that a
paragraph in one style reaches the model as plain text.

Writing back (:meth:`Paragraph.render`) rebuilds the paragraph's content from its own bytes:
each piece of text goes into a copy of the run it was tagged with (its start tag and
properties byte for byte), consecutive text of one run goes back into that run, and every
standalone code is its source bytes. Each code comes back once and well nested whatever the
translation does with its tags (repeated: dropped; lost: put at the end; text outside every
tag: into the untagged runs in order), and no run ever holds anything but its own children,
so the result is always well-formed. A translation that keeps every tag in place gives back
the source's elements exactly, with only the text inside ``<w:t>``/``<a:t>``/``<t>`` changed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hymt_serve.request.xml_tree import Node

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"


@dataclass(frozen=True)
class Dialect:
    """What a paragraph, a run, its text and its properties are called in one vocabulary;
    ``containers`` maps an element holding runs to the child its runs are in (itself: "")."""

    ns: str
    paragraphs: frozenset[str]
    run: str
    properties: frozenset[str]
    containers: dict[str, str] = field(default_factory=dict)
    preserve_space: bool = True  # whether <t> needs xml:space="preserve" to keep end spaces


WORD = Dialect(
    W,
    frozenset({"p"}),
    "r",
    frozenset({"pPr", "rPr", "sdtPr", "sdtEndPr", "smartTagPr", "customXmlPr"}),
    {"hyperlink": "", "ins": "", "moveTo": "", "smartTag": "", "customXml": "", "dir": ""}
    | {"bdo": "", "fldSimple": "", "sdt": "sdtContent"},
)
DRAWING = Dialect(A, frozenset({"p"}), "r", frozenset({"pPr", "rPr", "endParaRPr"}), {}, False)
SHEET = Dialect(S, frozenset({"si", "is"}), "r", frozenset({"rPr"}))

Span = tuple[int, int]
# Bytes of a span of the part with the paragraphs inside it already rewritten.
SpanBytes = Callable[[int, int], bytes]


@dataclass(frozen=True)
class _Run:
    """A run as written: the bytes before it, its opening (start tag and properties) and its
    closing bytes (a SpreadsheetML <t> straight in its <si> is a run of empty shell)."""

    lead: Span
    opening: Span
    closing: Span


@dataclass
class _Code:
    """A tag of the unit: a run's text (``piece``: ``span`` its <t> start tag, ``closing`` its
    end tag), a child of a run that is not text (``inner``), a container (``span`` its
    opening, ``closing`` its closing bytes) or anything else in the paragraph (``raw``)."""

    kind: str
    lead: Span  # the bytes (white space) before it in the source
    span: Span
    run: _Run | None = None
    closing: Span = (0, 0)
    first_piece: _Code | None = None  # a container's: where text outside its runs goes


class Paragraph:
    """One paragraph: its unit text (:attr:`text`, codes as ``<name n="k">`` tags) and the
    span of content (after its properties) that :meth:`render` rewrites."""

    def __init__(self, data: bytes, node: Node, dialect: Dialect, tag_name: str) -> None:
        self.data, self.dialect, self.tag_name = data, dialect, tag_name
        self.line = node.line
        self.codes: list[_Code] = []
        self.plain: list[_Code] = []  # pieces of the commonest formatting, untagged, in order
        self._tag = re.compile(rf'<(/?){re.escape(tag_name)}(?: n="(\d+)")?(/?)>')
        content = _elements(node)
        heads, tails = _leading(content, dialect), _leading(content[::-1], dialect)
        body = content[heads : len(content) - tails]
        begin = content[heads - 1].end[1] if heads else node.start[1]
        end = content[len(content) - tails].start[0] if tails else node.end[0]
        self.span: Span = (begin, end)
        self._default = _commonest(data, body, dialect)
        self._after_plain = False
        parts: list[str] = []
        self.tail: Span = (self._walk(body, begin, parts, top=True), end)
        self.text = "".join(parts)
        self.has_text = bool(self.plain) or any(c.kind == "piece" for c in self.codes)

    def _walk(self, nodes: list[Node], position: int, parts: list[str], top: bool) -> int:
        """Appends ``nodes``' unit text to ``parts``; returns the offset after the last."""
        for node in nodes:
            lead = (position, node.start[0])
            position = node.end[1]
            after_plain, self._after_plain = self._after_plain, False
            if node.ns == self.dialect.ns and node.name in (self.dialect.run, "t"):
                self._run(node, lead, parts, top and not after_plain)
            elif node.ns == self.dialect.ns and node.name in self.dialect.containers:
                self._container(node, lead, parts)
            else:
                parts.append(self._standalone(_Code("raw", lead, (node.start[0], position))))
        return position

    def _run(self, run: Node, lead: Span, parts: list[str], top: bool) -> None:
        if run.name == "t":  # SpreadsheetML's unformatted string: a <t> alone
            children, opening = [run], (run.start[0], run.start[0])
        else:
            children = _elements(run)
            heads = _leading(children, self.dialect)
            opening = (run.start[0], children[heads - 1].end[1] if heads else run.start[1])
            children = children[heads:]
        if not any(self._is_text(c) for c in children):
            parts.append(self._standalone(_Code("raw", lead, (run.start[0], run.end[1]))))
            return
        closing = (children[-1].end[1], run.end[1])
        shell = _Run(lead, opening, closing)
        plain = top and len(children) == 1 and self._properties(run) == self._default
        position = opening[1]
        for child in children:
            child_lead = (position, child.start[0])
            position = child.end[1]
            if not self._is_text(child):
                code = _Code("inner", child_lead, (child.start[0], child.end[1]), shell)
                parts.append(self._standalone(code))
                continue
            code = _Code("piece", child_lead, child.start, shell, child.end)
            words = "".join(c for c in child.children if isinstance(c, str))
            if plain:
                self._after_plain = True  # a plain run right after it is tagged: kept apart
                self.plain.append(code)
                parts.append(words)
            else:
                self.codes.append(code)
                parts += (self._open(len(self.codes)), words, f"</{self.tag_name}>")

    def _container(self, node: Node, lead: Span, parts: list[str]) -> None:
        holder = node
        if self.dialect.containers[node.name]:
            holder = node.child(self.dialect.ns, self.dialect.containers[node.name]) or node
        children = _elements(holder) if holder is not node or node.name != "sdt" else []
        heads = _leading(children, self.dialect)
        content = children[heads:]
        whole = _Code("raw", lead, (node.start[0], node.end[1]))
        if not content or holder.self_closing:
            parts.append(self._standalone(whole))
            return
        opening_end = children[heads - 1].end[1] if heads else holder.start[1]
        code = _Code("container", lead, (node.start[0], opening_end))
        code.closing = (content[-1].end[1], node.end[1])
        self.codes.append(code)
        number = len(self.codes)
        inner: list[str] = []
        self._walk(content, opening_end, inner, top=False)
        pieces = [c for c in self.codes[number:] if c.kind == "piece"]
        if not pieces:  # nothing to translate inside: the container is one standalone code
            del self.codes[number - 1 :]
            parts.append(self._standalone(whole))
            return
        code.first_piece = pieces[0]
        parts += (self._open(number), *inner, f"</{self.tag_name}>")

    def _is_text(self, node: Node) -> bool:
        return (node.ns, node.name) == (self.dialect.ns, "t") and not node.self_closing

    def _properties(self, run: Node) -> bytes:
        return _run_properties(self.data, run, self.dialect)

    def _open(self, number: int) -> str:
        return f'<{self.tag_name} n="{number}">'

    def _standalone(self, code: _Code) -> str:
        self.codes.append(code)
        return f'<{self.tag_name} n="{len(self.codes)}"/>'

    def render(self, translated: str, span_bytes: SpanBytes) -> bytes:
        """The paragraph's content (its :attr:`span`) with ``translated`` in place (tags as in
        :attr:`text`); ``span_bytes`` gives raw codes with the paragraphs inside them (a text
        box's) rewritten. The source's own text gives its own bytes back (nothing to translate,
        or runs of one formatting side by side that a translation would merge)."""
        if translated == self.text:
            return span_bytes(self.span[0], self.tail[1])
        out = _Writer(self.data, span_bytes, self.dialect.preserve_space)
        stack: list[int] = []
        seen: set[int] = set()
        plain_used = 0
        position = 0
        for match in [*self._tag.finditer(translated), None]:
            chunk = translated[position : match.start() if match else len(translated)]
            if chunk:
                piece = self._home(stack, plain_used)
                plain_used += not stack
                out.text(piece, chunk)
            if match is None:
                break
            position = match.end()
            if match[1]:  # a closing tag closes the innermost open pair
                if stack:
                    self._close(out, stack.pop())
                continue
            number = int(match[2] or 0)
            if not 0 < number <= len(self.codes) or number in seen:
                continue
            seen.add(number)
            code = self.codes[number - 1]
            if code.kind in ("raw", "inner"):
                out.standalone(code)
                continue
            if code.kind == "container":
                out.raw(code.lead, code.span)
            stack.append(number)
            if match[3]:  # a pair written as one tag: empty
                self._close(out, stack.pop())
        for number in reversed(stack):
            self._close(out, number)
        for number in range(1, len(self.codes) + 1):  # codes the translation lost
            if number not in seen:
                self._lost(out, self.codes[number - 1])
        out.flush()
        out.parts.append(self.data[self.tail[0] : self.tail[1]])
        return b"".join(out.parts)

    def _home(self, stack: list[int], plain_used: int) -> _Code:
        """The piece whose run takes text written with ``stack`` open."""
        if stack:
            code = self.codes[stack[-1] - 1]
            return code if code.kind == "piece" else code.first_piece  # type: ignore[return-value]
        if self.plain:
            return self.plain[min(plain_used, len(self.plain) - 1)]
        return next(c for c in self.codes if c.kind == "piece")

    def _close(self, out: _Writer, number: int) -> None:
        code = self.codes[number - 1]
        if code.kind == "container":
            out.raw((0, 0), code.closing)

    def _lost(self, out: _Writer, code: _Code) -> None:
        if code.kind == "container":
            out.raw(code.lead, code.span)
            out.raw((0, 0), code.closing)
        elif code.kind == "piece":
            out.text(code, "")
        else:
            out.standalone(code)


class _Writer:
    """Collects a paragraph's bytes; consecutive pieces of one run share that run's element,
    and consecutive text of one piece its <t>."""

    def __init__(self, data: bytes, span_bytes: SpanBytes, preserve: bool) -> None:
        self.data, self.span_bytes, self.preserve = data, span_bytes, preserve
        self.parts: list[bytes] = []
        self._run: _Run | None = None
        self._inner: list[tuple[_Code, list[str] | None]] = []  # (code, text of a piece)

    def text(self, piece: _Code, text: str) -> None:
        self._enter(piece.run)
        last = self._inner[-1] if self._inner else None
        if last is not None and last[0] is piece and last[1] is not None:
            last[1].append(text)
        else:
            self._inner.append((piece, [text]))

    def standalone(self, code: _Code) -> None:
        if code.kind == "inner":
            self._enter(code.run)
            self._inner.append((code, None))
        else:
            self.raw(code.lead, code.span)

    def raw(self, lead: Span, span: Span) -> None:
        self.flush()
        self.parts += (self.data[lead[0] : lead[1]], self.span_bytes(*span))

    def _enter(self, run: _Run | None) -> None:
        if run is not self._run:
            self.flush()
            self._run = run

    def flush(self) -> None:
        run = self._run
        if run is None:
            return
        get = self.data.__getitem__
        self.parts += (get(slice(*run.lead)), get(slice(*run.opening)))
        for code, words in self._inner:
            self.parts.append(get(slice(*code.lead)))
            if words is None:
                self.parts.append(self.span_bytes(*code.span))
                continue
            text = "".join(words)
            tag = get(slice(*code.span))
            if self.preserve and text != text.strip() and b"xml:space" not in tag:
                tag = tag[:-1] + b' xml:space="preserve">'
            self.parts += (tag, _escape(text).encode("utf-8"), get(slice(*code.closing)))
        self.parts.append(get(slice(*run.closing)))
        self._run, self._inner = None, []


def _elements(node: Node) -> list[Node]:
    return [c for c in node.children if isinstance(c, Node)]


def _leading(nodes: list[Node], dialect: Dialect) -> int:
    """How many of ``nodes`` from the first are properties (<w:pPr>, <w:rPr>, ...)."""
    count = 0
    for node in nodes:
        if node.ns != dialect.ns or node.name not in dialect.properties:
            break
        count += 1
    return count


def _run_properties(data: bytes, run: Node, dialect: Dialect) -> bytes:
    if run.name == "t":
        return b""
    found = next((c for c in _elements(run) if c.name in dialect.properties), None)
    return b"" if found is None else data[found.start[0] : found.end[1]]


def _commonest(data: bytes, nodes: list[Node], dialect: Dialect) -> bytes | None:
    """The properties of the runs that hold most of the paragraph's top-level text."""
    weight: Counter[bytes] = Counter()
    for node in nodes:
        if node.ns == dialect.ns and node.name in (dialect.run, "t"):
            texts = [c for c in ([node] if node.name == "t" else _elements(node))]
            for text in texts:
                if (text.ns, text.name) == (dialect.ns, "t"):
                    chars = sum(len(c) for c in text.children if isinstance(c, str))
                    weight[_run_properties(data, node, dialect)] += chars
    return weight.most_common(1)[0][0] if weight else None


def paragraphs(root: Node, dialect: Dialect) -> Iterator[Node]:
    """Every paragraph element under ``root`` in document order (a text box's paragraphs
    inside the paragraph that anchors it come after that one)."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.ns == dialect.ns and node.name in dialect.paragraphs:
            yield node
        stack += reversed(_elements(node))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
