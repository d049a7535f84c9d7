"""XLIFF and PO files through DeepL's document API, driven by the official deepl client against
the real stack (TorchServe with the tiny model + the front end): the translated file is
well formed, has its targets (or msgstr) and target language, keeps everything else, and comes
down under its own name and type; a malformed file fails in its status, with its line."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import deepl
import polib
import pytest
from web_stub import serving

from hymt_serve.ops.launcher import Server
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys

pytestmark = pytest.mark.integration
NS1 = "urn:oasis:names:tc:xliff:document:1.2"
NS2 = "urn:oasis:names:tc:xliff:document:2.0"

XLIFF_12 = f"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="{NS1}">
  <file source-language="en" datatype="plaintext" original="app">
    <body>
      <trans-unit id="1"><source>Save <g id="1">all</g> files<x id="2"/></source></trans-unit>
      <trans-unit id="2"><source>Done</source><target state="final">Fertig</target></trans-unit>
    </body>
  </file>
</xliff>
"""
XLIFF_20 = f"""<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="{NS2}" version="2.0" srcLang="en">
  <file id="f"><unit id="u"><segment><source>Open <pc id="1">the</pc> door</source></segment>
  </unit></file>
</xliff>
"""
PO = """msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

#: app.py:1
msgctxt "menu"
msgid "Open the door"
msgstr ""

#, python-format
msgid "%d file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""
"""


@pytest.fixture(scope="module")
def front(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The front end with a fresh key file: (its URL, its key)."""
    key_file = tmp_path_factory.mktemp("keys") / "web_keys.json"
    keys = ClientKeys.open(key_file, character_limit=100_000)
    with serving(create_app(server, client_keys=keys)) as url:
        yield url, keys.keys[0].key


def _outside_targets(text: str) -> str:
    root = ET.fromstring(text.encode("utf-8"))
    for parent in root.iter():
        for child in list(parent):
            if child.tag.endswith("}target"):
                parent.remove(child)
        for name in ("target-language", "trgLang", "state"):
            parent.attrib.pop(name, None)
    return ET.canonicalize(ET.tostring(root, encoding="unicode"), strip_text=True)


@pytest.mark.parametrize(
    ("name", "content", "ns"), [("app.xlf", XLIFF_12, NS1), ("app.xliff", XLIFF_20, NS2)]
)
def test_deepl_client_translates_xliff(
    front: tuple[str, str], tmp_path: Path, name: str, content: str, ns: str
) -> None:
    url, key = front
    source, target = tmp_path / name, tmp_path / f"out-{name}"
    source.write_bytes(content.encode())
    client = deepl.Translator(key, server_url=url)
    status = client.translate_document_from_filepath(source, target, target_lang="DE")
    assert status.done
    translated = target.read_text(encoding="utf-8")
    root = ET.fromstring(translated.encode("utf-8"))
    first = root.find(f".//{{{ns}}}target")
    assert first is not None and first.find(f"{{{ns}}}{'g' if ns == NS1 else 'pc'}") is not None
    if ns == NS1:
        assert root.find(f"{{{ns}}}file").get("target-language") == "de"  # type: ignore[union-attr]
        assert first.find(f"{{{ns}}}x") is not None
        assert '<target state="final">Fertig</target>' in translated
    else:
        assert root.get("trgLang") == "de"
    assert _outside_targets(translated) == _outside_targets(content)


def test_deepl_client_translates_po_and_the_download_has_its_type(
    front: tuple[str, str], tmp_path: Path
) -> None:
    url, key = front
    client = deepl.Translator(key, server_url=url)
    source, target = tmp_path / "de.po", tmp_path / "out.po"
    source.write_text(PO, encoding="utf-8")
    assert client.translate_document_from_filepath(source, target, target_lang="DE").done
    po = polib.pofile(target.read_text(encoding="utf-8"), encoding="utf-8")
    assert po.metadata["Language"] == "de"
    assert po.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    menu, files = list(po)
    assert menu.msgctxt == "menu" and menu.occurrences == [("app.py", "1")]
    assert menu.msgstr.strip() and sorted(files.msgstr_plural) == [0, 1]
    assert all("%d" in form for form in files.msgstr_plural.values())  # kept as a code
    for name, media_type in (
        ("a.po", "text/x-gettext-translation"),
        ("a.xlf", "application/xliff+xml"),
    ):
        content = PO if name.endswith(".po") else XLIFF_12
        handle = client.translate_document_upload(content.encode(), target_lang="DE", filename=name)
        client.translate_document_wait_until_done(handle)
        answer = client.translate_document_download(handle)
        assert answer.headers["Content-Type"].startswith(media_type)  # type: ignore[union-attr]
        assert f'filename="{name}"' in answer.headers["Content-Disposition"]  # type: ignore[union-attr]


def test_a_malformed_localisation_file_fails_with_its_line(
    front: tuple[str, str], tmp_path: Path
) -> None:
    url, key = front
    client = deepl.Translator(key, server_url=url)
    broken = tmp_path / "broken.xlf"
    broken.write_text(XLIFF_12.replace("</trans-unit>", "</unit>", 1))
    with pytest.raises(deepl.DocumentTranslationException, match="line 5, column"):
        client.translate_document_from_filepath(broken, tmp_path / "x.xlf", target_lang="DE")
    entity = tmp_path / "entity.xlf"
    entity.write_text('<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>\n' + XLIFF_12)
    with pytest.raises(deepl.DocumentTranslationException, match="DTD"):
        client.translate_document_from_filepath(entity, tmp_path / "y.xlf", target_lang="DE")
    po = tmp_path / "broken.po"
    po.write_text('msgid "a"\nmsgstr "unclosed\n')
    with pytest.raises(deepl.DocumentTranslationException, match="line 2"):
        client.translate_document_from_filepath(po, tmp_path / "x.po", target_lang="DE")
