"""Request parsing: every field, alias, limit and error message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationResult, SamplingParams
from hymt_serve.request.errors import (
    InvalidRequest,
    PayloadTooLarge,
    SameLanguage,
    ServiceError,
    UnsupportedLanguage,
)
from hymt_serve.request.protocol import decode_body, parse_request
from hymt_serve.request.replies import render_response

SETTINGS = Settings.from_mapping(
    {
        "model_path": "/m",
        "max_new_tokens": 100,
        "max_texts_per_request": 3,
        "max_chars_per_text": 50,
    },
    environ={},
)


def parse(body: Any) -> Any:
    return parse_request(body, SETTINGS)


def test_single_text() -> None:
    request = parse({"text": "你好", "target_lang": "en", "source_lang": "zh"})
    assert request.texts == ("你好",) and request.single
    assert request.source is not None and request.source.code == "zh"
    assert request.target.code == "en"
    assert request.max_new_tokens == 100 and request.sampling is None


def test_flask_recipe_aliases() -> None:
    request = parse({"text": "hi", "src_lang": "en", "tgt_lang": "de"})
    assert (request.source and request.source.code, request.target.code) == ("en", "de")


def test_list_of_texts_and_optional_source() -> None:
    request = parse({"text": ["a", "b"], "target_lang": "zh-hant"})
    assert request.texts == ("a", "b") and not request.single
    assert request.source is None and request.target.code == "zh-Hant"


def test_bytes_bodies_are_json_decoded_and_text_bodies_refused() -> None:
    raw = json.dumps({"text": "x", "target_lang": "fr"})
    assert parse(raw.encode()).target.code == "fr"
    assert parse(bytearray(raw.encode())).target.code == "fr"
    with pytest.raises(InvalidRequest, match="the body is text"):
        parse(raw)


def test_sampling_uses_model_card_defaults_and_overrides() -> None:
    assert parse({"text": "x", "target_lang": "fr", "sampling": True}).sampling == SamplingParams()
    request = parse(
        {"text": "x", "target_lang": "fr", "sampling": True, "top_k": 5, "temperature": 0.2}
    )
    assert request.sampling == SamplingParams(temperature=0.2, top_k=5)


def test_lower_max_new_tokens() -> None:
    assert parse({"text": "x", "target_lang": "fr", "max_new_tokens": 7}).max_new_tokens == 7


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (None, InvalidRequest, "no JSON body found"),
        (b"", InvalidRequest, "request body is empty"),
        (b"\xff\xfe", InvalidRequest, "not valid UTF-8"),
        (b"{not json", InvalidRequest, "not valid JSON"),
        ("hello", InvalidRequest, "the body is text"),
        ([1, 2], InvalidRequest, "must be a JSON object, got list"),
        ({}, InvalidRequest, "'text' must be a non-empty string"),
        ({"text": "", "target_lang": "en"}, InvalidRequest, "text is empty or whitespace only"),
        ({"text": " \n\t", "target_lang": "en"}, InvalidRequest, "empty or whitespace only"),
        (
            {"text": ["a", 3], "target_lang": "en"},
            InvalidRequest,
            "text[1] must be a string, got int",
        ),
        ({"text": [], "target_lang": "en"}, InvalidRequest, "non-empty"),
        ({"text": 5, "target_lang": "en"}, InvalidRequest, "non-empty string"),
        ({"text": "x"}, InvalidRequest, "target_lang is required"),
        ({"text": "x", "target_lang": 1}, InvalidRequest, "target_lang must be a string, got int"),
        ({"text": "x", "target_lang": "xx"}, UnsupportedLanguage, "target_lang 'xx' is not"),
        (
            {"text": "x", "target_lang": "en", "source_lang": "klingon"},
            UnsupportedLanguage,
            "source_lang",
        ),
        ({"text": "x", "target_lang": "en", "source_lang": "EN"}, SameLanguage, "both 'en'"),
        ({"text": "x", "target_lang": "en", "colour": 1}, InvalidRequest, "unknown field 'colour'"),
        ({"text": "x", "target_lang": "en", "tgt_lang": "fr"}, InvalidRequest, "given twice"),
        (
            {"text": "x", "target_lang": "en", "max_new_tokens": 101},
            InvalidRequest,
            "[1, 100], got 101",
        ),
        ({"text": "x", "target_lang": "en", "max_new_tokens": 0}, InvalidRequest, "got 0"),
        ({"text": "x", "target_lang": "en", "max_new_tokens": "5"}, InvalidRequest, "got '5'"),
        ({"text": "x", "target_lang": "en", "sampling": "yes"}, InvalidRequest, "true or false"),
        ({"text": "x", "target_lang": "en", "top_k": 5}, InvalidRequest, "only apply with"),
        (
            {"text": "x", "target_lang": "en", "sampling": True, "top_p": 0},
            InvalidRequest,
            "top_p must",
        ),
        (
            {"text": "x", "target_lang": "en", "sampling": True, "temperature": float("nan")},
            InvalidRequest,
            "temperature must",
        ),
        (
            {"text": "x", "target_lang": "en", "sampling": True, "top_k": 2.5},
            InvalidRequest,
            "top_k must",
        ),
        ({"text": ["a"] * 4, "target_lang": "en"}, PayloadTooLarge, "4 texts in one request"),
        ({"text": "y" * 51, "target_lang": "en"}, PayloadTooLarge, "text has 51 characters"),
        ({"text": ["ok", "y" * 51], "target_lang": "en"}, PayloadTooLarge, "text[1] has 51"),
    ],
)
def test_bad_requests(body: Any, error: type[ServiceError], message: str) -> None:
    with pytest.raises(error) as info:
        parse(body)
    assert message in info.value.message
    assert info.value.allowed is not None
    assert info.value.body("id")["error_type"] == error.error_type


def test_unsupported_language_lists_all_codes() -> None:
    with pytest.raises(UnsupportedLanguage) as info:
        parse({"text": "x", "target_lang": "xx"})
    assert len(info.value.allowed) == 38 and "zh-Hant" in info.value.allowed


def test_render_response_single_and_usage() -> None:
    request = parse({"text": "你好", "target_lang": "en"})
    result = GenerationResult("Hello", (1, 2), "stop")
    body = render_response(request, [result], [9], ["zh"], [None], "rid")
    assert body == {
        "translation": "Hello",
        "translations": [
            {
                "text": "Hello",
                "input_tokens": 9,
                "output_tokens": 2,
                "finish_reason": "stop",
                "template": "zh",
            }
        ],
        "source_lang": None,
        "target_lang": "en",
        "usage": {"input_tokens": 9, "output_tokens": 2},
        "request_id": "rid",
    }


def test_render_response_multi_has_no_single_translation_field() -> None:
    request = parse({"text": ["a", "b"], "target_lang": "fr", "source_lang": "en"})
    results = [GenerationResult("A", (1,), "length"), GenerationResult("B", (2, 3), "stop")]
    body = render_response(request, results, [4, 5], ["en", "en"], [None, None], None)
    assert "translation" not in body
    assert [t["text"] for t in body["translations"]] == ["A", "B"]
    assert body["usage"] == {"input_tokens": 9, "output_tokens": 3}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=6,
)
# CI machines are small and shared: judge the property, not the generator's speed.
relaxed = settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
field_names = st.sampled_from(
    [
        "text",
        "target_lang",
        "source_lang",
        "src_lang",
        "tgt_lang",
        "max_new_tokens",
        "sampling",
        "top_k",
        "top_p",
        "temperature",
    ]
)


@relaxed
@given(st.dictionaries(field_names, json_values, max_size=6))
def test_parser_only_raises_service_errors_on_arbitrary_fields(body: dict[str, Any]) -> None:
    try:
        request = parse(body)
    except ServiceError as error:
        assert 400 <= error.status < 500 and error.message
    else:
        assert 1 <= len(request.texts) <= 3
        assert all(t.strip() and len(t) <= 50 for t in request.texts)
        assert 1 <= request.max_new_tokens <= 100


@relaxed
@given(st.binary(max_size=64))
def test_parser_only_raises_service_errors_on_arbitrary_bytes(raw: bytes) -> None:
    try:
        parse(decode_body(raw))
    except ServiceError as error:
        assert error.status == 400


@relaxed
@given(st.text(min_size=1, max_size=50).filter(str.strip), st.sampled_from(["en", "zh", "ja"]))
def test_any_visible_text_within_limits_is_accepted(text: str, target: str) -> None:
    assert parse({"text": text, "target_lang": target}).texts == (text,)


def test_stream_is_a_boolean_for_one_text() -> None:
    assert parse({"text": "x", "target_lang": "fr", "stream": True}).stream
    assert not parse({"text": "x", "target_lang": "fr"}).stream
    with pytest.raises(InvalidRequest, match="stream needs a single text"):
        parse({"text": ["a", "b"], "target_lang": "fr", "stream": True})
    with pytest.raises(InvalidRequest, match="stream must be true or false"):
        parse({"text": "x", "target_lang": "fr", "stream": "yes"})


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "raw",
    [
        '{"text": ' + _nested(990) + ', "target_lang": "fr"}',
        '{"text": "a", "target_lang": "fr", "sampling": true, "top_p": ' + _nested(990) + "}",
        '{"text": "a", "target_lang": "fr", "unknown": ' + _nested(990) + "}",
        '{"text": "a", "target_lang": "fr", "x": ' + '{"a": ' * 3000 + "1" + "}" * 3001,
        '{"text": "a", "target_lang": "fr", "max_new_tokens": ' + "9" * 5000 + "}",
        '{"text": "a", "target_lang": "fr", "max_new_tokens": ' + "9" * 4000 + "}",
        '{"text": "a", "target_lang": "fr", "sampling": true, "top_k": [' + "7" * 4200 + "]}",
    ],
)
def test_deep_nesting_and_huge_numbers_are_client_errors(raw: str) -> None:
    """Unchecked, they escape as RecursionError/ValueError: a 500 anyone could trigger."""
    for body in (raw.encode(), raw):
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            decoded = body.encode() if isinstance(body, str) else body
        with pytest.raises(InvalidRequest) as caught:
            parse(decoded)
        assert len(caught.value.message) < 300


def test_json_errors_name_the_place_once() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(b'{"text": "a\x01", "target_lang": "fr"}')
    assert "at at" not in caught.value.message
    assert "Invalid control character at: line 1 column 12 (char 11)" in caught.value.message
