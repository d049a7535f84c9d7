"""DOCX through the document path: files built with python-docx in many scripts come back with
every member but the text-bearing parts byte for byte, those parts equal as XML outside the
text of their runs, each run's text translated in place (a word marker keeps every tag where it
is), formatting and hyperlinks kept by a careless translator, runs cut anywhere (hypothesis),
and unsafe or malformed files refused with a 400 that names what is wrong."""

from __future__ import annotations

import base64
import io
import random
import re
import zipfile
from collections import Counter

import docx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from localisation_files import mark_words, translate_file
from office_files import build_docx, members, texts, translate_office, without_text
from test_document_fidelity import careless

from hymt_serve.request import office
from hymt_serve.request.errors import InvalidRequest

REWRITTEN = re.compile(r"word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml")


def test_a_word_marker_changes_only_the_text_of_runs() -> None:
    source = build_docx()
    result = translate_office(source, "docx", mark_words)
    before, after = members(source), members(result)
    assert list(before) == list(after)
    rewritten = [name for name in before if before[name] != after[name]]
    assert rewritten and all(REWRITTEN.fullmatch(name) for name in rewritten)
    for name in rewritten:
        assert without_text(before[name]) == without_text(after[name]), name
        assert texts(after[name]) == [mark_words(text) for text in texts(before[name])]
    read = docx.Document(io.BytesIO(result))
    assert read.core_properties.title == "Title kept"
    assert read.sections[0].header.paragraphs[0].text.startswith("«")


def test_the_same_text_back_gives_the_same_bytes() -> None:
    source = build_docx()
    assert members(translate_office(source, "docx", lambda text: text)) == members(source)


def test_a_paragraph_that_starts_with_a_code_is_rebuilt_once() -> None:
    """A paragraph whose first run holds no text (a tab here; a footnote's own marker run in
    every Word footnote) is a code at the paragraph's very start: rebuilding that code's bytes
    must not render the paragraph around it again (that recursed without end)."""
    document = docx.Document()
    paragraph = document.add_paragraph()
    paragraph.add_run().add_tab()
    paragraph.add_run("Some words here.")
    saved = io.BytesIO()
    document.save(saved)
    result = translate_office(saved.getvalue(), "docx", mark_words)
    [read] = [p for p in docx.Document(io.BytesIO(result)).paragraphs if p.text.strip()]
    assert read.text == "\t" + mark_words("Some words here.")


def _spans(data: bytes) -> tuple[Counter[str], Counter[str]]:
    """Run properties of the runs that hold text, and hyperlinks' relationship ids."""
    body = members(data)["word/document.xml"].decode()
    runs = re.findall(r"<w:r>(<w:rPr>.*?</w:rPr>)?<w:t[ >]", body)
    links = re.findall(r'<w:hyperlink r:id="(\w+)"', body)
    return Counter(runs), Counter(links)


@pytest.mark.parametrize("seed", range(8))
def test_a_careless_translator_loses_no_formatting_or_link(seed: int) -> None:
    source = build_docx(3)
    result = translate_office(source, "docx", careless(random.Random(seed)))
    runs, links = _spans(result)
    runs_before, links_before = _spans(source)
    assert links == links_before
    assert set(runs) == set(runs_before)
    assert without_text(members(result)["word/styles.xml"]) == without_text(
        members(source)["word/styles.xml"]
    )
    docx.Document(io.BytesIO(result))  # still a document python-docx reads


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.sampled_from("nbiu")), max_size=8))
def test_runs_cut_anywhere_come_back_in_place(cuts: list[tuple[str, str]]) -> None:
    """A paragraph of runs of any text (cut inside words too) and formatting: each run's text
    is marked in place, and the same text back gives the same bytes."""
    document = docx.Document()
    paragraph = document.add_paragraph()
    for text, style in cuts:
        text = "".join(c for c in text if c.isprintable() and c not in "\x00") or "x"
        run = paragraph.add_run(text)
        run.bold, run.italic = style == "b", style == "i"
        run.underline = style == "u" or None
    out = io.BytesIO()
    document.save(out)
    source = out.getvalue()
    assert members(translate_office(source, "docx", lambda text: text)) == members(source)
    before = members(source)["word/document.xml"]
    after = members(translate_office(source, "docx", mark_words))["word/document.xml"]
    assert without_text(after) == without_text(before)
    assert texts(after) == [mark_words(text) for text in texts(before)]


def _package(files: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> str:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as package:
        for name, body in files.items():
            package.writestr(name, body)
    return base64.b64encode(out.getvalue()).decode()


def _with(name: str, body: bytes) -> str:
    files = members(build_docx(1))
    files[name] = body
    return _package(files)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("not base64!", "must be the file in base64"),
        (base64.b64encode(b"plain text").decode(), "is not a ZIP package"),
        (_package({"a.txt": b"x"}), "has no [Content_Types].xml"),
        (
            _with("word/document.xml", b"<w:document"),
            "DOCX part word/document.xml document is malformed: line 1",
        ),
        (
            _with("word/document.xml", b'<!DOCTYPE d [<!ENTITY e "x">]><d>&e;</d>'),
            "a DTD (<!DOCTYPE ...>) or entity declaration is not accepted",
        ),
        (
            _with("word/document.xml", b"<a>" * 100 + b"</a>" * 100),
            "elements nest deeper than 64 levels",
        ),
        (_with("bomb.bin", b"\0" * (office.RATIO_FROM * 2)), "expands"),
    ],
)
def test_unsafe_and_malformed_files_are_a_400_naming_what_is_wrong(
    document: str, message: str
) -> None:
    with pytest.raises(InvalidRequest) as raised:
        translate_file(document, "docx", mark_words)
    assert message in str(raised.value)
    assert raised.value.status == 400


def test_limits_come_from_the_directory_before_anything_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = base64.b64encode(build_docx(1)).decode()
    monkeypatch.setattr(office, "MAX_MEMBERS", 3)
    with pytest.raises(InvalidRequest, match="members, over 3"):
        translate_file(source, "docx", mark_words)
    monkeypatch.setattr(office, "MAX_MEMBERS", 10_000)
    monkeypatch.setattr(office, "MAX_UNCOMPRESSED", 1000)
    with pytest.raises(InvalidRequest, match="unpacks to"):
        translate_file(source, "docx", mark_words)


def test_a_package_without_a_word_document_is_refused_by_name() -> None:
    files = members(build_docx(1))
    types = files["[Content_Types].xml"].replace(b"document.main+xml", b"template.main+xml")
    files["[Content_Types].xml"] = types
    with pytest.raises(InvalidRequest, match=r"has no document\.main"):
        translate_file(_package(files), "docx", mark_words)
