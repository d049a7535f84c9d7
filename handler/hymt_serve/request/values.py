"""Client values in error messages and their checks, shared by the request's parsers."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

from hymt_serve.request.errors import InvalidRequest

_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother = 2, 40, 40
_BRIEF.maxlist = _BRIEF.maxdict = 4


def brief(value: Any) -> str:
    """A short, always printable rendering of a client's value for an error message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        return _BRIEF.repr(value)
    except ValueError:  # an integer of thousands of digits inside a list
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"


def is_unicode(text: str) -> bool:
    """False for strings holding lone surrogates (JSON escapes such as \\ud800)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def flag(fields: Mapping[str, Any], name: str) -> bool:
    """The boolean field ``name`` (false when absent); InvalidRequest for anything else."""
    value = fields.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(
            f"{name} must be true or false, got {brief(value)}",
            allowed=[True, False],
            field=name,
        )
    return value
