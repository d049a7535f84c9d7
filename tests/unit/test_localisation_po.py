"""gettext PO files through the document pipeline: msgstr filled from msgid, fuzzy entries
translated again and cleared, translated and obsolete entries, comments and references
unchanged, plural forms for the target language (checked against gettext's msginit and compiled
by msgfmt --check where gettext is installed), placeholders kept from a careless translator, and
malformed files refused with their line named."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import polib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from localisation_files import WORDS, mark_words, translate_file
from test_document_fidelity import careless

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.languages import SUPPORTED_CODES
from hymt_serve.request.localisation_plurals import PLURAL_FORMS, form_of, plural_count
from hymt_serve.request.localisation_po import parse_po

PO = r"""# Translations of the demo.
# Copyright (C) 2026
#
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\n"
"Language: de\n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\n"

#. A comment for translators.
#: src/app.py:10 src/app.py:20
msgid "Open the file"
msgstr ""

#: src/app.py:12
#, python-format
msgid "%(count)d files were deleted from %(folder)s, %s left"
msgstr ""

#: src/app.py:14
#, python-format
msgid "One file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

#, c-format
msgid "%d day"
msgid_plural "%d days"
msgstr[0] ""
msgstr[1] "Tage"

#: src/menu.py:3
msgctxt "menu"
msgid "Open"
msgstr ""

#: src/app.py:30
#, fuzzy, python-brace-format
#| msgid "Hello {name}"
msgid "Hello {name}, welcome"
msgstr "Hallo {name}"

#: src/app.py:40
msgid "Already done"
msgstr "Schon erledigt"

#: src/app.py:50
msgid ""
"Line one\n"
"Line two\n"
msgstr ""

msgid "مرحبا بالعالم 你好世界 COMBINING"
msgstr ""

msgid "42"
msgstr ""

