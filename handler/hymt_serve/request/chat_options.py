"""The chat form's generation options: the checks of its ``max_tokens``, ``n``, sampling
(``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``seed``) and ``stop`` fields,
and the stop strings applied to generated text.

Pure Python (no torch). The chat form itself, its messages and its replies are in
:mod:`hymt_serve.request.chat`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hymt_serve.core.config import Sampling, spec_of
from hymt_serve.core.types import GenerationResult, SamplingParams
from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.values import brief

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty")
MAX_TEMPERATURE = 2.0  # OpenAI's bound
MAX_STOPS = 4  # OpenAI's bound
MAX_STOP_CHARS = 256
INT64 = 2**63


def stops_of(value: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of up to 4 non-empty strings (null: none)."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    good = isinstance(stops, list) and len(stops) <= MAX_STOPS
    if good and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        return tuple(dict.fromkeys(stops))
    raise InvalidRequest(
        f"stop must be a string or a list of up to {MAX_STOPS} non-empty strings of at most "
        f"{MAX_STOP_CHARS} characters, got {brief(value)}",
        allowed=["\n", ["\n\n", "###"]],
        field="stop",
    )


def max_tokens_of(value: Any, cap: int) -> int:
    """OpenAI's ``max_tokens``: a ceiling the client allows, under the server's own cap."""
    if value is None:
        return cap
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(
            f"max_tokens must be a positive integer, got {brief(value)}",
            allowed=f"an integer >= 1 (the server generates at most {cap})",
            field="max_tokens",
        )
    return min(value, cap)


def choices_of(value: Any, cap: int) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
        raise InvalidRequest(
            f"n must be an integer in [1, {cap}], got {brief(value)}",
            allowed=f"[1, {cap}]",
            field="n",
        )
    return value


def sampling_of(fields: Mapping[str, Any], defaults: SamplingParams) -> SamplingParams | None:
    """Greedy when ``temperature`` or ``top_p`` is 0, or when no sampling field is given;
    otherwise sampling, each knob not given at the model card's value (the settings')."""
    given = {key: fields[key] for key in SAMPLING_FIELDS if fields.get(key) is not None}
    for key, value in given.items():
        _check_knob(key, value)
    seed = _seed(fields.get("seed"))
    if not given or given.get("temperature") == 0 or given.get("top_p") == 0:
        return None
    if given.get("top_k") == -1:  # vLLM's "no top-k"
        given["top_k"] = 0
    return replace(defaults, **given, seed=seed)


def _check_knob(key: str, value: Any) -> None:
    if key == "top_k":
        _check_top_k(value)
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    bounds = {"temperature": MAX_TEMPERATURE, "top_p": 1.0}
    high = bounds[key] if key in bounds else float(spec_of(Sampling, key).high)
    low_open = key == "repetition_penalty"  # a penalty of 0 would divide by 0
    inside = number and math.isfinite(value) and (value > 0.0 if low_open else value >= 0.0)
    if not inside or value > high:
        shown = f"(0, {high:g}]" if low_open else f"[0, {high:g}]"
        raise InvalidRequest(
            f"{key} must be a number in {shown}, got {brief(value)}", allowed=shown, field=key
        )


def _check_top_k(value: Any) -> None:
    high = int(spec_of(Sampling, "top_k").high)
    integer = isinstance(value, int) and not isinstance(value, bool)
    if not integer or not (value in (-1, 0) or 1 <= value <= high):
        raise InvalidRequest(
            f"top_k must be an integer in [1, {high}] (0 or -1: no top-k), got {brief(value)}",
            allowed=f"[1, {high}], 0 or -1",
            field="top_k",
        )


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -INT64 <= value < INT64:
        raise InvalidRequest(
            f"seed must be a 64-bit integer, got {brief(value)}",
            allowed=f"[{-INT64}, {INT64 - 1}]",
            field="seed",
        )
    return value


# Stop strings in generated text.


def apply_stop(
    result: GenerationResult, stop: Sequence[str], decode: Callable[[Sequence[int]], str]
) -> GenerationResult:
    """``result`` ended before the first stop string in its text: "stop", and its tokens up to
    the one that completed the stop string. Unchanged when none occurs."""
    cut, found = cut_at_stop(result.text, stop)
    if not found:
        return result
    ids = result.token_ids
    # The fewest tokens whose text holds a stop string (decoding a longer prefix only adds).
    count = bisect.bisect_left(
        range(len(ids) + 1), True, key=lambda k: _holds(decode(ids[:k]), stop)
    )
    return GenerationResult(cut, tuple(ids[:count]), "stop")


def _holds(text: str, stop: Sequence[str]) -> bool:
    return any(s in text for s in stop)


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` before its earliest stop string, and whether there was one."""
    ends = [at for at in (text.find(s) for s in stop) if at >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


def held_length(text: str, stop: Sequence[str]) -> int:
    """The length of the longest end of ``text`` that begins some stop string."""
    longest = max((len(s) for s in stop), default=1)
    for size in range(min(len(text), longest - 1), 0, -1):
        if any(s.startswith(text[-size:]) for s in stop):
            return size
    return 0
