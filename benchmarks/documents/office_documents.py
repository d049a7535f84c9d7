"""The document benchmark's Office files, deterministic for a seed: a DOCX manual (about 280
words a page: headings, paragraphs with bold, italic and hyperlinked runs, bulleted and
numbered lists, tables, PNG figures with captions, footnotes, a header and a footer, a page
break after each page) and a PPTX deck (titles, bullets on two levels, tables, a chart with a
title, speaker notes on every slide).

The text is the Markdown document's (:func:`bench_documents.sentence`'s vocabulary and sentence
lengths) without its Markdown, so the three documents cost the model alike per word.

python-docx writes no footnotes: they are added as Word writes them, a ``word/footnotes.xml``
part (the separator and continuation separator, then one ``w:footnote`` per note) related to the
main document, its content type in ``[Content_Types].xml``, and a ``w:footnoteReference`` run
(superscript) where each note is cited.

Also here: what the benchmark checks in a translated package (it opens with python-docx or
python-pptx, and every member outside the translated parts, images included, comes back
byte-identical).
"""

from __future__ import annotations

import io
import random
import re
import struct
import zipfile
import zlib
from typing import Any

import docx
import pptx
from docx.document import Document as WordDocument
from docx.enum.text import WD_BREAK
from docx.opc.constants import RELATIONSHIP_TYPE as RT
from docx.opc.packuri import PackURI
from docx.opc.part import Part
from docx.oxml import OxmlElement, parse_xml
from docx.oxml.ns import nsdecls, qn
from docx.shared import Inches, Pt
from docx.text.paragraph import Paragraph
from lxml import etree
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE
from pptx.slide import Slide
from pptx.util import Inches as SlideInches

WORDS = (  # noqa: SIM905 (the vocabulary of every document the benchmark builds)
    "the server model request batch token engine worker queue memory document segment page "
    "language translation sentence paragraph result answer user client system time second "
    "step speed limit number value field name file folder format table list code example "
    "reply error status health metric graph kernel layer weight cache prompt template output "
    "input text word line block heading link image release version update change feature "
    "test check run start stop load save read write send wait keep make take give show find "
    "use need want know think see come go get put set turn move hold bring begin end build "
    "quick slow large small long short early late new old good best first last next every "
    "each many few most some all other same different simple clear real whole open careful"
).split()
HYPERLINK = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink"
FOOTNOTES_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.footnotes+xml"
# The parts the handler rewrites (their content types end so); every other member must come back
# byte-identical.
TEXT_PARTS = (
    "document.main+xml",
    "header+xml",
    "footer+xml",
    "footnotes+xml",
    "endnotes+xml",
    "presentationml.slide+xml",
    "presentationml.notesSlide+xml",
    "drawingml.chart+xml",
)