#~ msgid "Old entry"
#~ msgstr "Alter Eintrag"
""".replace("COMBINING", "e\u0301te\u0301")


def _entries(text: str) -> dict[tuple[str | None, str], polib.POEntry]:
    return {(e.msgctxt, e.msgid): e for e in polib.pofile(text, encoding="utf-8")}


def test_entries_are_filled_as_a_translator_tool_does() -> None:
    out = translate_file(PO, "po", mark_words, target="ru")
    po = polib.pofile(out, encoding="utf-8")
    entries = _entries(out)
    assert entries[(None, "Open the file")].msgstr == "«Open» «the» «file»"
    assert entries[(None, "Open the file")].occurrences == [
        ("src/app.py", "10"),
        ("src/app.py", "20"),
    ]
    assert entries[(None, "Open the file")].comment == "A comment for translators."
    formatted = entries[(None, "%(count)d files were deleted from %(folder)s, %s left")]
    assert formatted.msgstr == "%(count)d «files» «were» «deleted» «from» %(folder)s, %s «left»"
    assert entries[("menu", "Open")].msgstr == "«Open»"
    fuzzy = entries[(None, "Hello {name}, welcome")]
    assert fuzzy.msgstr == "«Hello» {name}, «welcome»"
    assert fuzzy.flags == ["python-brace-format"] and fuzzy.previous_msgid is None
    assert entries[(None, "Already done")].msgstr == "Schon erledigt"
    assert entries[(None, "Line one\nLine two\n")].msgstr == "«Line» «one»\n«Line» «two»\n"
    assert entries[(None, "42")].msgstr == "42"  # nothing to translate: the source
    assert entries[(None, "مرحبا بالعالم 你好世界 e\u0301te\u0301")].msgstr == mark_words(
        "مرحبا بالعالم 你好世界 e\u0301te\u0301"
    )
    # Russian: three forms; the first (1, 21, 31...) takes the msgid's translation where it
    # has the msgid_plural's placeholders (python's % needs them all), else the plural's
    plural = entries[(None, "One file")]
    assert plural.msgstr_plural == {0: "%d «files»", 1: "%d «files»", 2: "%d «files»"}
    days = entries[(None, "%d day")]  # partly translated: translated again
    assert days.msgstr_plural == {0: "%d «day»", 1: "%d «days»", 2: "%d «days»"}
    assert po.metadata["Language"] == "ru"
    assert po.metadata["Plural-Forms"] == PLURAL_FORMS["ru"]
    assert po.metadata["Content-Type"] == "text/plain; charset=UTF-8"
    assert po.metadata["Project-Id-Version"] == "demo 1.0"
    assert not po.metadata_is_fuzzy
    obsolete = [e for e in po if e.obsolete]
    assert [(e.msgid, e.msgstr) for e in obsolete] == [("Old entry", "Alter Eintrag")]
    # everything but the translations and the header's fields is as it was
    before, after = polib.pofile(PO, encoding="utf-8"), po
    assert len(before) == len(after)
    for old, new in zip(before, after, strict=True):
        assert (old.msgctxt, old.msgid, old.msgid_plural, old.occurrences, old.comment) == (
            new.msgctxt,
            new.msgid,
            new.msgid_plural,
            new.occurrences,
            new.comment,
        )
        assert old.tcomment == new.tcomment and old.obsolete == new.obsolete
        assert [f for f in old.flags if f != "fuzzy"] == new.flags


@pytest.mark.parametrize(
    ("target", "forms"),
    [
        ("ja", {0: "%d «days»"}),
        ("fr", {0: "%d «day»", 1: "%d «days»"}),
        ("ar", {0: "%d «days»", 1: "%d «day»", **{k: "%d «days»" for k in range(2, 6)}}),
        ("zh-Hant", {0: "%d «days»"}),
    ],
)
def test_plural_entries_get_the_target_languages_forms(target: str, forms: dict[int, str]) -> None:
    out = translate_file(PO, "po", mark_words, target=target)
    assert _entries(out)[(None, "%d day")].msgstr_plural == forms
    assert polib.pofile(out, encoding="utf-8").metadata["Language"] == target.replace("-", "_")


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="gettext's msgfmt is not installed")
@pytest.mark.parametrize("target", ["ru", "ar", "ja", "fr", "he", "pl", "cs", "tl"])
def test_msgfmt_check_accepts_the_translated_file(target: str, tmp_path: Path) -> None:
    """msgfmt --check compares every placeholder and the header, and compiles the plurals."""
    path = tmp_path / "out.po"
    path.write_text(translate_file(PO, "po", mark_words, target=target), encoding="utf-8")
    checked = subprocess.run(
        ["msgfmt", "--check", "-o", str(tmp_path / "out.mo"), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


@pytest.mark.skipif(shutil.which("msginit") is None, reason="gettext's msginit is not installed")
def test_plural_forms_cover_every_language_and_match_gettexts_own(tmp_path: Path) -> None:
    assert set(PLURAL_FORMS) == set(SUPPORTED_CODES)
    template = tmp_path / "t.pot"
    template.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n')
    known = 0
    for code in SUPPORTED_CODES:
        out = tmp_path / f"{code}.po"
        subprocess.run(
            ["msginit", "--no-translator", "-i", str(template), "-o", str(out), "-l", code],
            capture_output=True,
            check=True,
        )
        header = polib.pofile(str(out)).metadata.get("Plural-Forms", "")
        if "INTEGER" not in header and header:
            known += 1
            assert header == PLURAL_FORMS[code], code
    assert known >= 16
    for code, forms in PLURAL_FORMS.items():
        assert 0 <= form_of(forms)(1) < plural_count(forms), code


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([*WORDS, "%s", "%(n)d", "{x}", "<b>", "</b>"]), min_size=1),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 99),
)
def test_a_careless_translator_loses_no_placeholder(messages: list[list[str]], seed: int) -> None:
    entries = "".join(
        f'#, python-format\nmsgid "{" ".join(words)}"\nmsgstr ""\n\n' for words in messages
    )
    out = translate_file(entries, "po", careless(random.Random(seed)), target="de", budget=8)
    for entry in polib.pofile(out, encoding="utf-8"):
        for placeholder in ("%s", "%(n)d", "{x}", "<b>", "</b>"):
            assert entry.msgstr.count(placeholder) == entry.msgid.count(placeholder)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ('msgid "a"\nmsgstr "b\n', "line 2"),
        ('msgid "a"\nmsgstr "b"\nmsgid\n', "line 3"),
        ("/etc/passwd", "a single line"),
        ('msgid "one line"', "a single line"),
    ],
)
def test_a_malformed_po_file_is_a_400_naming_the_line(document: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_po(document)
    assert caught.value.status == 400 and caught.value.field == "document"
    assert message in caught.value.message, caught.value.message


def test_a_file_in_gettexts_layout_changes_only_where_it_is_translated() -> None:
    """What msgmerge and msginit write (wrapped at 79 columns, one header field a line) comes
    back the same but for the new msgstr and the header fields the target sets."""
    source = (
        '# Demo.\n#\nmsgid ""\nmsgstr ""\n"Project-Id-Version: demo\\n"\n"Language: de\\n"\n'
        '"Content-Type: text/plain; charset=UTF-8\\n"\n'
        '"Plural-Forms: nplurals=2; plural=(n != 1);\\n"\n\n'
        '#: a.py:3\nmsgid ""\n'
        '"Hello, world! This is a rather long message that will certainly need to be "\n'
        '"wrapped by the tools because it is long."\nmsgstr ""\n\n'
        '#: a.py:4\n#, python-format\nmsgid "%(count)d files"\nmsgstr "%(count)d Dateien"\n\n'
        '#~ msgid "Old"\n#~ msgstr "Alt"\n'
    )
    out = translate_file(source, "po", lambda text: text, target="fr")
    expected = (
        source.replace('"Language: de', '"Language: fr')
        .replace("(n != 1)", "(n > 1)")
        .replace(
            'long."\nmsgstr ""\n',
            'long."\nmsgstr ""\n'
            '"Hello, world! This is a rather long message that will certainly need to be "\n'
            '"wrapped by the tools because it is long."\n',
        )
    )
    assert out == expected
