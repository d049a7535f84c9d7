"""XLIFF 1.2 and 2.x (2.0, 2.1, 2.2) files: each source to translate becomes a unit, and the
file comes back with only the spans it changes rewritten (:mod:`.xml_tree` knows every tag's
bytes): the targets written, the states on them (1.2) or their segments (2.x), and the target
language on ``<file>`` (1.2) or ``<xliff>`` (2.x). Every other byte is the source's.

What is translated, as a pre-translating tool leaves a file for its reviewers:

- 1.2: a ``<trans-unit>`` (its ``<seg-source>`` when it has one, whose ``<mrk mtype="seg">``
  come back around their translations) unless it or a group around it says
  ``translate="no"``, it is ``approved="yes"``, or its target has text in any state but
  ``new`` and ``needs-translation`` (an existing translation is the translators' work). The
  target gets ``state="translated"`` and ``state-qualifier="mt-suggestion"`` (XLIFF 1.2,
  section 2.4.6: the qualifier for a target that machine translation suggested).
- 2.x: a ``<segment>`` unless its ``<unit>``, a group or its file says ``translate="no"``, its
  state is ``reviewed`` or ``final``, or its target has text and its state is not an explicit
  ``initial``. The segment gets ``state="translated"``.

Inline codes come back unchanged around the translated words (:class:`.localisation.Codes`):
pairs whose text is translated (1.2 ``g``, ``mrk``, ``bpt``/``ept`` and ``bx``/``ex`` side by
side; 2.x ``pc``, ``mrk``, ``sc``/``ec`` and ``sm``/``em`` side by side) and standalone codes
(``x``, ``ph``, ``it``, ``cp``, an unpaired half, a protected ``mrk``, a ``translate="no"``
marker with its text, any other element).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.localisation import Codes, LocalisationFile, Unit, unused_name
from hymt_serve.request.xml_tree import Node, parse

V1 = ("", "urn:oasis:names:tc:xliff:document:1.1", "urn:oasis:names:tc:xliff:document:1.2")
V2 = ("urn:oasis:names:tc:xliff:document:2.0", "urn:oasis:names:tc:xliff:document:2.2")
XML_LANG = "http://www.w3.org/XML/1998/namespace lang"
_V1_KEEP = ("new", "needs-translation")  # 1.2 states whose target is no translation yet
_V2_LOCKED = ("reviewed", "final")
# Inline elements that wrap translatable text, and the start/end markers that pair up.
_PAIRED = frozenset({"g", "pc", "mrk"})
_MARKERS = {"bpt": "ept", "bx": "ex", "sc": "ec", "sm": "em"}
_ENDS = frozenset(_MARKERS.values())
# One attribute of a start tag (read in order from the tag's name on, so never inside a value).
_ATTRIBUTE = re.compile(r"""\s+([^\s=/>]+)\s*=\s*(?:"[^"]*"|'[^']*')""")


@dataclass
class _Target:
    """Where one unit's translation goes."""

    version: int
    source: Node  # the content translated (a <source> or <seg-source>)
    after: Node  # the element a new target follows
    target: Node | None
    state_on: Node | None  # 2.x: the <segment> whose state is set


def parse_xliff(text: str) -> LocalisationFile:
    """The units of an XLIFF document. Raises InvalidRequest (a malformed document, not XLIFF,
    an XLIFF version not read here)."""
    data = text.encode("utf-8")
    root = parse(data, "XLIFF")
    version = _version(root)
    name = unused_name(text)
    places = list(_places_v1(root) if version == 1 else _places_v2(root))
    codes = [Codes(name) for _ in places]
    units = tuple(
        Unit(_carrier(data, place.source, unit_codes), place.source.line)
        for place, unit_codes in zip(places, codes, strict=True)
    )

    def rebuild(translations: Sequence[str], target: str) -> str:
        edits = _language_edits(data, root, version, target)
        for place, unit_codes, translated in zip(places, codes, translations, strict=True):
            edits += _target_edits(data, place, unit_codes.render(translated, _escape), target)
        return _apply(data, edits).decode("utf-8")

    return LocalisationFile(units, rebuild)


def _version(root: Node) -> int:
    if root.name == "xliff" and root.ns in V1 and root.attrs.get("version", "1.2")[:2] == "1.":
        return 1
    if root.name == "xliff" and root.ns in V2:
        return 2
    found = f"{{{root.ns}}}{root.name}" if root.ns else root.name
    raise InvalidRequest(
        f"the document is not XLIFF 1.2 or 2.x: its root element is {found}",
        allowed=f"<xliff> in one of the namespaces {[n for n in V1 + V2 if n]}",
        field="document",
    )