_W3CDTF = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def repack(data: bytes) -> bytes:
    """The package with every member dated 1980-01-01 and its document properties' dates fixed
    (embedded workbooks too): python-docx, python-pptx and openpyxl write the current time, and
    the files must not change from one run to the next."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            body = source.read(info.filename)
            if info.filename.endswith(".xlsx"):
                body = repack(body)
            elif info.filename == "docProps/core.xml":
                body = _W3CDTF.sub(b"2026-01-01T00:00:00Z", body)
            target.writestr(zipfile.ZipInfo(info.filename), body, zipfile.ZIP_DEFLATED)
    return out.getvalue()


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def sentence(rng: random.Random) -> str:
    text = words(rng, 8, 24)
    return text[0].upper() + text[1:] + rng.choice(".....?!")


def title(rng: random.Random, low: int = 3, high: int = 7) -> str:
    text = words(rng, low, high)
    return text[0].upper() + text[1:]


def png(width: int, height: int, seed: int) -> bytes:
    """A small RGB PNG (a colour gradient with stripes), written with zlib alone."""
    rng = random.Random(seed)
    base = [rng.randrange(256) for _ in range(3)]
    rows = []
    for y in range(height):
        row = bytearray([0])  # filter: none
        for x in range(width):
            stripe = 60 if (x // 8 + y // 8) % 2 else 0
            row += bytes((base[c] + x * (c + 1) + y + stripe) % 256 for c in range(3))
        rows.append(bytes(row))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
        + chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------------------------------------
# DOCX


class _Footnotes:
    """A footnotes part as Word writes it, and references to its notes."""

    def __init__(self, document: WordDocument) -> None:
        self.root = parse_xml(
            f"<w:footnotes {nsdecls('w')}>"
            '<w:footnote w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p>'
            "</w:footnote>"
            '<w:footnote w:type="continuationSeparator" w:id="0"><w:p><w:r>'
            "<w:continuationSeparator/></w:r></w:p></w:footnote></w:footnotes>"
        )
        self.document = document
        self.count = 0

    def cite(self, paragraph: Paragraph, text: str) -> None:
        """A reference to a new note at the end of ``paragraph``."""
        self.count += 1
        paragraph._p.append(self._reference_run(f'<w:footnoteReference w:id="{self.count}"/>'))
        self.root.append(
            parse_xml(
                f'<w:footnote {nsdecls("w")} w:id="{self.count}"><w:p>'
                + etree.tostring(self._reference_run("<w:footnoteRef/>")).decode()
                + f'<w:r><w:t xml:space="preserve"> {text}</w:t></w:r></w:p></w:footnote>'
            )
        )

    @staticmethod
    def _reference_run(child: str) -> Any:
        return parse_xml(
            f'<w:r {nsdecls("w")}><w:rPr><w:vertAlign w:val="superscript"/></w:rPr>{child}</w:r>'
        )

    def attach(self) -> None:
        """The part, related to the main document (python-docx adds its content type)."""
        blob = etree.tostring(self.root, encoding="UTF-8", standalone=True)
        part = Part(
            PackURI("/word/footnotes.xml"),
            FOOTNOTES_TYPE,
            blob,
            self.document.part.package,
        )
        self.document.part.relate_to(part, RT.FOOTNOTES)


def _hyperlink(paragraph: Paragraph, text: str, url: str) -> None:
    """A w:hyperlink around one underlined run (python-docx has no API for links)."""
    rid = paragraph.part.relate_to(url, HYPERLINK, is_external=True)
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), rid)
    link.append(
        parse_xml(
            f'<w:r {nsdecls("w")}><w:rPr><w:color w:val="0563C1"/><w:u w:val="single"/></w:rPr>'
            f'<w:t xml:space="preserve">{text}</w:t></w:r>'
        )
    )
    paragraph._p.append(link)


def _rich_paragraph(
    document: WordDocument, rng: random.Random, style: str | None = None
) -> Paragraph:
    """3-5 sentences; some words bold, italic or a hyperlink."""
    paragraph = document.add_paragraph(style=style)
    for index in range(rng.randint(3, 5)):
        text = sentence(rng)
        if rng.random() < 0.35:  # a formatted word or link inside the sentence
            head, _, tail = text.partition(" ")
            paragraph.add_run(("" if index == 0 else " ") + head + " ")
            word = rng.choice(WORDS)
            choice = rng.random()
            if choice < 0.4:
                paragraph.add_run(word).bold = True
            elif choice < 0.75:
                paragraph.add_run(word).italic = True
            else:
                _hyperlink(paragraph, word, f"https://example.org/manual/{word}")
            paragraph.add_run(" " + tail)
        else:
            paragraph.add_run(("" if index == 0 else " ") + text)
    return paragraph


def _table(document: WordDocument, rng: random.Random) -> None:
    rows = rng.randint(4, 6)
    table = document.add_table(rows=rows + 1, cols=3)
    table.style = "Table Grid"
    for cell, name in zip(table.rows[0].cells, ("Setting", "What it does", "Default"), strict=True):
        cell.text = name
        cell.paragraphs[0].runs[0].bold = True
    for row in table.rows[1:]:
        row.cells[0].text = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
        row.cells[1].text = sentence(rng)
        row.cells[2].text = str(rng.randint(1, 4096))


def make_docx(pages: int = 50, seed: int = 0, footnotes: bool = True) -> bytes:
    """A manual of ``pages`` pages (about 280 words each), deterministic for ``seed``; a
    footnote on every other page unless ``footnotes`` is False."""
    rng = random.Random(seed)
    document = docx.Document()
    document.core_properties.title = "Operator manual"
    document.styles["Normal"].font.size = Pt(11)
    section = document.sections[0]
    section.header.paragraphs[0].text = "Operator manual: " + title(rng)
    section.footer.paragraphs[0].text = "Copyright example.org. " + sentence(rng)
    notes = _Footnotes(document)
    document.add_heading("Operator manual", level=0)
    figures = 0
    for page in range(pages):
        if page % 5 == 0:
            document.add_heading(f"{page // 5 + 1}. {title(rng)}", level=1)
        document.add_heading(f"{page // 5 + 1}.{page % 5 + 1} {title(rng)}", level=2)
        first = _rich_paragraph(document, rng)
        note = sentence(rng)  # drawn either way: the rest of the text stays the same
        if footnotes and page % 2 == 0:
            notes.cite(first, note)
        kind = page % 4
        if kind == 0:
            for _ in range(rng.randint(4, 6)):
                document.add_paragraph(sentence(rng), style="List Bullet")
        elif kind == 1:
            _table(document, rng)
        elif kind == 2:
            for _ in range(rng.randint(4, 6)):
                document.add_paragraph(sentence(rng), style="List Number")
        elif page % 8 == 3:  # a figure every 8 pages
            figures += 1
            image = png(96, 64, seed * 1000 + figures)
            document.add_picture(io.BytesIO(image), width=Inches(3))
            document.add_paragraph(f"Figure {figures}. {sentence(rng)}", style="Caption")
        else:
            document.add_paragraph(sentence(rng), style="Quote")
        _rich_paragraph(document, rng)
        _rich_paragraph(document, rng)
        if page < pages - 1:
            document.paragraphs[-1].add_run().add_break(WD_BREAK.PAGE)
    if notes.count:
        notes.attach()
    out = io.BytesIO()
    document.save(out)
    return repack(out.getvalue())


# ---------------------------------------------------------------------------------------------
# PPTX


def _bullets(slide: Slide, rng: random.Random) -> None:
    body = slide.placeholders[1].text_frame
    for index in range(rng.randint(4, 6)):
        paragraph = body.paragraphs[0] if index == 0 else body.add_paragraph()
        paragraph.text = sentence(rng)
        if index and rng.random() < 0.3:
            paragraph.level = 1
        if rng.random() < 0.25:  # a bold word at the end of the bullet
            run = paragraph.add_run()
            run.text = " " + rng.choice(WORDS)
            run.font.bold = True


def _slide_table(slide: Slide, rng: random.Random) -> None:
    rows = rng.randint(4, 5)
    shape = slide.shapes.add_table(
        rows + 1, 3, SlideInches(0.5), SlideInches(1.6), SlideInches(9), SlideInches(4)
    )
    table = shape.table
    for column, name in enumerate(("Setting", "What it does", "Default")):
        table.cell(0, column).text = name
    for row in range(1, rows + 1):
        table.cell(row, 0).text = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
        table.cell(row, 1).text = title(rng, 5, 10)
        table.cell(row, 2).text = str(rng.randint(1, 4096))


def _chart(slide: Slide, rng: random.Random) -> None:
    data = CategoryChartData()
    data.categories = [title(rng, 1, 2) for _ in range(4)]
    data.add_series(title(rng, 1, 2), [rng.randint(10, 99) for _ in range(4)])
    chart = slide.shapes.add_chart(
        XL_CHART_TYPE.COLUMN_CLUSTERED,
        SlideInches(1),
        SlideInches(1.6),
        SlideInches(8),
        SlideInches(4.5),
        data,
    ).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = title(rng)


def make_pptx(slides: int = 40, seed: int = 0) -> bytes:
    """A deck of ``slides`` slides, deterministic for ``seed``: a title slide, then bullets,
    with a table every 6th slide, a chart every 8th and a picture every 10th; notes on all."""
    rng = random.Random(seed)
    deck = pptx.Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[0])
    first.shapes.title.text = "Operator manual: " + title(rng)
    first.placeholders[1].text = sentence(rng)
    for number in range(1, slides):
        if number % 6 == 3 or number % 8 == 5:
            slide = deck.slides.add_slide(deck.slide_layouts[5])  # title only
            slide.shapes.title.text = title(rng)
            (_slide_table if number % 6 == 3 else _chart)(slide, rng)
        else:
            slide = deck.slides.add_slide(deck.slide_layouts[1])  # title and content
            slide.shapes.title.text = title(rng)
            _bullets(slide, rng)
            if number % 10 == 0:
                image = io.BytesIO(png(96, 64, seed * 1000 + number))
                slide.shapes.add_picture(image, SlideInches(7.5), SlideInches(5.2), SlideInches(2))
        notes = slide.notes_slide.notes_text_frame
        notes.text = " ".join(sentence(rng) for _ in range(rng.randint(2, 4)))
    out = io.BytesIO()
    deck.save(out)
    return repack(out.getvalue())


# ---------------------------------------------------------------------------------------------
# Checks on a translated package


def text_parts(data: bytes) -> set[str]:
    """The members the handler may rewrite: those whose content type says they carry text."""
    with zipfile.ZipFile(io.BytesIO(data)) as package:
        types = package.read("[Content_Types].xml").decode()
    found = set()
    for override in types.split("<Override ")[1:]:
        name = override.split('PartName="', 1)[1].split('"', 1)[0].lstrip("/")
        content_type = override.split('ContentType="', 1)[1].split('"', 1)[0]
        if content_type.endswith(TEXT_PARTS):
            found.add(name)
    return found


def check_package(source: bytes, translated: bytes, kind: str) -> dict[str, object]:
    """Whether ``translated`` opens with python-docx or python-pptx, has the source's members
    in order, and every member outside the text parts (images included) byte-identical."""
    (docx.Document if kind == "docx" else pptx.Presentation)(io.BytesIO(translated))
    with (
        zipfile.ZipFile(io.BytesIO(source)) as before,
        zipfile.ZipFile(io.BytesIO(translated)) as after,
    ):
        names = before.namelist()
        same_names = names == after.namelist()
        changed = [n for n in names if n in after.namelist() and before.read(n) != after.read(n)]
    media = [n for n in names if "/media/" in n]
    allowed = text_parts(source)
    return {
        "opens": True,
        "members": len(names),
        "same_members_in_order": same_names,
        "members_changed": len(changed),
        "only_text_parts_changed": set(changed) <= allowed,
        "images": len(media),
        "images_identical": not set(media) & set(changed),
    }
