"""Properties of the request parser over generated bodies (tests/unit/test_protocol.py has the
examples and the first properties: arbitrary known fields, arbitrary bytes, visible text)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hymt_serve.core.config import Sampling, spec_of
from hymt_serve.core.settings import Settings
from hymt_serve.request.errors import (
    InvalidRequest,
    PayloadTooLarge,
    SameLanguage,
    ServiceError,
    UnsupportedLanguage,
)
from hymt_serve.request.languages import SUPPORTED_CODES, lookup
from hymt_serve.request.protocol import (
    ALIASES,
    FIELDS,
    TranslationRequest,
    decode_body,
    parse_request,
)
from hymt_serve.request.values import brief

CAP, MAX_TEXTS, MAX_CHARS = 32, 3, 12
SETTINGS = Settings.from_mapping(
    {
        "model_path": "/m",
        "max_new_tokens": CAP,
        "max_texts_per_request": MAX_TEXTS,
        "max_chars_per_text": MAX_CHARS,
    },
    environ={},
)
KNOWN_KEYS = {*FIELDS, *ALIASES}

relaxed = settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=100)


def parse(body: Any) -> TranslationRequest:
    return parse_request(body, SETTINGS)


# --- strategies ------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=5,
)


def spell(code: str, upper: int, underscore: bool, pad: str) -> str:
    """``code`` as a client may spell it: letters upper-cased by the bits of ``upper``, ``_``
    for ``-``, padding around it."""
    letters = "".join(c.upper() if upper >> i & 1 else c.lower() for i, c in enumerate(code))
    return pad + (letters.replace("-", "_") if underscore else letters) + pad


def spellings(code: str) -> st.SearchStrategy[str]:
    return st.builds(
        spell, st.just(code), st.integers(0, 127), st.booleans(), st.sampled_from(["", " ", "\t"])
    )


TOP_K = spec_of(Sampling, "top_k")
codes = st.sampled_from(SUPPORTED_CODES)
visible_text = st.text(min_size=1, max_size=MAX_CHARS).filter(str.strip)
sampling_values = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(min_value=0.01, max_value=10.0),
        "top_p": st.floats(min_value=0.01, max_value=1.0),
        "top_k": st.integers(int(TOP_K.low), int(TOP_K.high)),
        "repetition_penalty": st.floats(min_value=0.01, max_value=10.0),
    },
)


@st.composite
def valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid body: 38 codes spelt any way, canonical names or aliases, visible text."""
    target = draw(codes)
    source = draw(st.none() | codes.filter(lambda code: code != target))
    text = draw(visible_text | st.lists(visible_text, min_size=1, max_size=MAX_TEXTS))
    body: dict[str, Any] = {"text": text}
    body[draw(st.sampled_from(["target_lang", "tgt_lang"]))] = draw(spellings(target))
    if source is not None:
        body[draw(st.sampled_from(["source_lang", "src_lang"]))] = draw(spellings(source))
    if draw(st.booleans()):
        body["max_new_tokens"] = draw(st.integers(1, CAP))
    if draw(st.booleans()):
        body["sampling"] = True
        body.update(draw(sampling_values))
    elif draw(st.booleans()):
        body["sampling"] = False
    return body


# Each field valid, invalid or of the wrong type, so that near-valid bodies are often accepted.
field_values: dict[str, st.SearchStrategy[Any]] = {
    "text": visible_text
    | st.lists(visible_text, max_size=MAX_TEXTS + 2)
    | st.text(max_size=MAX_CHARS + 5)
    | json_values,
    "target_lang": codes.flatmap(spellings) | st.text(max_size=6) | json_scalars,
    "tgt_lang": codes.flatmap(spellings) | json_scalars,
    "source_lang": codes.flatmap(spellings) | json_scalars,
    "max_new_tokens": st.integers(-2, CAP + 2) | json_scalars,
    "sampling": st.booleans() | json_scalars,
    "top_p": st.floats(-0.5, 1.5) | json_scalars,
    "top_k": st.integers(-1, 1002) | json_scalars,
    "temperature": st.floats(-1.0, 11.0) | json_scalars,
}


