"""A small XML tree with the byte span of every tag, read safely, for files whose bytes outside
the translated text must come back unchanged (XLIFF: :mod:`.localisation_xliff` rewrites only
the spans it changes).

Read by the standard library's expat (2.4 and later limit entity amplification themselves), with
every DTD refused outright: a ``<!DOCTYPE`` is a 400 before any declaration in it is read, so
there are no entities to expand (billion laughs) and no external ones to fetch; defusedxml
would set these same expat handlers, and its DTD-allowing default is weaker than this. The
document's depth is checked while it is read (:data:`MAX_DEPTH`); its size is checked by the
caller before. A malformed document is a 400 naming its line and column.
"""

from __future__ import annotations

import xml.parsers.expat
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hymt_serve.request.errors import InvalidRequest

MAX_DEPTH = 64  # XLIFF nests a few levels (groups, inline codes); 64 leaves room and no more


@dataclass
class Node:
    """An element: ``ns`` and ``name`` (its namespace and local name), its attributes by
    expanded name (``"uri local"`` for a namespaced one), the byte spans of its start tag and
    end tag in the document's UTF-8 (an empty element's end span is empty, at its start tag's
    end), the line it starts on, and its content: text (entities read) and elements, in order."""

    ns: str
    name: str
    attrs: dict[str, str]
    start: tuple[int, int]
    line: int
    end: tuple[int, int] = (0, 0)
    children: list[Node | str] = field(default_factory=list)

    def elements(self, ns: str, name: str) -> list[Node]:
        return [c for c in self.children if isinstance(c, Node) and (c.ns, c.name) == (ns, name)]

    def child(self, ns: str, name: str) -> Node | None:
        found = self.elements(ns, name)
        return found[0] if found else None

    @property
    def self_closing(self) -> bool:
        """Whether it is written as one tag (``<x/>``)."""
        return self.end[0] == self.end[1]

    @property
    def empty(self) -> bool:
        """Whether it holds no element and no text but white space."""
        return all(isinstance(c, str) and not c.strip() for c in self.children)


def parse(data: bytes, kind: str) -> Node:
    """The root element of ``data`` (UTF-8, whatever its declaration says). Raises
    InvalidRequest naming the line for a malformed document, a DTD or one nested too deeply;
    ``kind`` names the format in the messages."""
    reader = _Reader(data, kind)
    parser = xml.parsers.expat.ParserCreate(encoding="UTF-8", namespace_separator=" ")
    parser.buffer_text = True
    parser.ordered_attributes = False
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    parser.CharacterDataHandler = reader.text
    parser.StartDoctypeDeclHandler = reader.refuse_dtd
    parser.EntityDeclHandler = reader.refuse_dtd
    parser.ExternalEntityRefHandler = reader.refuse_dtd
    reader.parser = parser
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as error:
        message = xml.parsers.expat.ErrorString(error.code)
        raise reader.error(f"{message}", error.lineno, error.offset + 1) from None
    assert reader.root is not None  # expat refuses a document without a root element
    return reader.root


class _Reader:
    """The expat handlers: elements become nodes, spans come from the parser's byte index."""

    def __init__(self, data: bytes, kind: str) -> None:
        self.data, self.kind = data, kind
        self.parser: Any = None
        self.root: Node | None = None
        self.stack: list[Node] = []

    def start(self, name: str, attrs: dict[str, str]) -> None:
        if len(self.stack) >= MAX_DEPTH:
            line, column = self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1
            raise self.error(f"elements nest deeper than {MAX_DEPTH} levels", line, column)
        ns, _, local = name.rpartition(" ")
        begin = self.parser.CurrentByteIndex
        node = Node(ns, local, attrs, (begin, _tag_end(self.data, begin)), self._line())
        if self.data[node.start[1] - 2 : node.start[1]] == b"/>":
            node.end = (node.start[1], node.start[1])
        if self.stack:
            self.stack[-1].children.append(node)
        else:
            self.root = node
        self.stack.append(node)

    def end(self, name: str) -> None:
        node = self.stack.pop()
        if node.end == (0, 0):  # not an empty element: its end tag is at the parser
            begin = self.parser.CurrentByteIndex
            node.end = (begin, self.data.index(b">", begin) + 1)

    def text(self, data: str) -> None:
        if self.stack:
            self.stack[-1].children.append(data)

    def refuse_dtd(self, *_: Any) -> NoReturn:
        raise self.error(
            "a DTD (<!DOCTYPE ...>) or entity declaration is not accepted",
            self.parser.CurrentLineNumber,
            self.parser.CurrentColumnNumber + 1,
        )

    def _line(self) -> int:
        return int(self.parser.CurrentLineNumber)

    def error(self, message: str, line: int, column: int) -> InvalidRequest:
        return InvalidRequest(
            f"the {self.kind} document is malformed: line {line}, column {column}: {message}",
            allowed=f"a well-formed {self.kind} document in UTF-8 without a DTD",
            field="document",
        )


def _tag_end(data: bytes, begin: int) -> int:
    """The offset past the ``>`` that ends the tag starting at ``begin`` (a ``>`` inside a
    quoted attribute value does not end it). Expat has read the tag: it is well formed."""
    quote = 0
    for index in range(begin + 1, len(data)):
        byte = data[index]
        if quote:
            quote = 0 if byte == quote else quote
        elif byte in b"\"'":
            quote = byte
        elif byte == 0x3E:  # ">"
            return index + 1
    raise AssertionError("expat reported a start tag that does not end")
