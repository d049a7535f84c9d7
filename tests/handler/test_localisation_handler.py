"""XLIFF and PO documents through the handler with a fake engine: the file comes back with its
targets, the reply counts its segments, a msgctxt goes to the families' context prompt, a file
with nothing left to translate comes back without a row generated, and a malformed file is a 400
beside a request that succeeds."""

from __future__ import annotations

import polib
import pytest
from fakes import FakeEngine
from test_document_handler import run, shout, start

XLIFF = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file source-language="en" datatype="plaintext" original="app">
    <body>
      <trans-unit id="1">
        <source>Save <g id="1">all</g> files</source>
      </trans-unit>
      <trans-unit id="2">
        <source>Done</source>
        <target state="final">Fertig</target>
      </trans-unit>
    </body>
  </file>
</xliff>
"""

PO = """msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

msgctxt "verb"
msgid "Open"
msgstr ""

msgid "Close"
msgstr ""
"""


def test_an_xliff_file_comes_back_with_its_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine(translate=shout)
    handler = start(engine, monkeypatch)
    ((status, reply),) = run(handler, [{"document": XLIFF, "format": "xliff", "target_lang": "de"}])
    assert status == 200, reply
    assert reply["format"] == "xliff" and reply["segments"] == 1 == len(engine.prompts)
    assert reply["format_tags_lost"] == 0
    expected = XLIFF.replace('original="app">', 'original="app" target-language="de">').replace(
        "files</source>\n",
        'files</source>\n        <target state="translated" state-qualifier="mt-suggestion">'
        'SAVE <g id="1">ALL</g> FILES</target>\n',
    )
    assert reply["document"] == expected


def test_a_po_msgctxt_is_the_context_of_its_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fake translates the prompt's last line (the context prompt has no blank line)
    engine = FakeEngine(translate=lambda text: text.strip().rsplit("\n", 1)[-1].upper())
    handler = start(engine, monkeypatch, prompt_family="hy-mt1.5")
    ((status, reply),) = run(handler, [{"document": PO, "format": "po", "target_lang": "zh"}])
    assert status == 200, reply
    assert engine.prompts[0].startswith("verb\n参考上面的信息")  # the context prompt
    assert "参考上面的信息" not in engine.prompts[1]
    entries = {e.msgid: e.msgstr for e in polib.pofile(reply["document"], encoding="utf-8")}
    assert entries == {"Open": "OPEN", "Close": "CLOSE"}


def test_a_file_with_nothing_left_to_translate_comes_back_with_its_language(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = FakeEngine()
    handler = start(engine, monkeypatch)
    done = PO.replace('msgstr ""\n\nmsgid "Close"', 'msgstr "Öffnen"\n\nmsgid "Close"')
    done = done.removesuffix('msgstr ""\n') + 'msgstr "Schließen"\n'
    ((status, reply),) = run(handler, [{"document": done, "format": "po", "target_lang": "de"}])
    assert status == 200, reply
    assert reply["segments"] == 0 and engine.prompts == []
    assert polib.pofile(reply["document"], encoding="utf-8").metadata["Language"] == "de"


def test_a_malformed_file_is_a_400_beside_a_good_request(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = start(FakeEngine(), monkeypatch)
    broken = XLIFF.replace("</trans-unit>", "</trans-units>", 1)
    replies = run(
        handler,
        [
            {"document": broken, "format": "xliff", "target_lang": "de"},
            {"document": 'msgid "a"\nmsgstr "b\n', "format": "po", "target_lang": "de"},
            {"document": "Fine.", "target_lang": "de"},
        ],
    )
    (xliff_status, xliff), (po_status, po), (status, _) = replies
    assert xliff_status == 400 and xliff["field"] == "document"
    assert "line 7, column 9: mismatched tag" in xliff["error"]
    assert po_status == 400 and "line 2" in po["error"]
    assert status == 200
