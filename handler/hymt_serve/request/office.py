"""Office Open XML packages (DOCX, PPTX, XLSX) as localisation-style files: the paragraphs a
reader sees become units (:mod:`.office_text`), and the package comes back with only its
text-bearing parts rewritten and every other member's bytes as they were.

Why not python-docx, python-pptx and openpyxl here: they read a part into lxml and write the
whole part (or, openpyxl, the whole workbook) back from their object model, which re-serialises
everything (attribute order, namespace declarations, white space; openpyxl drops what it does
not model, such as charts' text and unknown extensions). The issue asks for everything outside
the translated text byte-identical, so this reads each text-bearing part with :mod:`.xml_tree`
(expat with byte spans: any DTD refused, depth limited) and rewrites only the paragraphs'
content spans; the libraries build and read the test and benchmark files.

Which parts ([Content_Types].xml names them, so a package whose parts have unusual names is
read as well): DOCX: the main document, headers, footers, footnotes, endnotes and charts (text
boxes are paragraphs inside the document); PPTX: slides, notes slides and charts; XLSX: shared
strings, worksheets' inline strings and charts. Not translated: comments, SmartArt diagrams,
slide layouts and masters, sheet names, formulas, numbers and dates (cells hold no string).

Safety, checked from the zip's central directory before any member is read: at most
:data:`MAX_MEMBERS` members, :data:`MAX_UNCOMPRESSED` bytes uncompressed in all, no member over
:data:`MAX_RATIO` times its compressed size once past :data:`RATIO_FROM` bytes, no encrypted
member, no duplicate name, only stored or deflated members. Reading a member stops at its
declared size (zipfile), and its CRC is checked.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import copy
import io
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.localisation import LocalisationFile, Unit, unused_name
from hymt_serve.request.office_text import DRAWING, SHEET, WORD, Dialect, Paragraph, paragraphs
from hymt_serve.request.xml_tree import parse

OFFICE_FORMATS = ("docx", "pptx", "xlsx")
MAX_MEMBERS = 10_000
MAX_UNCOMPRESSED = 256 * 1_048_576
MAX_RATIO = 200  # text XML compresses 10 to 50 times; bombs a thousand times and more
RATIO_FROM = 1_048_576
_TYPES = "[Content_Types].xml"
_CT = "http://schemas.openxmlformats.org/package/2006/content-types"
_OOXML = "application/vnd.openxmlformats-officedocument."
_DOCX = ("document.main+xml", "header+xml", "footer+xml", "footnotes+xml", "endnotes+xml")
# The content types (their ends) of the parts translated, per format, and their vocabularies.
_BOTH: tuple[Dialect, ...] = (WORD, DRAWING)
PARTS: dict[str, dict[str, tuple[Dialect, ...]]] = {
    "docx": {f"wordprocessingml.{kind}": _BOTH for kind in _DOCX},
    "pptx": {
        "presentationml.slide+xml": (DRAWING,),
        "presentationml.notesSlide+xml": (DRAWING,),
    },
    "xlsx": {
        "spreadsheetml.sharedStrings+xml": (SHEET,),
        "spreadsheetml.worksheet+xml": (SHEET,),
    },
}
# A content type only the format's main part has.
_MAIN = {"docx": "document.main+xml", "pptx": "presentation.main+xml", "xlsx": "sheet.main+xml"}
_NAMES = {"docx": "Word (DOCX)", "pptx": "PowerPoint (PPTX)", "xlsx": "Excel (XLSX)"}
_CHART = "drawingml.chart+xml"


def decode_base64(text: str, kind: str) -> bytes:
    """The bytes a request's base64 ``document`` holds (400 if it is not base64)."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidRequest(
            f"a {kind} document must be the file in base64: {error}",
            allowed="the file's bytes in base64 (RFC 4648, white space ignored)",
            field="document",
        ) from None


def parse_office(text: str, kind: str) -> LocalisationFile:
    """The units of a ``kind`` package sent in base64; the rebuilt file is base64 too.
    Raises InvalidRequest for a file that is not such a package or breaks a limit."""
    data = decode_base64(text, kind)
    package = _open(data, kind)
    infos = package.infolist()
    parts = _text_parts(package, kind)
    contents = {name: package.read(name) for name in parts}
    tag_name = unused_name(" ".join(b.decode("utf-8", "replace") for b in contents.values()))
    read = {name: _Part.read(name, contents[name], parts[name], kind, tag_name) for name in parts}
    units = tuple(
        Unit(paragraph.text, paragraph.line)
        for part in read.values()
        for paragraph in part.paragraphs
    )

    def rebuild(translations: Sequence[str], target: str) -> str:
        given = iter(translations)
        rewritten = {
            name: part.rebuild([next(given) for _ in part.paragraphs])
            for name, part in read.items()
        }
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as writer:
            for info in infos:
                body = rewritten.get(info.filename)
                body = _read(package, info.filename, kind) if body is None else body
                # A copy: writing sets the entry's offset and sizes, and rebuild may run again.
                writer.writestr(copy.copy(info), body)
        return base64.b64encode(out.getvalue()).decode("ascii")

    return LocalisationFile(units, rebuild)