def _translates(node: Node, inherited: bool) -> bool:
    value = node.attrs.get("translate")
    return inherited if value is None else value != "no"


def _places_v1(root: Node) -> Iterator[_Target]:
    ns = root.ns
    stack = [(node, True) for node in reversed(root.elements(ns, "file"))]
    while stack:  # files, bodies and groups, depth first in document order
        node, translate = stack.pop()
        translate = _translates(node, translate)
        if node.name == "trans-unit":
            if translate and node.attrs.get("approved") != "yes":
                yield from _unit_v1(node)
            continue
        inner = [c for c in node.children if isinstance(c, Node) and c.ns == ns]
        inner = [c for c in inner if c.name in ("body", "group", "trans-unit")]
        stack += [(child, translate) for child in reversed(inner)]


def _unit_v1(unit: Node) -> Iterator[_Target]:
    ns = unit.ns
    source, segmented = unit.child(ns, "source"), unit.child(ns, "seg-source")
    if source is None:
        return
    target = unit.child(ns, "target")
    state = target.attrs.get("state", "translated") if target is not None else "new"
    if target is not None and not target.empty and state not in _V1_KEEP:
        return
    content = segmented or source
    yield _Target(1, content, content, target, None)


def _places_v2(root: Node) -> Iterator[_Target]:
    ns = root.ns
    stack = [(node, True) for node in reversed(root.elements(ns, "file"))]
    while stack:
        node, translate = stack.pop()
        translate = _translates(node, translate)
        if node.name == "unit":
            if translate:
                yield from _unit_v2(node)
            continue
        inner = [c for c in node.children if isinstance(c, Node) and c.ns == ns]
        stack += [(c, translate) for c in reversed(inner) if c.name in ("group", "unit")]


def _unit_v2(unit: Node) -> Iterator[_Target]:
    ns = unit.ns
    for segment in unit.elements(ns, "segment"):
        source, target = segment.child(ns, "source"), segment.child(ns, "target")
        state = segment.attrs.get("state")
        if source is None or state in _V2_LOCKED:
            continue
        if target is not None and not target.empty and state != "initial":
            continue
        yield _Target(2, source, source, target, segment)


# The carrier: a source's content as text with its inline codes as Codes tags.
def _carrier(data: bytes, source: Node, codes: Codes) -> str:
    parts: list[str] = []
    _content(data, source.children, codes, parts)
    return "".join(parts)


def _content(data: bytes, children: list[Node | str], codes: Codes, parts: list[str]) -> None:
    partners = _marker_pairs(children)
    closings: dict[int, str] = {}  # an end marker's index: the tag that closes its pair
    index = 0
    while index < len(children):
        child = children[index]
        mate = partners.get(index)
        index += 1
        if isinstance(child, str):
            parts.append(child)
        elif _opaque(child):  # untranslated, with its text (an sm marker's: to its em)
            through = mate if mate is not None and child.name == "sm" else index - 1
            last = children[through]
            assert isinstance(last, Node)
            parts.append(codes.standalone(_raw(data, child.start[0], last)))
            index = through + 1
        elif child.name in _PAIRED and not child.self_closing:
            opening, closing = codes.pair(_bytes(data, child.start), _bytes(data, child.end))
            parts.append(opening)
            _content(data, child.children, codes, parts)
            parts.append(closing)
        elif mate is not None and mate > index - 1:  # a start marker: its end closes the pair
            end = children[mate]
            assert isinstance(end, Node)
            raw_start, raw_end = _raw(data, child.start[0], child), _raw(data, end.start[0], end)
            opening, closings[mate] = codes.pair(raw_start, raw_end)
            parts.append(opening)
        elif mate is not None:
            parts.append(closings.pop(index - 1))
        else:
            parts.append(codes.standalone(_raw(data, child.start[0], child)))


def _opaque(node: Node) -> bool:
    """A code whose text is not to be translated: a protected 1.2 marker or a 2.x one that
    says translate="no"."""
    if node.name == "mrk" and node.attrs.get("mtype") == "protected":
        return True
    return node.name in ("mrk", "sm") and node.attrs.get("translate") == "no"


