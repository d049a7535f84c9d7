"""DOCX, PPTX and XLSX through DeepL's document API with the official ``deepl`` client against
TorchServe and the tiny model (its words are random: the checks are structural): the download
is the same package with only its text-bearing parts changed, under its own type, a bold run
still bold; a file that is no Office package fails in its status."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import deepl
import docx
import pytest
from test_deepl_localisation import front  # noqa: F401  (the front end's fixture)

pytestmark = pytest.mark.integration


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as package:
        return {info.filename: package.read(info) for info in package.infolist()}


def test_deepl_client_translates_a_docx(front: tuple[str, str], tmp_path: Path) -> None:  # noqa: F811
    url, key = front
    document = docx.Document()
    paragraph = document.add_paragraph("The weather is nice today and the ")
    paragraph.add_run("bold").bold = True
    paragraph.add_run(" word stays bold.")
    source, target = tmp_path / "notes.docx", tmp_path / "notes.de.docx"
    document.save(source)
    client = deepl.Translator(key, server_url=url)
    assert client.translate_document_from_filepath(source, target, target_lang="DE").done
    before, after = _members(source), _members(target)
    assert list(before) == list(after)
    assert [name for name in before if before[name] != after[name]] == ["word/document.xml"]
    runs = docx.Document(io.BytesIO(target.read_bytes())).paragraphs[0].runs
    assert any(run.bold for run in runs)


def test_a_file_that_is_no_package_fails_in_its_status(
    front: tuple[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    url, key = front
    broken = tmp_path / "broken.docx"
    broken.write_bytes(b"not a zip at all")
    client = deepl.Translator(key, server_url=url)
    with pytest.raises(deepl.DocumentTranslationException, match="is not a ZIP package"):
        client.translate_document_from_filepath(broken, tmp_path / "x.docx", target_lang="DE")
