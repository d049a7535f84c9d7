"""Prompt building: a pure function from (text, languages, options) to the model card's user
turn for the loaded family's profile (:mod:`hymt_serve.request.families`).

The chat template (applied by the engine with the model's own tokenizer) wraps this text as one
user turn; there is no system prompt. A request selects at most one feature template (the cards
define none that combines two); without one, the plain template: the Chinese one when Chinese
is on either side, else the English one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hymt_serve.request.families import HUNYUAN_MT_7B, Profile
from hymt_serve.request.languages import Language, looks_chinese

Template = str  # "zh", "en" or a feature's template name (families.FEATURE_TEMPLATES)
GlossaryPair = tuple[str, str]  # (source term, target term)


@dataclass(frozen=True)
class PromptOptions:
    """A request's feature fields, validated (:mod:`hymt_serve.request.features`)."""

    glossary: tuple[GlossaryPair, ...] = ()
    context: str | None = None
    preserve_format: str | None = None  # "tags", "markdown", "html": the prompt holds <sN> tags
    style: str | None = None
    preferences: tuple[str, ...] = ()
    delimiters: bool = False
    data_format: str | None = None  # its display name: "JSON", "Markdown", ...


def choose_language(text: str, source: Language | None, target: Language) -> str:
    """ "zh" when Chinese (zh, zh-Hant, yue) is on either side, else "en".

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
    options: PromptOptions = PromptOptions(),
    candidates: Sequence[str] = (),
) -> tuple[str, Template]:
    """The user-turn text for translating ``text`` into ``target``, and which template it used.

    The caller has checked the options against the profile. A glossary lists the pairs whose
    source term occurs in the text, one per line (none occurring: the plain template).
    ``candidates`` are Chimera's translations to refine (numbered in order).
    """
    language = choose_language(text, source, target)
    tmpl = _Templates(profile, language, target)
    if candidates:
        assert source is not None, "the refine template names the source language"
        numbered = [
            tmpl.line("candidate", number=n, candidate=c) for n, c in enumerate(candidates, 1)
        ]
        joined = "\n".join(numbered)
        return tmpl.fill("refine", text, source=source.english, candidates=joined)
    terms = relevant_terms(text, options.glossary)
    if terms:
        lines = [tmpl.line("term", source=s, target=t) for s, t in terms]
        return tmpl.fill("terminology", text, terms="\n".join(lines))
    if options.context is not None:
        return tmpl.fill("context", text, context=options.context)
    if options.preserve_format:
        return tmpl.fill("formatted", text)
    if options.style is not None:
        return tmpl.fill("style", text, style=options.style)
    if options.preferences:
        tasks = [*options.preferences, tmpl.line("last_task")]
        numbered = [tmpl.line("task", number=n, task=t) for n, t in enumerate(tasks, 1)]
        return tmpl.fill("preferences", text, tasks="\n".join(numbered))
    if options.delimiters:
        return tmpl.fill("delimiters", text)
    if options.data_format is not None:
        return tmpl.fill("structured", text, data_format=options.data_format)
    return tmpl.fill(language, text)


class _Templates:
    """One profile's templates for one prompt language; a template that exists in one language
    only is used in that language. Language names follow the template's language."""

    def __init__(self, profile: Profile, language: str, target: Language) -> None:
        self.templates = profile.templates
        self.language = language
        self.target = target

    def _key(self, name: str) -> tuple[str, str]:
        if name in self.templates:
            return name, self.language
        for language in (self.language, "zh", "en"):
            if f"{name}.{language}" in self.templates:
                return f"{name}.{language}", language
        raise KeyError(f"the profile has no template {name!r}")

    def line(self, name: str, **values: object) -> str:
        key, language = self._key(name)
        return self.templates[key].format(**{"target": self.target.name_in(language), **values})

    def fill(self, name: str, text: str, **values: object) -> tuple[str, Template]:
        return self.line(name, text=text, **values), name
