"""DOCX through the handler with a fake engine: the file goes in and comes back in base64, its
paragraphs generated as the document's segments (a bold run as a tag), with source_lang "auto"
detected from the text a reader sees; a damaged file is a 400 beside a request that succeeds,
and a file over max_office_bytes a 413 before it is decoded."""

from __future__ import annotations

import base64
import io
import zipfile

import docx
import pytest
from fakes import FakeEngine
from test_document_handler import run, shout, start


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as package:
        return {info.filename: package.read(info) for info in package.infolist()}


def _docx() -> bytes:
    document = docx.Document()
    paragraph = document.add_paragraph("The train leaves at seven and the ")
    paragraph.add_run("bold").bold = True
    paragraph.add_run(" word stays bold.")
    document.add_paragraph("Another paragraph to translate here.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_a_docx_file_comes_back_translated_in_base64(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine(translate=shout)
    handler = start(engine, monkeypatch)
    source = _docx()
    body = {"document": base64.b64encode(source).decode(), "format": "docx"}
    ((status, reply),) = run(handler, [body | {"target_lang": "de", "source_lang": "auto"}])
    assert status == 200, reply
    assert reply["format"] == "docx" and reply["segments"] == 2 == len(engine.prompts)
    assert "<s1>bold</s1>" in engine.prompts[0] and reply["format_tags_lost"] == 0
    assert reply["detected"]["language"] == "en"
    result = base64.b64decode(reply["document"])
    paragraphs = docx.Document(io.BytesIO(result)).paragraphs
    assert paragraphs[0].text == "THE TRAIN LEAVES AT SEVEN AND THE BOLD WORD STAYS BOLD."
    assert [run.text for run in paragraphs[0].runs if run.bold] == ["BOLD"]
    changed = [n for n, b in members(source).items() if members(result)[n] != b]
    assert changed == ["word/document.xml"]


def test_a_damaged_or_large_file_is_refused_beside_a_good_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = start(FakeEngine(translate=shout), monkeypatch, max_office_bytes=5000)
    cut = base64.b64encode(_docx()[:3000]).decode()
    large = base64.b64encode(b"x" * 9000).decode()
    replies = run(
        handler,
        [
            {"document": cut, "format": "docx", "target_lang": "de"},
            {"text": "Hello.", "target_lang": "de"},
            {"document": large, "format": "docx", "target_lang": "de"},
        ],
    )
    assert replies[0][0] == 400 and "is not a ZIP package" in replies[0][1]["error"]
    assert replies[1][0] == 200
    assert replies[2][0] == 413 and "at most 5000 bytes" in replies[2][1]["allowed"]