@st.composite
def near_valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid body with up to two fields replaced (by valid or invalid values) or removed."""
    body = draw(valid_bodies())
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted(field_values)))
        if draw(st.integers(0, 4)):
            body[key] = draw(field_values[key])
        else:
            body.pop(key, None)
    return body


unknown_keys = st.text(min_size=0, max_size=16).filter(lambda key: key not in KNOWN_KEYS)


def outcome(body: Any) -> tuple[str, Any]:
    """What the parser made of ``body``: the request, or the error's type, message and field."""
    try:
        return "accepted", parse(body)
    except ServiceError as error:
        return type(error).__name__, (error.message, error.field)


def assert_within_limits(request: TranslationRequest, body: dict[str, Any]) -> None:
    assert 1 <= len(request.texts) <= MAX_TEXTS
    assert all(isinstance(t, str) and t.strip() and len(t) <= MAX_CHARS for t in request.texts)
    assert request.single == isinstance(body["text"], str)
    assert 1 <= request.max_new_tokens <= CAP
    assert request.target.code in SUPPORTED_CODES
    assert request.source is None or request.source.code != request.target.code
    if request.sampling is None:
        assert body.get("sampling", False) is False
    else:
        assert body["sampling"] is True
        params = vars(request.sampling)
        for key in ("temperature", "top_p", "repetition_penalty"):
            low, high = spec_of(Sampling, key).low, spec_of(Sampling, key).high
            assert math.isfinite(params[key]) and low < params[key] <= high
        assert TOP_K.low <= params["top_k"] <= TOP_K.high


# --- properties ------------------------------------------------------------------------------


@relaxed
@given(near_valid_bodies() | json_values)
def test_any_body_is_refused_with_a_400_or_413_or_accepted_within_the_limits(body: Any) -> None:
    try:
        request = parse(body)
    except ServiceError as error:
        assert isinstance(error, (InvalidRequest, PayloadTooLarge))
        assert error.status in (400, 413)
        assert error.message.strip() and error.allowed is not None
        assert error.field is None or error.field in KNOWN_KEYS or error.field in body
        rendered = json.loads(json.dumps(error.body("rid")))
        assert rendered["error_type"] == error.error_type and rendered["request_id"] == "rid"
    else:
        assert isinstance(body, dict)
        assert_within_limits(request, body)


@relaxed
@given(valid_bodies())
def test_valid_requests_are_accepted_and_round_trip_in_every_body_form(
    body: dict[str, Any],
) -> None:
    request = parse(body)
    text = body["text"]
    assert request.texts == ((text,) if isinstance(text, str) else tuple(text))
    target = body.get("target_lang", body.get("tgt_lang"))
    assert request.target.code.lower() == target.strip().replace("_", "-").lower()
    source = body.get("source_lang", body.get("src_lang"))
    if source is None:
        assert request.source is None
    else:
        assert request.source is not None
        assert request.source.code.lower() == source.strip().replace("_", "-").lower()
    assert request.max_new_tokens == body.get("max_new_tokens", CAP)
    if body.get("sampling"):
        assert request.sampling is not None
        for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
            if key in body:
                assert getattr(request.sampling, key) == body[key]
    else:
        assert request.sampling is None
    assert_within_limits(request, body)
    raw = json.dumps(body, ensure_ascii=False)
    for form in (raw.encode("utf-8"), bytearray(raw.encode("utf-8"))):
        assert outcome(form) == ("accepted", request)
    assert outcome(raw)[0] == "InvalidRequest"  # a str body is text/* (or a JSON string): not JSON


@relaxed
@given(valid_bodies(), unknown_keys, json_scalars, st.integers(0, 12))
def test_an_unknown_field_is_refused_by_name(
    body: dict[str, Any], key: str, value: Any, position: int
) -> None:
    items = list(body.items())
    items.insert(position % (len(items) + 1), (key, value))
    try:
        parse(dict(items))
    except InvalidRequest as error:
        assert type(error) is InvalidRequest and error.status == 400
        assert error.field == key and brief(key) in error.message
        assert set(error.allowed) == KNOWN_KEYS
    else:
        raise AssertionError(f"unknown field {key!r} was accepted")


