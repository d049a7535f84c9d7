"""Request fields that only some model families support (see :mod:`hymt_serve.request.families`).

- ``glossary``: ``[{"source": "...", "target": "..."}, ...]``; the pairs whose source term
  occurs in a text go into that text's prompt (HY-MT1.5, Hy-MT2).
- ``context``: text to take into account without translating it (HY-MT1.5; Hy-MT2's
  "background information").
- ``preserve_format``: ``"tags"`` (or ``true``): the text carries ``<s1>…</s1>`` tags;
  ``"markdown"`` / ``"html"``: its inline markup becomes such tags for the model and comes back
  as markup (:mod:`hymt_serve.request.markup`) (HY-MT1.5).
- ``style`` (a string), ``preferences`` (a list of instructions), ``delimiters`` (``true``:
  keep delimiters such as ``|`` or ``###`` as they are), ``data_format`` (the text is JSON,
  YAML, ...: translate only its user-facing text) (Hy-MT2).
- ``candidates``: translations for Chimera to refine, 1 to 6 per text (Hunyuan-MT-Chimera-7B,
  which requires them): a list of strings for one text, a list of such lists for a list.

The model cards define no prompt that combines two of them, so a request carries at most one.
A field the loaded model's family does not support is a 400 naming the model and what it
supports; sizes past the settings' limits are 413s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hymt_serve.core.settings import Settings
from hymt_serve.request.errors import InvalidRequest, PayloadTooLarge
from hymt_serve.request.families import FEATURE_TEMPLATES, Profile
from hymt_serve.request.prompts import GlossaryPair, PromptOptions

FEATURE_FIELDS = tuple(FEATURE_TEMPLATES)
MARKUP_KINDS = ("tags", "markdown", "html")
DATA_FORMATS = {
    name.lower(): name for name in ("JSON", "YAML", "XML", "HTML", "Markdown", "CSV", "TOML")
}
MAX_PREFERENCES = 16
MAX_CANDIDATES = 6  # the Chimera card's template numbers six


@dataclass(frozen=True)
class Features:
    """A request's validated feature fields."""

    options: PromptOptions = field(default_factory=PromptOptions)
    candidates: tuple[tuple[str, ...], ...] = ()  # per text (Chimera)


def parse_features(
    fields: Mapping[str, Any], profile: Profile, settings: Settings, texts: int, single: bool
) -> Features:
    """Validate the feature fields against the profile and the settings' limits."""
    present = [name for name in FEATURE_FIELDS if name in fields]
    for name in present:
        if name not in profile.features:
            raise InvalidRequest(
                f"the loaded model ({profile.title}) does not support {name!r}",
                allowed={"model": profile.title, "features": list(profile.features)},
                field=name,
            )
    for name in profile.required:
        if name not in fields:
            raise InvalidRequest(
                f"the loaded model ({profile.title}) needs {name!r} in every request",
                allowed={"model": profile.title, "required": list(profile.required)},
                field=name,
            )
    optional = [name for name in present if name not in profile.required]
    if len(optional) > 1:
        raise InvalidRequest(
            f"{' and '.join(optional)} cannot be combined: the model card defines a prompt for "
            "each, none for several",
            allowed=f"one of {optional}",
            field=optional[1],
        )
    options = PromptOptions(
        glossary=_glossary(fields["glossary"], settings) if "glossary" in fields else (),
        context=_text(fields, "context", settings.limits.max_context_chars),
        preserve_format=_markup(fields["preserve_format"]) if "preserve_format" in fields else None,
        style=_text(fields, "style", settings.limits.max_instruction_chars),
        preferences=_preferences(fields["preferences"], settings)
        if "preferences" in fields
        else (),
        delimiters=_true(fields, "delimiters"),
        data_format=_data_format(fields["data_format"]) if "data_format" in fields else None,
    )
    candidates = (
        _candidates(fields["candidates"], settings, texts, single) if "candidates" in fields else ()
    )
    return Features(options, candidates)


