"""Prompt building: a pure function from (text, languages) to the model card's user turn.

The chat template (applied by the engine with the model's own tokenizer) wraps this text as one
user turn; there is no system prompt.
"""

from __future__ import annotations

from typing import Literal

from hymt_serve.request.languages import Language, looks_chinese

Template = Literal["zh", "en"]

_ZH_TEMPLATE = "把下面的文本翻译成{target}，不要额外解释。\n\n{text}"
_EN_TEMPLATE = (
    "Translate the following segment into {target}, without additional explanation.\n\n{text}"
)


def choose_template(text: str, source: Language | None, target: Language) -> Template:
    """The Chinese template when Chinese (zh, zh-Hant, yue) is on either side, else English.

    Without a source language the text's script decides the source side: mostly Han characters
    with no kana or hangul counts as Chinese.
    """
    source_is_chinese = source.is_chinese if source is not None else looks_chinese(text)
    return "zh" if source_is_chinese or target.is_chinese else "en"


def build_prompt(text: str, source: Language | None, target: Language) -> tuple[str, Template]:
    """The user-turn text for translating ``text`` into ``target``, and which template it used."""
    template = choose_template(text, source, target)
    if template == "zh":
        return _ZH_TEMPLATE.format(target=target.chinese, text=text), template
    return _EN_TEMPLATE.format(target=target.english, text=text), template
