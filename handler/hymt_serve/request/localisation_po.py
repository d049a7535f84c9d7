"""gettext PO files, read and written by polib (pinned): each msgid (and msgid_plural) to
translate becomes a unit, and the file comes back with its msgstr filled.

What is translated, as a translator's tool does it:

- an entry without a full translation (an empty msgstr, or an empty plural form), and a
  *fuzzy* one (msgmerge's guess from an older msgid): it is translated from its msgid again,
  and loses its fuzzy flag and its ``#|`` previous msgid, as a translator's tool clears them
  when the translation is done (so msgfmt compiles it);
- translated entries, obsolete ones (``#~``), comments, references, flags and the order of it
  all stay as they were. A msgctxt goes to the model as the entry's context (families with a
  context prompt).
- a plural entry gets one msgstr[n] per form of the target language
  (:mod:`.localisation_plurals`): the form that 1 takes gets the msgid's translation where the
  msgid has the msgid_plural's placeholders ("%d file", "%d files"), the msgid_plural's
  otherwise (a msgstr without the number's placeholder fails Python's % and msgfmt --check);
  every other form the msgid_plural's;
- the header gets the target's ``Language`` and ``Plural-Forms``, UTF-8 as its charset (what is
  written), and loses a template's fuzzy flag, as msginit does.

Placeholders of an entry with a format flag (``c-format``, ``python-format``,
``python-brace-format``, ...): ``%s``, ``%(name)d``, ``%1$s``, ``{name}`` go to the model as
codes, so that each comes back once (msgfmt --check compares them). polib rewrites the file:
entries come back in gettext's layout (lines wrapped at 78 columns), the header one line per
field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import polib

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.localisation import Codes, LocalisationFile, Unit, unused_name
from hymt_serve.request.localisation_plurals import PLURAL_FORMS, form_of, plural_count

# printf's conversions (C, Python's %-format with a (name), PHP, shell) and brace fields
# (Python's str.format, C#): what msgfmt --check compares between msgid and msgstr.
_PRINTF = (
    r"%(?:\d+\$|\([^()\s]{0,64}\))?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn%]"
)
_BRACE = r"\{[^{}\s]{0,64}\}"
_PLACEHOLDER = re.compile(f"{_PRINTF}|{_BRACE}")
# A line of a PO file: blank, a comment (obsolete entries too), a keyword with its quoted
# string, or a continuation string. polib lets some broken lines pass (an unclosed quote), so
# each line is checked first, as msgfmt does.
_STRING = r'"(?:[^"\\]|\\.)*"'
_LINE = re.compile(
    rf"[ \t]*(?:#.*|(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)[ \t]+{_STRING}|{_STRING})?"
    r"[ \t]*\r?"
)


def parse_po(text: str) -> LocalisationFile:
    """The units of a PO file. Raises InvalidRequest for a malformed one (its line named)."""
    po = _read(text)
    name = unused_name(text)
    entries = [e for e in po if not e.obsolete and e.msgid and not _done(e)]
    units: list[Unit] = []
    codes: list[Codes] = []
    for entry in entries:
        sources = [entry.msgid] + ([entry.msgid_plural] if entry.msgid_plural else [])
        for source in sources:
            unit_codes = Codes(name)
            units.append(Unit(_carrier(source, entry, unit_codes), entry.linenum, entry.msgctxt))
            codes.append(unit_codes)

    def rebuild(translations: Sequence[str], target: str) -> str:
        forms = PLURAL_FORMS[target]
        texts = iter(
            unit_codes.render(translated, str)
            for unit_codes, translated in zip(codes, translations, strict=True)
        )
        for entry in entries:
            _fill(entry, next(texts), next(texts) if entry.msgid_plural else None, forms)
        _header(po, target, forms)
        out = str(po)
        if not po.header and out.startswith("#\n"):  # polib's "#" for a header comment of none
            out = out[2:]
        return out

    return LocalisationFile(tuple(units), rebuild)


def _read(text: str) -> polib.POFile:
    # polib reads a *path* when given one that exists: content always holds a line break, which
    # no path we could be handed does, and a PO file has at least two lines.
    if "\n" not in text:
        raise InvalidRequest(
            "the PO document is malformed: it has a single line (a PO file has msgid and msgstr "
            "lines)",
            allowed="a gettext PO file in UTF-8",
            field="document",
        )
    for number, line in enumerate(text.split("\n"), start=1):
        if not _LINE.fullmatch(line):
            raise InvalidRequest(
                f"the PO document is malformed: line {number} is not a comment, a keyword with "
                "a quoted string or a quoted string",
                allowed="a gettext PO file in UTF-8",
                field="document",
            )
    try:
        return polib.pofile(text, encoding="utf-8", wrapwidth=78)
    except (OSError, ValueError) as error:
        raise InvalidRequest(
            f"the PO document is malformed: {_first_line(str(error))}",
            allowed="a gettext PO file in UTF-8",
            field="document",
        ) from None


def _first_line(message: str) -> str:
    return message.splitlines()[0][:200] if message else "unreadable"


def _done(entry: polib.POEntry) -> bool:
    """Whether an entry holds a translation to keep (translated, not fuzzy)."""
    return bool(entry.translated())


def _carrier(source: str, entry: polib.POEntry, codes: Codes) -> str:
    formats = [f for f in entry.flags if f.endswith("-format") and not f.startswith("no-")]
    if not formats:
        return source
    return _PLACEHOLDER.sub(lambda match: codes.standalone(match[0]), source)


def _fill(entry: polib.POEntry, singular: str, plural: str | None, forms: str) -> None:
    if plural is None:
        entry.msgstr = singular
    else:
        count, one = plural_count(forms), form_of(forms)(1)
        # The form of 1 takes the msgid's translation only where it holds the msgid_plural's
        # placeholders: Python's % needs every argument (msgfmt --check compares them).
        alike = _placeholders(entry.msgid) == _placeholders(entry.msgid_plural)
        entry.msgstr_plural = {
            k: singular if k == one and count > 1 and alike else plural for k in range(count)
        }
    if "fuzzy" in entry.flags:
        entry.flags.remove("fuzzy")
    entry.previous_msgctxt = entry.previous_msgid = entry.previous_msgid_plural = None


def _placeholders(text: str) -> list[str]:
    return sorted(_PLACEHOLDER.findall(text))


def _header(po: polib.POFile, target: str, forms: str) -> None:
    po.metadata["Language"] = target.replace("-", "_")  # gettext's ll_CC spelling
    po.metadata["Plural-Forms"] = forms
    content_type = po.metadata.get("Content-Type", "text/plain")
    if "charset=" in content_type:
        po.metadata["Content-Type"] = re.sub(r"charset=[^;\s]*", "charset=UTF-8", content_type)
    else:
        po.metadata["Content-Type"] = content_type + "; charset=UTF-8"
    if isinstance(po.metadata_is_fuzzy, list) and "fuzzy" in po.metadata_is_fuzzy:
        po.metadata_is_fuzzy.remove("fuzzy")  # the header's flags, once it is read