def _glossary(value: Any, settings: Settings) -> tuple[GlossaryPair, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "glossary must be a non-empty list of term pairs",
            allowed='[{"source": "term", "target": "translation"}, ...]',
            field="glossary",
        )
    if len(value) > settings.limits.max_glossary_terms:
        raise PayloadTooLarge(
            f"glossary has {len(value)} pairs",
            allowed=f"at most {settings.limits.max_glossary_terms} pairs per request",
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
    most = settings.limits.max_term_chars
    source = _one_line(item["source"], f"{where}.source", "glossary", most)
    target = _one_line(item["target"], f"{where}.target", "glossary", most)
    return source, target


def _bounded(value: Any, where: str, field: str, limit: int) -> str:
    """A string with a visible character and at most ``limit`` characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{where} must be a non-empty string", allowed="text", field=field)
    if len(value) > limit:
        raise PayloadTooLarge(
            f"{where} has {len(value)} characters",
            allowed=f"at most {limit} characters",
            field=field,
        )
    return value


def _one_line(value: Any, where: str, field: str, limit: int) -> str:
    """A bounded string on one line, stripped."""
    stripped = _bounded(value, where, field, limit).strip()
    if "\n" in stripped:
        raise InvalidRequest(f"{where} spans several lines", allowed="one line", field=field)
    return stripped


def _text(fields: Mapping[str, Any], name: str, limit: int) -> str | None:
    """A free-text field (context, style), or None when absent."""
    return _bounded(fields[name], name, name, limit) if name in fields else None


def _markup(value: Any) -> str:
    if value is True:
        return "tags"
    if value not in MARKUP_KINDS:
        raise InvalidRequest(
            f"preserve_format must be true or one of {list(MARKUP_KINDS)}",
            allowed=[True, *MARKUP_KINDS],
            field="preserve_format",
        )
    return str(value)


def _true(fields: Mapping[str, Any], name: str) -> bool:
    if name not in fields:
        return False
    if fields[name] is not True:
        raise InvalidRequest(
            f"{name} must be true (leave it out for false)", allowed=[True], field=name
        )
    return True


def _preferences(value: Any, settings: Settings) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "preferences must be a non-empty list of instructions",
            allowed='["Keep product names in English", ...]',
            field="preferences",
        )
    if len(value) > MAX_PREFERENCES:
        raise PayloadTooLarge(
            f"preferences has {len(value)} items",
            allowed=f"at most {MAX_PREFERENCES}",
            field="preferences",
        )
    return tuple(
        _one_line(item, f"preferences[{i}]", "preferences", settings.limits.max_instruction_chars)
        for i, item in enumerate(value)
    )


def _data_format(value: Any) -> str:
    name = DATA_FORMATS.get(value.lower()) if isinstance(value, str) else None
    if name is None:
        raise InvalidRequest(
            "data_format must name the text's format",
            allowed=sorted(DATA_FORMATS),
            field="data_format",
        )
    return name


def _candidates(
    value: Any, settings: Settings, texts: int, single: bool
) -> tuple[tuple[str, ...], ...]:
    shape = "a list of 1 to 6 strings" + ("" if single else " per text, in a list")
    if not isinstance(value, list) or (not single and len(value) != texts):
        raise InvalidRequest(
            f"candidates must be {shape}",
            allowed=f"{shape} ({texts} texts)",
            field="candidates",
        )
    per_text = [value] if single else value
    return tuple(_candidate_list(item, i, settings, single) for i, item in enumerate(per_text))


def _candidate_list(value: Any, index: int, settings: Settings, single: bool) -> tuple[str, ...]:
    where = "candidates" if single else f"candidates[{index}]"
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_CANDIDATES:
        raise InvalidRequest(
            f"{where} must be a list of 1 to {MAX_CANDIDATES} translations",
            allowed=f"1 to {MAX_CANDIDATES} strings",
            field="candidates",
        )
    limit = settings.limits.max_chars_per_text
    return tuple(
        _bounded(item, f"{where}[{position}]", "candidates", limit)
        for position, item in enumerate(value)
    )