@relaxed
@given(codes, st.data())
def test_any_spelling_of_a_code_finds_it_and_source_equal_to_target_is_refused(
    code: str, data: st.DataObject
) -> None:
    target, source = data.draw(spellings(code)), data.draw(spellings(code))
    language = lookup(target)
    assert language is not None and language.code == code
    assert parse({"text": "x", "target_lang": target}).target.code == code
    try:
        parse({"text": "x", "target_lang": target, "source_lang": source})
    except SameLanguage as error:
        assert error.status == 400 and error.error_type == "same_language"
    else:
        raise AssertionError(f"{source!r} -> {target!r} was accepted")


@relaxed
@given(st.text(max_size=10), st.sampled_from(["target_lang", "source_lang"]))
def test_anything_but_the_38_codes_is_an_unsupported_language(code: str, field: str) -> None:
    assume(lookup(code) is None)
    body = {"text": "x", "target_lang": "en", field: code}
    if field == "source_lang":
        body["target_lang"] = "fr"
    try:
        parse(body)
    except UnsupportedLanguage as error:
        assert error.status == 400 and error.field == field
        assert list(error.allowed) == list(SUPPORTED_CODES)
    else:
        raise AssertionError(f"{code!r} was accepted as {field}")


@relaxed
@given(
    visible_text,
    st.sampled_from(sorted(ALIASES)),
    codes.filter(lambda code: code not in ("en", "fr")).flatmap(spellings),
    st.booleans(),
    st.booleans(),
)
def test_an_alias_beside_its_field_must_agree(
    text: str, alias: str, code: str, agree: bool, alias_first: bool
) -> None:
    canonical = ALIASES[alias]
    pair = [(canonical, code), (alias, code if agree else "fr")]
    body = {"text": text, **({} if canonical == "target_lang" else {"target_lang": "en"})}
    body.update(reversed(pair) if alias_first else pair)
    if agree:
        assert parse(body).texts == (text,)
        return
    try:
        parse(body)
    except InvalidRequest as error:
        assert error.field == (canonical if alias_first else alias) and "twice" in error.message
    else:
        raise AssertionError(f"{canonical} and {alias} disagree but were accepted")


@relaxed
@given(
    codes,
    st.integers(MAX_TEXTS + 1, 5 * MAX_TEXTS) | st.integers(MAX_CHARS + 1, 4 * MAX_CHARS),
)
def test_over_the_limits_is_413(target: str, size: int) -> None:
    text = ["x"] * size if size <= 5 * MAX_TEXTS else "y" * size
    body = {"text": text, "target_lang": target, "max_new_tokens": 1}
    try:
        parse(body)
    except PayloadTooLarge as error:
        assert error.status == 413 and error.field == "text"
    else:
        raise AssertionError(f"a text field of size {size} was accepted")


@relaxed
@given(codes, json_values | st.integers())
def test_max_new_tokens_is_an_integer_up_to_the_cap(target: str, value: Any) -> None:
    body = {"text": "x", "target_lang": target, "max_new_tokens": value}  # null: the cap
    valid = value is None or (type(value) is int and 1 <= value <= CAP)
    try:
        request = parse(body)
    except InvalidRequest as error:
        assert not valid and error.field == "max_new_tokens"
    else:
        assert valid and request.max_new_tokens == (CAP if value is None else value)


@relaxed
@given(st.binary(max_size=80) | json_values.map(lambda v: json.dumps(v).encode("utf-8")))
def test_decode_body_yields_the_object_or_a_400(raw: bytes) -> None:
    try:
        decoded = decode_body(raw)
    except ServiceError as error:
        assert type(error) is InvalidRequest and error.status == 400
    else:
        assert isinstance(decoded, dict)
        assert json.dumps(decoded, sort_keys=True) == json.dumps(
            json.loads(raw.decode("utf-8")), sort_keys=True
        )


def test_text_that_is_not_valid_unicode_is_refused() -> None:
    for text in ("\ud800", "a\udfffb", "half an emoji \ud83d"):
        body = json.dumps({"text": text, "target_lang": "en"})  # ASCII, the surrogate escaped
        with pytest.raises(InvalidRequest) as info:
            parse(body.encode("utf-8"))
        assert info.value.field == "text"
