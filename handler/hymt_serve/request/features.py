"""Request fields that only some model families support: ``glossary`` and ``context``.

``glossary``: a list of ``{"source": "...", "target": "..."}`` term pairs; the pairs whose
source term occurs in a text go into that text's prompt (the terminology template).
``context``: text the translation should take into account without translating it (the
context template). The model cards define no prompt with both, so a request carries one.
A field the loaded model's family does not support is a 400 naming the model and what it
supports; sizes past the settings' limits are 413s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hymt_serve.request.errors import InvalidRequest, PayloadTooLarge
from hymt_serve.request.prompts import GlossaryPair, Profile
from hymt_serve.request.settings import Settings

FEATURE_FIELDS = ("glossary", "context")


def check_supported(fields: Mapping[str, Any], profile: Profile) -> None:
    """Raise InvalidRequest for a feature field the profile does not support."""
    for name in FEATURE_FIELDS:
        if name in fields and name not in profile.features:
            raise InvalidRequest(
                f"the loaded model ({profile.title}) does not support {name!r}",
                allowed={"model": profile.title, "features": list(profile.features)},
                field=name,
            )
    if all(name in fields for name in FEATURE_FIELDS):
        raise InvalidRequest(
            "glossary and context cannot be combined: the model card defines a prompt for each, "
            "none for both",
            allowed="one of glossary or context",
            field="context",
        )


def parse_glossary(value: Any, settings: Settings) -> tuple[GlossaryPair, ...]:
    """The glossary's (source, target) pairs, validated against the settings' limits."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "glossary must be a non-empty list of term pairs",
            allowed='[{"source": "term", "target": "translation"}, ...]',
            field="glossary",
        )
    if len(value) > settings.max_glossary_terms:
        raise PayloadTooLarge(
            f"glossary has {len(value)} pairs",
            allowed=f"at most {settings.max_glossary_terms} pairs per request",
            field="glossary",
        )
    return tuple(_pair(item, index, settings) for index, item in enumerate(value))


def _pair(item: Any, index: int, settings: Settings) -> GlossaryPair:
    where = f"glossary[{index}]"
    if not isinstance(item, dict) or set(item) != {"source", "target"}:
        raise InvalidRequest(
            f"{where} must be an object with exactly the keys 'source' and 'target'",
            allowed='{"source": "term", "target": "translation"}',
            field="glossary",
        )
    terms = []
    for key in ("source", "target"):
        term = item[key]
        if not isinstance(term, str) or not term.strip():
            raise InvalidRequest(
                f"{where}.{key} must be a non-empty string", allowed="text", field="glossary"
            )
        if len(term) > settings.max_term_chars:
            raise PayloadTooLarge(
                f"{where}.{key} has {len(term)} characters",
                allowed=f"at most {settings.max_term_chars} characters per term",
                field="glossary",
            )
        if "\n" in term:
            raise InvalidRequest(
                f"{where}.{key} spans several lines", allowed="one line", field="glossary"
            )
        terms.append(term.strip())
    return terms[0], terms[1]


def parse_context(value: Any, settings: Settings) -> str:
    """The context text, validated against the settings' limit."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(
            "context must be a non-empty string",
            allowed="text to take into account",
            field="context",
        )
    if len(value) > settings.max_context_chars:
        raise PayloadTooLarge(
            f"context has {len(value)} characters",
            allowed=f"at most {settings.max_context_chars} characters",
            field="context",
        )
    return value
