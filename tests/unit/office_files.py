"""What the Office tests share: files built with python-docx, python-pptx and openpyxl in many
scripts, their translation through the service's document path (:mod:`localisation_files`), and
structural comparisons: members byte for byte, and the rewritten parts as XML with the text of
every <t> taken out."""

from __future__ import annotations

import base64
import io
import zipfile
from xml.etree import ElementTree

import docx
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
from docx.shared import Pt
from localisation_files import WORDS, Translator, translate_file

HYPERLINK = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


def sentence(seed: int, length: int = 6) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(length))


def add_hyperlink(paragraph: docx.text.paragraph.Paragraph, text: str, url: str) -> None:
    """A w:hyperlink around one run (python-docx has no API for links)."""
    rid = paragraph.part.relate_to(url, HYPERLINK, is_external=True)
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), rid)
    run = OxmlElement("w:r")
    properties = OxmlElement("w:rPr")
    style = OxmlElement("w:u")
    style.set(qn("w:val"), "single")
    properties.append(style)
    run.append(properties)
    words = OxmlElement("w:t")
    words.text = text
    run.append(words)
    link.append(run)
    paragraph._p.append(link)


def build_docx(paragraphs: int = 6) -> bytes:
    """A document with headings, mixed runs (bold, italic, a font size, a hyperlink, a tab and
    a break inside a run), a table, a header and a footer, in many scripts."""
    document = docx.Document()
    document.core_properties.title = "Title kept"
    for index in range(paragraphs):
        document.add_heading(sentence(index, 3), level=1 + index % 3)
        paragraph = document.add_paragraph(sentence(index) + " ")
        paragraph.add_run(sentence(index + 1, 2)).bold = True
        paragraph.add_run(" " + sentence(index + 2, 3) + " ")
        italic = paragraph.add_run(sentence(index + 3, 2))
        italic.italic = True
        italic.font.size = Pt(14)
        add_hyperlink(paragraph, sentence(index + 4, 2), f"https://example.org/{index}")
        mixed = paragraph.add_run(" " + sentence(index + 5, 1))
        mixed.add_tab()
        mixed.add_text(sentence(index + 6, 1))
        mixed.add_break()
        mixed.add_text(sentence(index + 7, 1) + ".")
    table = document.add_table(rows=2, cols=2)
    for number, cell in enumerate(table._cells):
        cell.text = sentence(number + 20, 2)
    section = document.sections[0]
    section.header.paragraphs[0].text = sentence(30, 3)
    section.footer.paragraphs[0].text = sentence(31, 3)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def translate_office(data: bytes, kind: str, translate: Translator) -> bytes:
    encoded = base64.b64encode(data).decode("ascii")
    return base64.b64decode(translate_file(encoded, kind, translate))


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as package:
        return {info.filename: package.read(info) for info in package.infolist()}


def without_text(xml: bytes) -> str:
    """The part as canonical XML with every <t>'s text (and its xml:space) taken out."""
    root = ElementTree.fromstring(xml)
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == "t":
            element.text = None
            element.attrib.pop(XML_SPACE, None)
    return ElementTree.canonicalize(ElementTree.tostring(root, encoding="unicode"))


def texts(xml: bytes) -> list[str]:
    """The text of every <t> of a part, in order."""
    root = ElementTree.fromstring(xml)
    return [e.text or "" for e in root.iter() if e.tag.rsplit("}", 1)[-1] == "t"]
