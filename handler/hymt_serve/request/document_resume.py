"""Resuming a document: a request that names the segments already translated (by an earlier
call that a restart cut short) gets rows for the others only.

The fields (docs/jobs.md): ``done_segments`` ``{"<index>": translation}`` (translations as an
earlier reply's ``segment_translations`` gave them), ``segments_fingerprint`` (that reply's:
required with ``done_segments``) and ``max_segments`` (translate at most this many of the
missing segments in this call, in order). Splitting is deterministic for the same document,
fields and tokenizer; the fingerprint (SHA-256 of the format and every piece) proves it, and a
document that splits otherwise now (another tokenizer, another ``document_segment_tokens``)
is refused rather than given translations of other segments.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hymt_serve.request.documents import Document
from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.values import brief, is_unicode

RESUME_FIELDS = ("done_segments", "segments_fingerprint", "max_segments")
MAX_SEGMENTS_BOUND = 100_000  # above any document's max_document_segments


@dataclass(frozen=True)
class Resume:
    """What a resuming request gives: the translated segments by index, the fingerprint of
    the split they belong to (None on a first call) and how many more to translate."""

    done: Mapping[int, str]
    fingerprint: str | None = None
    max_segments: int | None = None


def parse_resume(fields: Mapping[str, Any]) -> Resume | None:
    """The resume fields, validated (InvalidRequest naming the field); None without them."""
    if not any(name in fields for name in RESUME_FIELDS):
        return None
    done = _done(fields.get("done_segments", {}))
    fingerprint = fields.get("segments_fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise InvalidRequest(
            f"segments_fingerprint must be a string, got {brief(fingerprint)}",
            allowed="an earlier reply's segments_fingerprint",
            field="segments_fingerprint",
        )
    if done and fingerprint is None:
        raise InvalidRequest(
            "done_segments needs the segments_fingerprint of the reply that gave them",
            allowed="an earlier reply's segments_fingerprint",
            field="segments_fingerprint",
        )
    limit = fields.get("max_segments")
    if limit is not None and (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_SEGMENTS_BOUND
    ):
        raise InvalidRequest(
            f"max_segments must be an integer in [1, {MAX_SEGMENTS_BOUND}], got {brief(limit)}",
            allowed=f"1 to {MAX_SEGMENTS_BOUND}",
            field="max_segments",
        )
    return Resume(done, fingerprint, limit)


def _done(value: Any) -> dict[int, str]:
    """``done_segments`` as {index: translation}."""
    if not isinstance(value, dict):
        raise InvalidRequest(
            f"done_segments must be an object, got {brief(value)}",
            allowed='{"<segment index>": "<its translation>"}',
            field="done_segments",
        )
    done = {}
    for key, text in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 6):
            raise InvalidRequest(
                f"done_segments keys are segment indexes, got {brief(key)}",
                allowed="decimal indexes from 0",
                field="done_segments",
            )
        if not isinstance(text, str) or not is_unicode(text):
            raise InvalidRequest(
                f"done_segments[{key}] must be a string of valid Unicode",
                allowed="the segment's translation",
                field="done_segments",
            )
        done[int(key)] = text
    return done


def fingerprint(document: Document) -> str:
    """SHA-256 (hex) of the document's format and every piece, each length-prefixed."""
    digest = hashlib.sha256(document.format.encode())
    for piece in document.pieces:
        data = piece.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


@dataclass(frozen=True)
class Resumed(Document):
    """``whole`` with ``done`` translated: :attr:`segments` are the ones to translate now
    (``todo``, in order); the reply carries their translations and, once no segment is
    missing, the document."""

    whole: Document
    done: Mapping[int, str]
    todo: tuple[int, ...]
    fingerprint: str

    @property
    def segments(self) -> tuple[str, ...]:
        segments = self.whole.segments
        return tuple(segments[index] for index in self.todo)

    def context_of(self, index: int) -> str | None:
        return self.whole.context_of(self.todo[index])

    def line_of(self, index: int) -> int:
        return self.whole.line_of(self.todo[index])

    def before(self, index: int) -> str | None:
        return self.whole.before(self.todo[index])

    def reply_fields(self, translations: Sequence[str]) -> dict[str, Any]:
        """This call's translations by index, the fingerprint, the counts, and the document
        (None while segments are missing)."""
        merged = {**self.done, **dict(zip(self.todo, translations, strict=True))}
        total = len(self.whole.segments)
        complete = len(merged) == total
        return {
            "document": self.whole.assemble([merged[i] for i in range(total)])
            if complete
            else None,
            "segment_translations": {
                str(index): text for index, text in zip(self.todo, translations, strict=True)
            },
            "segments_fingerprint": self.fingerprint,
            "segments_total": total,
            "segments_done": len(merged),
        }


def resume(document: Document, given: Resume) -> Resumed:
    """``document`` with ``given``'s translations in place; InvalidRequest when they belong to
    another split (fingerprint) or name a segment it does not have."""
    found = fingerprint(document)
    if given.fingerprint is not None and given.fingerprint != found:
        raise InvalidRequest(
            "the document splits into other segments than those segments_fingerprint names "
            "(another document, fields, tokenizer or segment budget): start it again without "
            "done_segments",
            allowed=found,
            field="segments_fingerprint",
        )
    total = len(document.segments)
    beyond = [index for index in given.done if index >= total]
    if beyond:
        raise InvalidRequest(
            f"done_segments names segment {beyond[0]}; the document has {total}",
            allowed=f"indexes 0 to {total - 1}",
            field="done_segments",
        )
    todo = tuple(index for index in range(total) if index not in given.done)
    if given.max_segments is not None:
        todo = todo[: given.max_segments]
    return Resumed(document.format, document.pieces, document, given.done, todo, found)
