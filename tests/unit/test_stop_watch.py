"""The engine's stop-string watch (pure Python): stop strings found as tokens come, across
token boundaries and inside multi-byte characters, with bounded decoding work per token."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hymt_serve.engine.scheduler.stops import MAX_PENDING, StopWatch


def chars(ids: Sequence[int]) -> str:
    """A token per character."""
    return "".join(map(chr, ids))


def utf8_bytes(ids: Sequence[int]) -> str:
    """A token per UTF-8 byte, as a byte-level tokenizer decodes: an incomplete character is
    U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")


def first_stop(watch: StopWatch, ids: Sequence[int], per_push: int = 1) -> int | None:
    for start in range(0, len(ids), per_push):
        found = watch.push(ids[start : start + per_push])
        if found is not None:
            return found
    return None


@pytest.mark.parametrize("per_push", [1, 2, 5, 100])
def test_a_stop_string_across_tokens_is_found_at_the_token_that_completes_it(
    per_push: int,
) -> None:
    ids = [ord(c) for c in "Hallo Welt.\n\nMehr Text"]
    found = first_stop(StopWatch(["\n\n"], chars), ids, per_push)
    assert found == len("Hallo Welt.\n\n")


def test_the_earliest_of_several_stop_strings_wins() -> None:
    ids = [ord(c) for c in "one, two. three###"]
    assert first_stop(StopWatch(["###", "."], chars), ids) == len("one, two.")


def test_no_stop_string_no_stop() -> None:
    ids = [ord(c) for c in "nothing to see here"]
    watch = StopWatch(["###"], chars)
    assert first_stop(watch, ids) is None and watch.seen == len(ids)


def test_a_stop_string_inside_multi_byte_characters() -> None:
    """ "。" is three bytes, each its own token: found at its last byte, never before."""
    text = "今天天气很好。明天"
    ids = list(text.encode())
    assert first_stop(StopWatch(["。"], utf8_bytes), ids) == len("今天天气很好。".encode())
    assert first_stop(StopWatch(["好。明"], utf8_bytes), ids) == len("今天天气很好。明".encode())


def test_bytes_that_never_make_a_character_do_not_stall_the_search() -> None:
    """Invalid bytes (a random model writes them) are taken as U+FFFD after a few tokens, and
    the text after them is still searched."""
    ids = [0xE4] * (MAX_PENDING * 3) + list(b"ok STOP")
    assert first_stop(StopWatch(["STOP"], utf8_bytes), ids) == len(ids)


def test_the_work_per_token_does_not_grow_with_the_text() -> None:
    """Each token decodes a short window, not the whole text so far."""
    longest: list[int] = []

    def counting(ids: Sequence[int]) -> str:
        longest.append(len(ids))
        return chars(ids)

    watch = StopWatch(["<end>"], counting)
    assert first_stop(watch, [ord("a")] * 5000 + [ord(c) for c in "<end>"]) == 5005
    assert max(longest) <= 2
