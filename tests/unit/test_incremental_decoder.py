"""Streamed text deltas never split a character and add up to the final text."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hymt_serve.request.streaming import IncrementalDecoder


def byte_decode(ids: Sequence[int]) -> str:
    """A byte-level 'tokenizer': each id is one byte of UTF-8."""
    return bytes(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize(
    "text", ["你好，世界", "日本語のテキスト", "emoji 😀👍🏽 done", "مرحبا", "plain"]
)
def test_byte_by_byte_deltas_hold_back_incomplete_characters(text: str) -> None:
    decoder = IncrementalDecoder(byte_decode)
    deltas = [decoder.push([b]) for b in text.encode("utf-8")]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    assert decoder.finish(text) == ""


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(min_size=1, max_size=40), st.integers(1, 5))
def test_any_text_in_any_chunking_adds_up(text: str, step: int) -> None:
    data = text.encode("utf-8", errors="ignore")
    decoder = IncrementalDecoder(byte_decode)
    deltas = [decoder.push(list(data[i : i + step])) for i in range(0, len(data), step)]
    final = byte_decode(list(data))
    deltas.append(decoder.finish(final))
    assert "".join(deltas) == final
    assert all("\ufffd" not in d for d in deltas[:-1])


def test_finish_sends_the_rest_of_the_final_text() -> None:
    decoder = IncrementalDecoder(byte_decode)
    assert decoder.push(list(b"ab")) == "ab"
    assert decoder.push(["é".encode()[0]]) == ""  # half a character: held back
    assert decoder.finish("abé") == "é"
