"""The 38 languages of the Hunyuan-MT model card, with English and Chinese names.

Codes are matched case-insensitively, with ``_`` read as ``-`` (language tags are
case-insensitive by BCP 47), and are returned in the model card's spelling (``zh-Hant``).

Chinese side: ``zh``, ``zh-Hant`` and ``yue`` are all Chinese languages. When any of them is the
source or the target, the prompt uses the model card's Chinese template with the Chinese name of
the target; otherwise the English template with the English name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    code: str
    english: str
    chinese: str

    @property
    def is_chinese(self) -> bool:
        return self.code in CHINESE_CODES

    def name_in(self, language: str) -> str:
        """The language's name for a prompt in ``language`` ("zh": Chinese, else English)."""
        return self.chinese if language == "zh" else self.english


CHINESE_CODES = frozenset({"zh", "zh-Hant", "yue"})

_TABLE: tuple[tuple[str, str, str], ...] = (
    ("zh", "Chinese", "中文"),
    ("en", "English", "英语"),
    ("fr", "French", "法语"),
    ("pt", "Portuguese", "葡萄牙语"),
    ("es", "Spanish", "西班牙语"),
    ("ja", "Japanese", "日语"),
    ("tr", "Turkish", "土耳其语"),
    ("ru", "Russian", "俄语"),
    ("ar", "Arabic", "阿拉伯语"),
    ("ko", "Korean", "韩语"),
    ("th", "Thai", "泰语"),
    ("it", "Italian", "意大利语"),
    ("de", "German", "德语"),
    ("vi", "Vietnamese", "越南语"),
    ("ms", "Malay", "马来语"),
    ("id", "Indonesian", "印尼语"),
    ("tl", "Filipino", "菲律宾语"),
    ("hi", "Hindi", "印地语"),
    ("zh-Hant", "Traditional Chinese", "繁体中文"),
    ("pl", "Polish", "波兰语"),
    ("cs", "Czech", "捷克语"),
    ("nl", "Dutch", "荷兰语"),
    ("km", "Khmer", "高棉语"),
    ("my", "Burmese", "缅甸语"),
    ("fa", "Persian", "波斯语"),
    ("gu", "Gujarati", "古吉拉特语"),
    ("ur", "Urdu", "乌尔都语"),
    ("te", "Telugu", "泰卢固语"),
    ("mr", "Marathi", "马拉地语"),
    ("he", "Hebrew", "希伯来语"),
    ("bn", "Bengali", "孟加拉语"),
    ("ta", "Tamil", "泰米尔语"),
    ("uk", "Ukrainian", "乌克兰语"),
    ("bo", "Tibetan", "藏语"),
    ("kk", "Kazakh", "哈萨克语"),
    ("mn", "Mongolian", "蒙古语"),
    ("ug", "Uyghur", "维吾尔语"),
    ("yue", "Cantonese", "粤语"),
)

LANGUAGES: dict[str, Language] = {code: Language(code, en, zh) for code, en, zh in _TABLE}
SUPPORTED_CODES: tuple[str, ...] = tuple(LANGUAGES)
_BY_FOLDED = {code.lower(): lang for code, lang in LANGUAGES.items()}


def lookup(code: str) -> Language | None:
    """The language for ``code`` (case-insensitive, ``_`` as ``-``), or None if unsupported."""
    return _BY_FOLDED.get(code.strip().replace("_", "-").lower())


def looks_chinese(text: str) -> bool:
    """Cheap script check used only when the client gave no source language.

    True when Han characters make up most of the letters and there is no kana or hangul
    (which would make it Japanese or Korean). No language detection beyond that.
    """
    han = kana_or_hangul = letters = 0
    for char in text:
        point = ord(char)
        if 0x4E00 <= point <= 0x9FFF or 0x3400 <= point <= 0x4DBF or 0xF900 <= point <= 0xFAFF:
            han += 1
        elif 0x3040 <= point <= 0x30FF or 0xAC00 <= point <= 0xD7AF or 0x1100 <= point <= 0x11FF:
            kana_or_hangul += 1
        elif char.isalpha():
            letters += 1
    return han > 0 and kana_or_hangul == 0 and han >= letters
