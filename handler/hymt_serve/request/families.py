"""The model families: each one's prompt templates (verbatim from its model card) and the
request features the card documents, and choosing the family of a model folder.

Sources: the Tencent-Hunyuan/Hunyuan-MT README (Hunyuan-MT-7B, Hunyuan-MT-Chimera-7B), the
Tencent-Hunyuan/HY-MT README (HY-MT1.5) and the Tencent-Hunyuan/Hy-MT2 README (Hy-MT2). The
Hy-MT2 card gives its templates as a rendered Markdown table: here they are that table's text
with the emphasis marks removed and ``<br>`` as a line break, Chinese names in the Chinese
templates and English names in the English ones, as the card says. One reading is ours: its
Chinese structured-data template names ``{source_text}`` inside the task sentence, where the
English one says "the following data"; we refer to the data section there instead of pasting
the source text twice.

Every template is a ``str.format`` string: user text is a format *argument*, so braces in it
stay verbatim (literal braces of a template are doubled).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hymt_serve.core.errors import ConfigurationError

# Template names (the response's per-text "template"), and which request field selects each.
FEATURE_TEMPLATES = {
    "glossary": "terminology",
    "context": "context",
    "preserve_format": "formatted",
    "style": "style",
    "preferences": "preferences",
    "delimiters": "delimiters",
    "data_format": "structured",
    "candidates": "refine",
}

_EN_SEGMENT = (
    "Translate the following segment into {target}, without additional explanation.\n\n{text}"
)
_MT15_ZH = "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"

HUNYUAN_MT_7B_TEMPLATES = {
    "zh": "把下面的文本翻译成{target}，不要额外解释。\n\n{text}",
    "en": _EN_SEGMENT,
}

HY_MT15_TEMPLATES = {
    "zh": _MT15_ZH,
    "en": _EN_SEGMENT,
    "terminology.zh": (
        "参考下面的翻译：\n{terms}\n\n"
        "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n{text}"
    ),
    "term.zh": "{source} 翻译成 {target}",
    "context.zh": (
        "{context}\n参考上面的信息，把下面的文本翻译成{target}，注意不需要翻译上文，"
        "也不要额外解释：\n{text}\n"
    ),
    # The card's formatted-text template names the target 中文; {target} is that slot.
    "formatted.zh": (
        "将以下<source></source>之间的文本翻译为{target}，注意只需要输出翻译后的结果，"
        "不要额外解释，原文中的<sn></sn>标签表示标签内文本包含格式信息，"
        "需要在译文中相应的位置尽量保留该标签。输出格式为：<target>str</target>\n\n"
        "<source>{text}</source>"
    ),
}

HY_MT2_TEMPLATES = {
    "zh": _MT15_ZH,
    "en": (
        "Translate the following text into {target}. Note that you should only output the "
        "translated result without any additional explanation:\n\n{text}"
    ),
    "terminology.zh": (
        "参考下面的翻译：\n{terms}\n"
        "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
    ),
    "terminology.en": (
        "Reference the following translations:\n{terms}\n\n"
        "Translate the following text into {target}. Note that you must ONLY output the "
        "translated result without any additional explanation:\n\n{text}"
    ),
    "term.zh": "{source} 翻译成 {target}",
    "term.en": "{source} translates to {target}",
    "style.zh": "请将以下文本翻译为{target}。\n注意翻译的风格要严格符合【{style}】\n\n{text}",
    "style.en": (
        "Please translate the following text into {target}. Note that the translation style "
        "must strictly conform to [{style}]:\n\n{text}"
    ),
    "preferences.zh": "【待翻译文本】\n{text}\n\n【翻译任务】\n{tasks}",
    "preferences.en": "[Source Text]\n{text}\n\n[Translation Tasks]\n{tasks}",
    "task.zh": "{number}、{task}",
    "task.en": "{number}. {task}",
    "last_task.zh": "将【待翻译文本】翻译为{target}。",
    "last_task.en": "Translate the [Source Text] into {target}.",
    "delimiters.zh": (
        "请将以下文本准确翻译为{target}。\n你必须在译文中保留等量的分隔符，"
        "绝对不可遗漏、转义或翻译该符号，并注意分隔符的位置。\n\n{text}"
    ),
    "delimiters.en": (
        "Please accurately translate the following text into {target}.\nYou must retain the "
        "exact same number of delimiters in the translation. Strictly do not omit, escape, or "
        "translate these symbols, and pay close attention to their placement.\n\n{text}"
    ),
    "structured.zh": (
        "# 任务目标\n将下方数据输入中的{data_format}格式数据翻译为{target}。\n\n"
        "# 严格约束\n"
        "1. 结构锁定：绝对保持原有的{data_format}数据结构、缩进和层级完全不变。\n"
        "2. 选择性翻译：仅翻译面向用户展示的可见文本内容。\n"
        "3. 禁止修改：严禁翻译或更改任何代码标签、键名 (Key)、变量占位符"
        "（如 {{{{var}}}}、${{var}}、%s、%d 等）或代码属性。\n\n"
        "# 数据输入\n{text}"
    ),
    "structured.en": (
        "### Task\nTranslate the user-facing text within the following {data_format} data into "
        "{target}.\n\n"
        "### Strict Rules\n"
        "1. Structure Preservation: You MUST preserve the original {data_format} data "
        "structure, nesting, hierarchy, and indentation exactly as they are.\n"
        "2. Selective Translation: Translate ONLY the visible, user-facing text content/values.\n"
        "3. Strict Non-Translation: NEVER translate or alter code tags, keys, properties, object "
        "names, or variable placeholders. Leave them exactly in their original English/code "
        "form.\n\n"
        "### Source Data\n{text}"
    ),
    "context.zh": (
        "【背景信息】\n{context}\n\n请结合背景信息将以下文本翻译为{target}。\n\n【待翻译文本】\n{text}"
    ),
    "context.en": (
        "[Background Information]\n{context}\n\nPlease translate the following text into "
        "{target}, taking the provided background information into consideration.\n\n"
        "[Source Text]\n{text}"
    ),
}

CHIMERA_TEMPLATES = {
    "refine.en": (
        "Analyze the following multiple {target} translations of the {source} segment "
        "surrounded in triple backticks and generate a single refined {target} translation. "
        "Only output the refined translation, do not explain.\n\n"
        "The {source} segment:\n```{text}```\n\n"
        "The multiple `{target}` translations:\n{candidates}\n"
    ),
    "candidate.en": "{number}. ```{candidate}```",
}


@dataclass(frozen=True)
class Profile:
    """A model family: its templates and the optional request fields its card documents.

    ``templates`` maps "zh" and "en" (the plain templates: Chinese on either side, or not) and
    "<template>.zh" / "<template>.en" (a feature's template in that language; a feature with only
    one of them always uses it).
    """

    name: str  # the prompt_family setting's value
    title: str
    templates: dict[str, str] = field(repr=False)
    features: tuple[str, ...] = ()  # optional request fields (FEATURE_TEMPLATES' keys)
    required: tuple[str, ...] = ()  # fields every request must carry (Chimera: candidates)
    needs_source_lang: bool = False  # the template names the source language

    def describe(self) -> dict[str, Any]:
        return {
            "prompt_family": self.name,
            "model_family": self.title,
            "features": list(self.features),
            "required": list(self.required),
        }


HUNYUAN_MT_7B = Profile("hunyuan-mt-7b", "Hunyuan-MT-7B", HUNYUAN_MT_7B_TEMPLATES)
CHIMERA = Profile(
    "hunyuan-mt-chimera",
    "Hunyuan-MT-Chimera-7B",
    CHIMERA_TEMPLATES,
    features=("candidates",),
    required=("candidates",),
    needs_source_lang=True,
)
HY_MT15 = Profile(
    "hy-mt1.5", "HY-MT1.5", HY_MT15_TEMPLATES, ("glossary", "context", "preserve_format")
)
HY_MT2 = Profile(
    "hy-mt2",
    "Hy-MT2",
    HY_MT2_TEMPLATES,
    ("glossary", "context", "style", "preferences", "delimiters", "data_format"),
)
PROFILES = {p.name: p for p in (HUNYUAN_MT_7B, CHIMERA, HY_MT15, HY_MT2)}
# Names in a model folder's path or config that identify a family (checked in this order).
_MARKS = (
    ("chimera", CHIMERA),
    ("hy-mt2", HY_MT2),
    ("hy_mt2", HY_MT2),
    ("hy-mt1.5", HY_MT15),
    ("hy-mt1_5", HY_MT15),
    ("hunyuan-mt", HUNYUAN_MT_7B),
)
MOE_MODEL_TYPE = "hy_v3"
MARKER_FILE = "hymt_family.txt"  # a model folder's explicit family: one line, a profile name


def detect_profile(model_path: Path, prompt_family: str = "auto") -> Profile:
    """The profile the ``prompt_family`` setting names; for ``auto`` the one the model folder's
    marker file names, else the one its path or its config's ``_name_or_path`` names, else
    Hy-MT2 for a ``hy_v3`` model (Hy-MT2-30B-A3B) and Hunyuan-MT-7B for any other.

    Raises ConfigurationError for an unknown family name.
    """
    if prompt_family == "auto":
        with contextlib.suppress(OSError):
            prompt_family = (model_path / MARKER_FILE).read_text().strip() or "auto"
    if prompt_family != "auto":
        if prompt_family not in PROFILES:
            raise ConfigurationError(
                f"prompt_family must be auto or one of {sorted(PROFILES)}, got {prompt_family!r}"
            )
        return PROFILES[prompt_family]
    names = str(model_path).lower()
    model_type = None
    try:
        config = json.loads((model_path / "config.json").read_text())
        names += " " + str(config.get("_name_or_path", "")).lower()
        model_type = config.get("model_type")
    except (OSError, ValueError, AttributeError):
        pass
    named = next((profile for mark, profile in _MARKS if mark in names), None)
    if named is not None:
        return named
    # Hy-MT2-30B-A3B is the family's only hy_v3 model; it takes the Hy-MT2 card's templates.
    return HY_MT2 if model_type == MOE_MODEL_TYPE else HUNYUAN_MT_7B