def opening_text(text: str, kind: str, chars: int) -> str:
    """About the first ``chars`` characters a reader sees in a ``kind`` file sent in base64,
    without tags (what its language is detected from)."""
    found, total = [], 0
    for unit in parse_office(text, kind).units:
        found.append(re.sub(r"<[^>]*>", "", unit.text))
        total += len(found[-1])
        if total >= chars:
            break
    return "\n".join(found)[:chars]


def _invalid(kind: str, what: str) -> InvalidRequest:
    return InvalidRequest(
        f"the {kind} file {what}",
        allowed=f"a {_NAMES[kind]} file (Office Open XML), not encrypted, within the limits",
        field="document",
    )


def _open(data: bytes, kind: str) -> zipfile.ZipFile:
    """The package, its central directory checked against the limits."""
    try:
        package = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as error:
        raise _invalid(
            kind, f"is not a ZIP package ({error}; a password-protected Office file is not one)"
        ) from None
    infos = package.infolist()
    if len(infos) > MAX_MEMBERS:
        raise _invalid(kind, f"has {len(infos)} members, over {MAX_MEMBERS}")
    total = sum(info.file_size for info in infos)
    if total > MAX_UNCOMPRESSED:
        raise _invalid(kind, f"unpacks to {total} bytes, over {MAX_UNCOMPRESSED}")
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise _invalid(kind, "holds two members of one name")
    for info in infos:
        if info.flag_bits & 1:
            raise _invalid(kind, f"has an encrypted member: {info.filename}")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _invalid(kind, f"has a member compressed in an unknown way: {info.filename}")
        ratio = info.file_size / max(1, info.compress_size)
        if info.file_size > RATIO_FROM and ratio > MAX_RATIO:
            raise _invalid(kind, f"member {info.filename} expands {ratio:.0f} times (a zip bomb?)")
    if _TYPES not in names:
        raise _invalid(kind, f"has no {_TYPES}: it is not an Office Open XML package")
    return package


def _read(package: zipfile.ZipFile, name: str, kind: str) -> bytes:
    try:
        return package.read(name)
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        raise _invalid(kind, f"has a damaged member {name}: {error}") from None


def _text_parts(package: zipfile.ZipFile, kind: str) -> dict[str, tuple[Dialect, ...]]:
    """The members to translate and their vocabularies, in the package's order."""
    types = parse(_read(package, _TYPES, kind), f"{kind} {_TYPES}")
    wanted = PARTS[kind] | {_CHART: (DRAWING,)}
    chosen: dict[str, tuple[Dialect, ...]] = {}
    for override in types.elements(_CT, "Override"):
        name = override.attrs.get("PartName", "").lstrip("/")
        content_type = override.attrs.get("ContentType", "")
        for end, dialects in wanted.items():
            if content_type.endswith(end) and content_type.startswith(_OOXML[:16]):
                chosen[name] = dialects
    content = " ".join(o.attrs.get("ContentType", "") for o in types.elements(_CT, "Override"))
    if _MAIN[kind] not in content:
        raise _invalid(kind, f"has no {_MAIN[kind]} part: is it a {_NAMES[kind]} file?")
    order = [info.filename for info in package.infolist() if info.filename in chosen]
    return {name: chosen[name] for name in order}


@dataclass
class _Part:
    """One text-bearing member: its bytes and its paragraphs that hold text, in order."""

    data: bytes
    paragraphs: list[Paragraph]

    @classmethod
    def read(
        cls, name: str, data: bytes, dialects: tuple[Dialect, ...], kind: str, tag_name: str
    ) -> _Part:
        if kind == "xlsx" and "worksheet" in name and b"inlineStr" not in data:
            return cls(data, [])  # a sheet without inline strings: nothing to read
        root = parse(data, f"{kind.upper()} part {name}")
        found: list[Paragraph] = []
        for dialect in dialects:
            for node in paragraphs(root, dialect):
                paragraph = Paragraph(data, node, dialect, tag_name)
                if paragraph.has_text:
                    found.append(paragraph)
        found.sort(key=lambda p: p.span[0])
        return cls(data, found)

    def rebuild(self, translations: list[str]) -> bytes:
        return _Rebuild(self.data, self.paragraphs, translations).span(0, len(self.data))


class _Rebuild:
    """A part's bytes with each paragraph's content rewritten, paragraphs inside another's
    codes (a text box's) rewritten first."""

    def __init__(self, data: bytes, found: list[Paragraph], texts: list[str]) -> None:
        self.data, self.found, self.texts = data, found, texts
        self.begins = [p.span[0] for p in found]
        self.done: dict[int, bytes] = {}

    def span(self, begin: int, end: int) -> bytes:
        out: list[bytes] = []
        position = begin
        index = bisect.bisect_left(self.begins, begin)
        while index < len(self.found) and self.found[index].span[0] < end:
            paragraph = self.found[index]
            index += 1
            if (
                paragraph.span[0] < position
                or paragraph.span == (begin, end)
                or paragraph.span[1] > end
            ):
                # inside one rewritten already, or the paragraph asking for its own bytes or
                # for a code of its own (one at its very start begins where it does)
                continue
            out += (self.data[position : paragraph.span[0]], self._render(index - 1))
            position = paragraph.span[1]
        out.append(self.data[position:end])
        return b"".join(out)

    def _render(self, index: int) -> bytes:
        if index not in self.done:
            self.done[index] = self.found[index].render(self.texts[index], self.span)
        return self.done[index]
