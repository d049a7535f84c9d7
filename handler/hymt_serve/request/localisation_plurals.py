"""gettext's Plural-Forms for the 38 target languages, and which form the number 1 takes.

Sources: GNU gettext's own table where it has the language (what ``msginit`` 0.21 writes:
en, fr, pt, es, ja, tr, ru, ko, it, de, vi, pl, cs, nl, he, uk; the expressions below are its,
character for character); Unicode CLDR 48.1's plural rules as gettext expressions
(php-gettext/Languages, which converts CLDR's rules) for the others. gettext's table is kept
where the two differ (CLDR gives French, Spanish, Italian and Portuguese a third "many" form for
millions, Hebrew a "two" form) because the PO files of those languages in use have its forms.
"""

from __future__ import annotations

import gettext
from collections.abc import Callable

_ONE_FORM = "nplurals=1; plural=0;"
_N_NOT_1 = "nplurals=2; plural=(n != 1);"
_N_OVER_1 = "nplurals=2; plural=(n > 1);"
_SLAVIC = (
    "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && "
    "(n%100<10 || n%100>=20) ? 1 : 2);"
)

PLURAL_FORMS: dict[str, str] = {
    **dict.fromkeys(("en", "pt", "es", "tr", "it", "de", "nl", "he"), _N_NOT_1),
    **dict.fromkeys(("ur", "te", "mr", "ta", "kk", "mn", "ug"), _N_NOT_1),
    **dict.fromkeys(("fr", "hi", "fa", "gu", "bn"), _N_OVER_1),
    **dict.fromkeys(("zh", "zh-Hant", "yue", "ja", "ko", "vi", "th", "ms", "id"), _ONE_FORM),
    **dict.fromkeys(("km", "my", "bo"), _ONE_FORM),
    "ru": _SLAVIC,
    "uk": _SLAVIC,
    "pl": "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "cs": "nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;",
    "ar": (
        "nplurals=6; plural=(n==0 ? 0 : n==1 ? 1 : n==2 ? 2 : n%100>=3 && n%100<=10 ? 3 : "
        "n%100>=11 && n%100<=99 ? 4 : 5);"
    ),
    "tl": (
        "nplurals=2; plural=(n != 1 && n != 2 && n != 3 && "
        "(n % 10 == 4 || n % 10 == 6 || n % 10 == 9));"
    ),
}


def plural_count(forms: str) -> int:
    """``nplurals`` of a Plural-Forms value."""
    return int(forms.split("nplurals=", 1)[1].split(";", 1)[0])


def form_of(forms: str) -> Callable[[int], int]:
    """The form index a number takes (gettext's own reader of plural expressions)."""
    expression = forms.split("plural=", 1)[1].strip().rstrip(";")
    return gettext.c2py(expression)
