"""Prompt building: a pure function from (text, languages, options) to the model card's user
turn, for each model family's *profile*.

The chat template (applied by the engine with the model's own tokenizer) wraps this text as one
user turn; there is no system prompt. Templates are verbatim from the model cards
(Tencent-Hunyuan/Hunyuan-MT and Tencent-Hunyuan/HY-MT): Hunyuan-MT-7B has one template with
Chinese on either side and one otherwise; HY-MT1.5 rewords the Chinese one and adds
terminology (``glossary``) and ``context`` templates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hymt_serve.request.errors import ConfigurationError
from hymt_serve.request.languages import Language, looks_chinese

Template = Literal["zh", "en", "terminology", "context"]
GlossaryPair = tuple[str, str]  # (source term, target term)

_EN_TEMPLATE = (
    "Translate the following segment into {target}, without additional explanation.\n\n{text}"
)
_HY_MT_7B_ZH = "把下面的文本翻译成{target}，不要额外解释。\n\n{text}"
_HY_MT15_ZH = "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
_HY_MT15_TERMS = (
    "参考下面的翻译：\n{terms}\n\n"
    "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n{text}"
)
_HY_MT15_TERM = "{source} 翻译成 {target}"
_HY_MT15_CONTEXT = (
    "{context}\n参考上面的信息，把下面的文本翻译成{target}，注意不需要翻译上文，也不要额外解释：\n"
    "{text}\n"
)


@dataclass(frozen=True)
class Profile:
    """A model family: its plain templates and the request features its card documents."""

    name: str  # the prompt_family setting's value
    title: str
    zh_template: str
    en_template: str
    features: tuple[str, ...] = ()  # optional request fields: "glossary", "context"

    def describe(self) -> dict[str, Any]:
        return {"prompt_family": self.name, "model_family": self.title, "features": self.features}


HUNYUAN_MT_7B = Profile("hunyuan-mt-7b", "Hunyuan-MT-7B", _HY_MT_7B_ZH, _EN_TEMPLATE)
HY_MT15 = Profile("hy-mt1.5", "HY-MT1.5", _HY_MT15_ZH, _EN_TEMPLATE, ("glossary", "context"))
PROFILES = {profile.name: profile for profile in (HUNYUAN_MT_7B, HY_MT15)}
# Names in a model folder's path or config that identify a family (checked in this order).
_MARKS = (("hy-mt1.5", HY_MT15), ("hy-mt1_5", HY_MT15), ("hunyuan-mt", HUNYUAN_MT_7B))


def detect_profile(model_path: Path, prompt_family: str = "auto") -> Profile:
    """The profile the ``prompt_family`` setting names, or for ``auto`` the one the model
    folder's path or its config's ``_name_or_path`` names (Hunyuan-MT-7B when neither does).

    Raises ConfigurationError for an unknown family name.
    """
    if prompt_family != "auto":
        if prompt_family not in PROFILES:
            raise ConfigurationError(
                f"prompt_family must be auto or one of {sorted(PROFILES)}, got {prompt_family!r}"
            )
        return PROFILES[prompt_family]
    names = str(model_path).lower()
    try:
        config = json.loads((model_path / "config.json").read_text())
        names += " " + str(config.get("_name_or_path", "")).lower()
    except (OSError, ValueError):
        pass
    return next((profile for mark, profile in _MARKS if mark in names), HUNYUAN_MT_7B)


def choose_template(text: str, source: Language | None, target: Language) -> Template:
    """The Chinese template when Chinese (zh, zh-Hant, yue) is on either side, else English.

    Without a source language the text's script decides the source side: mostly Han characters
    with no kana or hangul counts as Chinese.
    """
    source_is_chinese = source.is_chinese if source is not None else looks_chinese(text)
    return "zh" if source_is_chinese or target.is_chinese else "en"


def relevant_terms(text: str, glossary: Sequence[GlossaryPair]) -> list[GlossaryPair]:
    """The glossary pairs whose source term occurs in ``text`` (case-insensitively)."""
    folded = text.casefold()
    return [pair for pair in glossary if pair[0].casefold() in folded]


def build_prompt(
    text: str,
    source: Language | None,
    target: Language,
    *,
    profile: Profile = HUNYUAN_MT_7B,
    glossary: Sequence[GlossaryPair] = (),
    context: str | None = None,
) -> tuple[str, Template]:
    """The user-turn text for translating ``text`` into ``target``, and which template it used.

    With a glossary, the terminology template lists the pairs whose source term occurs in the
    text, one per line (none occurring: the plain template); with a context, the context
    template. Both are the profile's features (the caller checks them); their templates are
    Chinese and name the target language in Chinese.
    """
    terms = relevant_terms(text, glossary)
    if terms:
        lines = "\n".join(_HY_MT15_TERM.format(source=s, target=t) for s, t in terms)
        return _HY_MT15_TERMS.format(terms=lines, target=target.chinese, text=text), "terminology"
    if context is not None:
        prompt = _HY_MT15_CONTEXT.format(context=context, target=target.chinese, text=text)
        return prompt, "context"
    template = choose_template(text, source, target)
    if template == "zh":
        return profile.zh_template.format(target=target.chinese, text=text), template
    return profile.en_template.format(target=target.english, text=text), template