def _marker_pairs(children: list[Node | str]) -> dict[int, int]:
    """Start and end markers side by side that pair up, well nested: index to partner's."""
    partners: dict[int, int] = {}
    stack: list[tuple[str, str, int]] = []  # (end marker name, key, index)
    waiting: Counter[tuple[str, str]] = Counter()  # the (end name, key) pairs on the stack
    for index, child in enumerate(children):
        if not isinstance(child, Node):
            continue
        if child.name in _MARKERS:
            key = child.attrs.get("rid") or child.attrs.get("id", "")
            stack.append((_MARKERS[child.name], key, index))
            waiting[(_MARKERS[child.name], key)] += 1
            continue
        if child.name not in _ENDS:
            continue
        attrs = child.attrs
        key = attrs.get("startRef") or attrs.get("rid") or attrs.get("id", "")
        if waiting[(child.name, key)]:
            while True:  # markers left open inside it stay standalone
                name, opened_key, opened = stack.pop()
                waiting[(name, opened_key)] -= 1
                if (name, opened_key) == (child.name, key):
                    break
            partners[opened], partners[index] = index, opened
    return partners


def _bytes(data: bytes, span: tuple[int, int]) -> str:
    return data[span[0] : span[1]].decode("utf-8")


def _raw(data: bytes, begin: int, last: Node) -> str:
    return data[begin : last.end[1]].decode("utf-8")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# Edits: (begin, end, replacement) of the source's bytes, none overlapping.
Edit = tuple[int, int, str]


def _language_edits(data: bytes, root: Node, version: int, target: str) -> list[Edit]:
    if version == 2:
        return [_set_attributes(data, root, {"trgLang": target})]
    return [
        _set_attributes(data, f, {"target-language": target})
        for f in root.elements(root.ns, "file")
    ]


def _target_edits(data: bytes, place: _Target, content: str, language: str) -> list[Edit]:
    edits: list[Edit] = []
    states = {"state": "translated"}
    if place.version == 1:
        states["state-qualifier"] = "mt-suggestion"
    elif place.state_on is not None:
        edits.append(_set_attributes(data, place.state_on, states))
    target = place.target
    if target is None:
        qname = _qname(data, place.source)
        prefix = qname[: qname.rindex(":") + 1] if ":" in qname else ""
        declarations = re.findall(
            r'\sxmlns(?::[^\s=]+)?\s*=\s*(?:"[^"]*"|\'[^\']*\')', _bytes(data, place.source.start)
        )
        attributes = "".join(declarations)
        if place.version == 1:
            attributes += ' state="translated" state-qualifier="mt-suggestion"'
        element = f"<{prefix}target{attributes}>{content}</{prefix}target>"
        return [*edits, (place.after.end[1], place.after.end[1], _indent(data, place) + element)]
    updates = {"xml:lang": language} if XML_LANG in target.attrs else {}
    if place.version == 1:
        updates |= states
    opening = _set_attributes(data, target, updates)
    if target.self_closing:  # <target/>: written out whole
        tag = opening[2].removesuffix("/>").rstrip() + ">"
        return [
            *edits,
            (target.start[0], target.start[1], f"{tag}{content}</{_qname(data, target)}>"),
        ]
    return [*edits, opening, (target.start[1], target.end[0], content)]


def _indent(data: bytes, place: _Target) -> str:
    """The white space before the element a new target follows, to put before the target."""
    begin = place.after.start[0]
    line_start = data.rfind(b"\n", max(0, begin - 256), begin) + 1  # indents are short
    before = data[line_start:begin]
    if before.strip() or not line_start:  # not on a line of its own: no new line either
        return ""
    newline = "\r\n" if data[line_start - 2 : line_start] == b"\r\n" else "\n"
    return newline + before.decode("utf-8")


def _qname(data: bytes, node: Node) -> str:
    match = re.match(rb"<([^\s/>]+)", data[node.start[0] : node.start[1]])
    assert match is not None
    return match[1].decode("utf-8")


def _set_attributes(data: bytes, node: Node, values: dict[str, str]) -> Edit:
    """An edit of ``node``'s start tag giving it ``values`` (replaced where written, added
    before the tag's end otherwise); the rest of the tag stays as it was."""
    tag = _bytes(data, node.start)
    for name, value in values.items():
        written = f' {name}="{_escape(value).replace(chr(34), "&quot;")}"'
        spans = {m[1]: m.span() for m in _ATTRIBUTE.finditer(tag, len(_qname(data, node)) + 1)}
        if name in spans:
            begin, end = spans[name]
            tag = tag[:begin] + written + tag[end:]
        else:
            end_match = re.search(r"\s*/?>$", tag)
            assert end_match is not None
            tag = tag[: end_match.start()] + written + tag[end_match.start() :]
    return node.start[0], node.start[1], tag


def _apply(data: bytes, edits: list[Edit]) -> bytes:
    out: list[bytes] = []
    position = 0
    for begin, end, replacement in sorted(edits, key=lambda edit: (edit[0], edit[1])):
        out += (data[position:begin], replacement.encode("utf-8"))
        position = end
    out.append(data[position:])
    return b"".join(out)
