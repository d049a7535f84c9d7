"""A stored glossary's entries as clients send them, checked as DeepL checks them, and the one
error type of the glossary routes (docs/glossaries.md).

Formats (DeepL's ``entries_format``): ``tsv``, one ``source<TAB>target`` per line; ``csv``,
``source,target`` per row with CSV's quoting, optionally followed by the row's source and
target language (rows naming another pair are skipped, as DeepL's own CSV export holds several).
Our API also takes a JSON list of ``[source, target]`` pairs or ``{"source", "target"}``
objects. Empty lines are skipped and each term is stripped of surrounding whitespace.

The rules (DeepL's): at least one entry; no empty term; no control character (C0, C1) or
Unicode line break in a term (so no tab or newline); a source term at most once; a term and
the name at most ``MAX_TERM_BYTES`` UTF-8 bytes; the entries at most ``MAX_ENTRIES_BYTES``.
Ours besides: at most ``MAX_ENTRIES`` entries (every translation that uses the glossary scans
them).
"""

from __future__ import annotations

import csv
import io
from typing import Any

from hymt_serve.request.languages import lookup

Pair = tuple[str, str]  # (source term, target term), as the handler's GlossaryPair

FORMATS = ("tsv", "csv")
MAX_ENTRIES_BYTES = 10 * 1_048_576  # DeepL's 10 MiB per glossary
MAX_TERM_BYTES = 1024  # DeepL's limit for a term and for a glossary's name
MAX_ENTRIES = 100_000
INVALID_ENTRIES = "Invalid glossary entries provided"
ERROR_TYPES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class GlossaryError(Exception):
    """A refused glossary call: ``status``, DeepL's ``message`` and an optional ``detail``
    (DeepL's error body ``{"message", "detail"}``; ours ``{"error", "error_type"}``)."""

    def __init__(self, status: int, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail

    def deepl_body(self) -> dict[str, str]:
        body = {"message": self.message}
        return body | ({"detail": self.detail} if self.detail else {})

    def api_body(self) -> dict[str, str]:
        message = f"{self.message}: {self.detail}" if self.detail else self.message
        return {"error": message, "error_type": ERROR_TYPES.get(self.status, "invalid_request")}


def parse_entries(
    entries: Any, entries_format: str, languages: tuple[str, str] | None = None
) -> list[Pair]:
    """The checked entries of ``entries`` (a string in ``entries_format``, or a JSON list of
    pairs); ``languages`` (the glossary's source and target codes) select a CSV's rows that
    name their pair. GlossaryError 400 (or 413 past the size limits) saying what is wrong."""
    if isinstance(entries, list):
        pairs = [_json_pair(item, index) for index, item in enumerate(entries)]
    elif isinstance(entries, str) and entries_format in FORMATS:
        size = len(entries.encode("utf-8"))
        if size > MAX_ENTRIES_BYTES:
            raise GlossaryError(
                413, "Glossary too large", f"{size} bytes of entries; at most {MAX_ENTRIES_BYTES}"
            )
        pairs = _tsv(entries) if entries_format == "tsv" else _csv(entries, languages)
    elif isinstance(entries, str):
        raise GlossaryError(400, "Unsupported entry format specified", f"one of {list(FORMATS)}")
    else:
        raise GlossaryError(400, "Missing or invalid argument: entries")
    check(pairs)
    return pairs


def check(pairs: list[Pair]) -> None:
    """GlossaryError unless ``pairs`` keep DeepL's rules (the module's docstring)."""
    if not pairs:
        raise GlossaryError(400, INVALID_ENTRIES, "no entries")
    if len(pairs) > MAX_ENTRIES:
        raise GlossaryError(
            413, "Glossary too large", f"{len(pairs)} entries; at most {MAX_ENTRIES}"
        )
    seen: dict[str, int] = {}
    for index, (source, target) in enumerate(pairs):
        for side, term in (("source", source), ("target", target)):
            problem = term_problem(term)
            if problem:
                raise GlossaryError(
                    400, INVALID_ENTRIES, f"entry {index + 1}: its {side} {problem}"
                )
        if source in seen:
            raise GlossaryError(
                400,
                INVALID_ENTRIES,
                f"entry {index + 1} duplicates the source term of entry {seen[source] + 1}",
            )
        seen[source] = index


def term_problem(term: str) -> str | None:
    """What is wrong with a term (or a glossary's name); None when nothing."""
    if not term:
        return "is empty"
    if len(term.encode("utf-8")) > MAX_TERM_BYTES:
        return f"has more than {MAX_TERM_BYTES} UTF-8 bytes"
    bad = next((c for c in term if _is_control(c)), None)
    if bad is not None:
        return f"holds the control character U+{ord(bad):04X} (tabs and line breaks included)"
    return None


def glossary_language(code: Any) -> str | None:
    """The glossary language of a request's code (``zh-Hant`` is ``zh``; a regional code such
    as ``EN-US`` is its language); None when no served language."""
    if not isinstance(code, str) or not code:
        return None
    found = lookup(code) or lookup(code.split("-", 1)[0])
    if found is None:
        return None
    return "zh" if found.code == "zh-Hant" else found.code


def to_tsv(pairs: list[Pair] | tuple[Pair, ...]) -> str:
    """DeepL's TSV of the entries: one ``source<TAB>target`` per line."""
    return "\n".join(f"{source}\t{target}" for source, target in pairs)


def _is_control(char: str) -> bool:
    code = ord(char)
    return code <= 0x1F or 0x7F <= code <= 0x9F or char in "\u2028\u2029"


def _lines(text: str) -> list[str]:
    """The text's lines, split at \\n, \\r\\n or \\r only (not at Unicode line breaks, which a
    term must not hold and the check names)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _tsv(text: str) -> list[Pair]:
    pairs = []
    for number, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        terms = line.split("\t")
        if len(terms) != 2:
            problem = "has no tab" if len(terms) < 2 else "has more than one tab"
            raise GlossaryError(
                400, INVALID_ENTRIES, f"line {number} {problem}: write it as source<TAB>target"
            )
        pairs.append((terms[0].strip(), terms[1].strip()))
    return pairs


def _csv(text: str, languages: tuple[str, str] | None) -> list[Pair]:
    pairs = []
    try:
        # CSV's own line reading: a quoted field may hold a line break (which the check names).
        rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as error:
        raise GlossaryError(400, INVALID_ENTRIES, f"the CSV cannot be read: {error}") from None
    for number, row in enumerate(rows, 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) not in (2, 4):
            raise GlossaryError(
                400,
                INVALID_ENTRIES,
                f"row {number} has {len(row)} fields: write source,target or "
                "source,target,source_lang,target_lang",
            )
        if len(row) == 4 and languages is not None:
            named = (glossary_language(row[2].strip()), glossary_language(row[3].strip()))
            if named != languages:
                continue  # another language pair's row
        pairs.append((row[0].strip(), row[1].strip()))
    return pairs


def _json_pair(item: Any, index: int) -> Pair:
    if isinstance(item, dict) and set(item) == {"source", "target"}:
        source, target = item["source"], item["target"]
    elif isinstance(item, list) and len(item) == 2:
        source, target = item
    else:
        source = target = None
    if not isinstance(source, str) or not isinstance(target, str):
        raise GlossaryError(
            400,
            INVALID_ENTRIES,
            f"entry {index + 1} must be [source, target] or "
            '{"source": "term", "target": "translation"} with two strings',
        )
    return source.strip(), target.strip()
