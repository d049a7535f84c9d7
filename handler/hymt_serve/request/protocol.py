"""The request API: parsing and validating one request body, and rendering its response.

Pure functions (no torch), testable in milliseconds. Request body (JSON object)::

    {"text": "..." | ["...", ...],           one text or a list of texts, or:
     "document": "...",                      a whole document (instead of "text"), with
     "format": "markdown",                   text | markdown | html | srt (default text) and
     "previous_context": true,               the previous segment as context (optional)
     "target_lang": "en",                    required (alias "tgt_lang")
     "source_lang": "zh",                    optional (alias "src_lang"); "auto": each
                                             text's language detected (request.detect)
     "max_new_tokens": 128,                  optional, 1..the server's cap
     "sampling": true,                       optional, default false (greedy)
     "stream": true,                         optional, default false; one text (its text
                                             deltas) or a document (its progress)
     "temperature": 0.7, "top_p": 0.6,       optional with sampling, default the model card's
     "top_k": 20, "repetition_penalty": 1.05,
     "glossary": [...], "context": "...", ...}  optional fields of the families that support
                                                them (:mod:`hymt_serve.request.features`)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hymt_serve.core.config import Sampling, spec_of
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import SamplingParams
from hymt_serve.request.detect import Detection, detect
from hymt_serve.request.document_fields import DOCUMENT_FIELDS, DocumentInput, parse_document
from hymt_serve.request.errors import (
    InvalidRequest,
    PayloadTooLarge,
    SameLanguage,
    UnsupportedLanguage,
)
from hymt_serve.request.families import HUNYUAN_MT_7B, Profile
from hymt_serve.request.features import FEATURE_FIELDS, Features, parse_features
from hymt_serve.request.languages import LANGUAGES, SUPPORTED_CODES, Language, lookup
from hymt_serve.request.office import OFFICE_FORMATS, opening_text
from hymt_serve.request.values import brief, flag, is_unicode

ALIASES = {"src_lang": "source_lang", "tgt_lang": "target_lang"}
# A valid body nests 2 levels (object -> list of texts); anything far deeper is refused before
# any code walks it recursively (repr, comparisons) and hits Python's recursion limit.
MAX_DEPTH = 8
DETECT_DOCUMENT_CHARS = 4000  # a document's language is detected from its opening
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")
FIELDS = (
    "text",
    *DOCUMENT_FIELDS,
    "source_lang",
    "target_lang",
    "max_new_tokens",
    "sampling",
    "stream",
    *SAMPLING_FIELDS,
    *FEATURE_FIELDS,
)


@dataclass(frozen=True)
class TranslationRequest:
    """A validated request: one or more texts, one language pair, generation options."""

    texts: tuple[str, ...]
    single: bool
    source: Language | None
    target: Language
    max_new_tokens: int
    sampling: SamplingParams | None
    stream: bool = False
    features: Features = field(default_factory=Features)
    document: DocumentInput | None = None  # a document request: ``texts`` is empty
    # source_lang "auto": each text's detected language, once at parsing (a document: one, of
    # its opening); None when the source is named or absent
    detected: tuple[Detection | None, ...] | None = None

    def source_for(self, index: int) -> Language | None:
        """The source language of text ``index``'s prompt (any segment of a document): the
        named one, or with ``auto`` the detected one (None when detection was unsure: the
        prompt then goes without it)."""
        if self.detected is None:
            return self.source
        found = self.detected[0 if self.document else index]
        return LANGUAGES[found.language] if found else None


def decode_body(body: Any) -> dict[str, Any]:
    """The JSON object from a TorchServe request body.

    TorchServe hands over a JSON body already decoded (a dict for an object), raw bytes for
    content types it does not decode (parsed here as UTF-8 JSON), a str for ``text/*`` bodies
    and for a top-level JSON string (both refused), and None when there is no body: a
    form-encoded post (curl -d without a JSON content type) arrives as form fields.
    """
    if body is None:
        raise InvalidRequest(
            "no JSON body found; send a JSON object with the header "
            "'Content-Type: application/json'",
            allowed={"fields": list(FIELDS)},
        )
    if isinstance(body, str):
        raise InvalidRequest(
            "the body is text, not a JSON object; send a JSON object with the "
            "header 'Content-Type: application/json'",
            allowed={"fields": list(FIELDS)},
        )
    if isinstance(body, (bytes, bytearray)):
        body = _json_from_bytes(bytes(body))
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"request body must be a JSON object, got {type(body).__name__}",
            allowed={"fields": list(FIELDS)},
        )
    if _nested_deeper_than(body, MAX_DEPTH):
        raise InvalidRequest(
            f"request body is nested more than {MAX_DEPTH} levels deep",
            allowed="a JSON object as documented (it nests 2 levels)",
        )
    return body


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests past ``limit`` levels (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return False


def _json_from_bytes(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"request body is not valid UTF-8 (byte {exc.start})", allowed="a UTF-8 JSON object"
        ) from exc
    if not text.strip():
        raise InvalidRequest("request body is empty", allowed="a JSON object")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"request body is not valid JSON: {exc}", allowed="a JSON object"
        ) from exc
    except RecursionError as exc:
        raise InvalidRequest(
            "request body is nested too deeply", allowed="a JSON object as documented"
        ) from exc
    except ValueError as exc:  # Python refuses integers of more than 4,300 digits
        raise InvalidRequest(
            "request body holds a number too long to read", allowed="a JSON object as documented"
        ) from exc


def parse_request(
    body: Any, settings: Settings, profile: Profile = HUNYUAN_MT_7B
) -> TranslationRequest:
    """Validate one request body against the settings' limits and the model family's features.

    Raises InvalidRequest (400) or PayloadTooLarge (413) saying what was wrong and what is allowed.
    """
    fields = _canonical_fields(decode_body(body))
    document = parse_document(fields, settings, profile)
    texts, single = ((), False) if document else _texts(fields.get("text"), settings)
    features = parse_features(fields, profile, settings, len(texts), single)
    target = _language(fields.get("target_lang"), "target_lang", required=True)
    auto = _is_auto(fields.get("source_lang"))
    detected = _detected(texts, document) if auto else None
    if detected is not None and profile.needs_source_lang:
        _check_detectable(detected)
    raw_source = None if auto else fields.get("source_lang")
    source = _language(raw_source, "source_lang", required=profile.needs_source_lang and not auto)
    assert target is not None
    if source is not None and source.code == target.code:
        raise SameLanguage(
            f"source_lang and target_lang are both {target.code!r}; nothing to translate",
            allowed="two different language codes",
            field="target_lang",
        )
    return TranslationRequest(
        texts=texts,
        single=single,
        source=source,
        target=target,
        max_new_tokens=_max_new_tokens(
            fields.get("max_new_tokens"), settings.limits.max_new_tokens
        ),
        sampling=_sampling(fields, settings.sampling),
        stream=_stream(fields, single or document is not None, features),
        features=features,
        document=document,
        detected=detected,
    )


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def _detected(
    texts: tuple[str, ...], document: DocumentInput | None
) -> tuple[Detection | None, ...]:
    """Each text's language; a document's from its opening (enough, and detection walks every
    character)."""
    if document is not None and document.format in OFFICE_FORMATS:  # sent in base64
        return (detect(opening_text(document.text, document.format, DETECT_DOCUMENT_CHARS)),)
    if document is not None:
        return (detect(document.text[:DETECT_DOCUMENT_CHARS]),)
    return tuple(detect(text) for text in texts)


def _check_detectable(detected: tuple[Detection | None, ...]) -> None:
    """For a template that names the source language: every text's language must be detected."""
    for index, found in enumerate(detected):
        if found is None:
            raise InvalidRequest(
                f"the language of text {index} could not be detected, and this model family's "
                "template names the source language",
                allowed=list(SUPPORTED_CODES),
                field="source_lang",
            )


def _canonical_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in body.items():
        name = ALIASES.get(key, key)
        if name not in FIELDS:
            raise InvalidRequest(
                f"unknown field {brief(key)}", allowed=[*FIELDS, *ALIASES], field=key
            )
        if name in fields and fields[name] != value:
            raise InvalidRequest(
                f"{name!r} is given twice (once as an alias) with different values",
                allowed=f"one of {name!r} or its alias",
                field=key,
            )
        fields[name] = value
    return fields


def _texts(value: Any, settings: Settings) -> tuple[tuple[str, ...], bool]:
    single = isinstance(value, str)
    items = [value] if single else value
    if not isinstance(items, list) or not items:
        raise InvalidRequest(
            "'text' must be a non-empty string or a non-empty list of strings",
            allowed="string or list of strings",
            field="text",
        )
    if len(items) > settings.limits.max_texts_per_request:
        raise PayloadTooLarge(
            f"{len(items)} texts in one request",
            allowed=f"at most {settings.limits.max_texts_per_request}",
            field="text",
        )
    for index, item in enumerate(items):
        where = "text" if single else f"text[{index}]"
        if not isinstance(item, str):
            raise InvalidRequest(
                f"{where} must be a string, got {type(item).__name__}",
                allowed="string",
                field="text",
            )
        if not is_unicode(item):
            raise InvalidRequest(
                f"{where} contains a lone surrogate (not valid Unicode)",
                allowed="text that encodes as UTF-8",
                field="text",
            )
        if not item.strip():
            raise InvalidRequest(
                f"{where} is empty or whitespace only",
                allowed="text with at least one visible character",
                field="text",
            )
        if len(item) > settings.limits.max_chars_per_text:
            raise PayloadTooLarge(
                f"{where} has {len(item)} characters",
                allowed=f"at most {settings.limits.max_chars_per_text}",
                field="text",
            )
    return tuple(items), single


def _stream(fields: Mapping[str, Any], single: bool, features: Features) -> bool:
    """``single``: one text or a document (a list of texts cannot stream)."""
    value = flag(fields, "stream")
    if value and not single:
        raise InvalidRequest(
            "stream needs a single text, got a list",
            allowed='"text": "..." with "stream": true',
            field="stream",
        )
    if value and features.options.preserve_format:
        raise InvalidRequest(
            "preserve_format cannot stream: its tags become markup once the whole text is back",
            allowed="stream or preserve_format",
            field="stream",
        )
    return value


def _language(value: Any, name: str, *, required: bool) -> Language | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        missing = (
            "is required" if value is None else f"must be a string, got {type(value).__name__}"
        )
        raise InvalidRequest(f"{name} {missing}", allowed=list(SUPPORTED_CODES), field=name)
    language = lookup(value)
    if language is None:
        raise UnsupportedLanguage(
            f"{name} {brief(value)} is not a supported language code",
            allowed=list(SUPPORTED_CODES),
            field=name,
        )
    return language


def _max_new_tokens(value: Any, cap: int) -> int:
    if value is None:
        return cap
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
        raise InvalidRequest(
            f"max_new_tokens must be an integer in [1, {cap}], got {brief(value)}",
            allowed=f"[1, {cap}]",
            field="max_new_tokens",
        )
    return value


def _sampling(fields: Mapping[str, Any], defaults: SamplingParams) -> SamplingParams | None:
    enabled = flag(fields, "sampling")
    overrides = {key: fields[key] for key in SAMPLING_FIELDS if key in fields}
    if overrides and not enabled:
        raise InvalidRequest(
            f'{sorted(overrides)} only apply with "sampling": true',
            allowed="sampling: true, or leave them out",
            field=sorted(overrides)[0],
        )
    if not enabled:
        return None
    for key, value in overrides.items():
        _check_sampling_value(key, value)
    return replace(defaults, **overrides)


def _check_sampling_value(key: str, value: Any) -> None:
    spec = spec_of(Sampling, key)
    if key == "top_k":
        low, high = spec.low, spec.high
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidRequest(
                f"top_k must be an integer in [{low}, {high}], got {brief(value)}",
                allowed=f"[{low}, {high}]",
                field=key,
            )
        return
    low_f, high_f = spec.low, spec.high
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not low_f < value <= high_f:
        raise InvalidRequest(
            f"{key} must be a number in ({low_f}, {high_f}], got {brief(value)}",
            allowed=f"({low_f}, {high_f}]",
            field=key,
        )
