"""A request's document fields (``document``, ``format``, ``previous_context``, and a
resuming call's ``done_segments``, ``segments_fingerprint``, ``max_segments``), validated
against the settings and the model family (:mod:`hymt_serve.request.documents` splits the
document once the service has its tokenizer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hymt_serve.core.settings import Settings
from hymt_serve.request.document_resume import RESUME_FIELDS, Resume, parse_resume
from hymt_serve.request.documents import DOCUMENT_FORMATS
from hymt_serve.request.errors import InvalidRequest, PayloadTooLarge
from hymt_serve.request.families import Profile
from hymt_serve.request.features import FEATURE_FIELDS
from hymt_serve.request.office import OFFICE_FORMATS
from hymt_serve.request.values import brief, flag, is_unicode

# The resume fields name the segments an earlier call translated (:mod:`.document_resume`).
DOCUMENT_FIELDS = ("document", "format", "previous_context", *RESUME_FIELDS)
# Feature fields a document cannot take: it keeps its own format, and Chimera refines candidates.
NOT_FOR_DOCUMENTS = ("preserve_format", "candidates")


@dataclass(frozen=True)
class DocumentInput:
    """A document to split into segments (:mod:`hymt_serve.request.documents`)."""

    text: str
    format: str
    previous_context: bool = False
    resume: Resume | None = None  # a durable job's call: some segments translated already


def parse_document(
    fields: Mapping[str, Any], settings: Settings, profile: Profile
) -> DocumentInput | None:
    """The document fields, validated; None for a request of texts."""
    if "document" not in fields:
        for name in DOCUMENT_FIELDS:
            if name in fields:
                raise InvalidRequest(
                    f"{name!r} applies to documents only", allowed='"document": "..."', field=name
                )
        return None
    if "text" in fields:
        raise InvalidRequest(
            "send 'text' or 'document', not both", allowed="one of them", field="document"
        )
    text = fields["document"]
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest(
            "document must be a non-empty string", allowed="the document's text", field="document"
        )
    if not is_unicode(text):
        raise InvalidRequest(
            "document contains a lone surrogate (not valid Unicode)",
            allowed="text that encodes as UTF-8",
            field="document",
        )
    kind = fields.get("format", "text")
    _check_size(text, kind, settings)
    if kind not in DOCUMENT_FORMATS:
        raise InvalidRequest(
            f"format must be one of {list(DOCUMENT_FORMATS)}, got {brief(kind)}",
            allowed=list(DOCUMENT_FORMATS),
            field="format",
        )
    for name in NOT_FOR_DOCUMENTS:
        if name in fields:
            why = {
                "preserve_format": "a document keeps its format itself",
                "candidates": "refinement takes sentences with their candidates",
            }[name]
            raise InvalidRequest(
                f"{name!r} does not apply to documents: {why}",
                allowed=[f for f in FEATURE_FIELDS if f not in NOT_FOR_DOCUMENTS],
                field=name,
            )
    previous = flag(fields, "previous_context")
    if previous and "context" not in profile.features:
        raise InvalidRequest(
            f"the loaded model ({profile.title}) has no context prompt for previous_context",
            allowed={"model": profile.title, "features": list(profile.features)},
            field="previous_context",
        )
    if previous and any(name in fields for name in FEATURE_FIELDS):
        raise InvalidRequest(
            "previous_context fills the context prompt; it cannot be combined with another "
            "feature field",
            allowed="previous_context alone",
            field="previous_context",
        )
    return DocumentInput(text, kind, previous, parse_resume(fields))


def _check_size(text: str, kind: object, settings: Settings) -> None:
    """A document's UTF-8 bytes, or an Office file's bytes from its base64's length (before
    anything is decoded), against their limits."""
    if kind in OFFICE_FORMATS:
        size, limit = len(text) * 3 // 4, settings.limits.max_office_bytes
        what = f"the {kind} file has about {size} bytes"
    else:
        size, limit = len(text.encode("utf-8")), settings.limits.max_document_bytes
        what = f"document has {size} bytes (UTF-8)"
    if size > limit:
        raise PayloadTooLarge(what, allowed=f"at most {limit} bytes", field="document")
