"""DeepL's language codes on the front end (:mod:`.compat`): its regional target codes, mapped
onto the model's languages, and the lists ``GET /v2/languages`` answers."""

from __future__ import annotations

from typing import Any

from hymt_serve.request.languages import LANGUAGES

# DeepL's regional codes: target variants the model does not tell apart, and Chinese scripts.
DEEPL_TARGETS = {
    "EN-GB": ("en", "English (British)"),
    "EN-US": ("en", "English (American)"),
    "PT-BR": ("pt", "Portuguese (Brazilian)"),
    "PT-PT": ("pt", "Portuguese (European)"),
    "ZH-HANS": ("zh", "Chinese (simplified)"),
    "ZH-HANT": ("zh-Hant", "Chinese (traditional)"),
}


def deepl_language_list(kind: str) -> list[dict[str, Any]]:
    """``GET /v2/languages``' answer for ``kind`` (``source`` or ``target``)."""
    if kind == "source":
        return [
            {"language": lang.code.upper(), "name": lang.english}
            for lang in LANGUAGES.values()
            if lang.code != "zh-Hant"  # a source is ZH whatever its script
        ]
    variants = {ours for ours, _ in DEEPL_TARGETS.values()}
    listed = [
        {"language": code, "name": name, "supports_formality": False}
        for code, (_, name) in DEEPL_TARGETS.items()
    ]
    listed += [
        {"language": lang.code.upper(), "name": lang.english, "supports_formality": False}
        for lang in LANGUAGES.values()
        if lang.code not in variants
    ]
    return listed
