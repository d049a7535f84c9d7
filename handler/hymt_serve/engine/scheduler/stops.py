"""Stop strings (OpenAI's ``stop``) found in a row's text while it is generated, so that the row
ends there instead of running on to its length only to be cut afterwards.

A stop string may span tokens, and a token may end inside a multi-byte character, so the text
is decoded incrementally (the offsets of text-generation-inference's ``decode_token``): each new
token decodes a short window of ids that starts before the last complete text, and only a tail
as long as the longest stop string is kept to search. The work per token is bounded by the
window and the stop strings, never by the row's length.

The request side still cuts the text before the first stop string
(:func:`hymt_serve.request.chat_options.apply_stop`): the engine's result may be returned as
ids only and decoded elsewhere, and its tokens end with the one that completed the stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]
REPLACEMENT = "\ufffd"  # what a token that ends inside a character decodes to
# Tokens a window may wait for a character to complete before its text is taken as it is:
# a UTF-8 character is at most 4 bytes, so more than this is bytes that never make one.
MAX_PENDING = 8


class StopWatch:
    """One row's stop strings against its text as its tokens come: :meth:`push` new ids and
    learn how many of the row's tokens end with the first stop string, if one is complete."""

    def __init__(self, stops: Sequence[str], decode: Decode) -> None:
        self._stops = tuple(stops)
        self._keep = max(len(stop) for stop in self._stops) - 1  # tail a stop may begin in
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # where the window starts: before the last text taken
        self._read = 0  # ids whose text is taken
        self._prefix_text = ""  # the text of ids[_prefix:_read]
        self._tail = ""  # the end of the text so far, at most _keep characters

    @property
    def seen(self) -> int:
        """How many of the row's tokens were pushed."""
        return len(self._ids)

    def push(self, ids: Sequence[int]) -> int | None:
        """The row's next tokens; returns the number of its tokens up to and including the one
        that completed a stop string, or None while none has."""
        for token in ids:
            self._ids.append(token)
            new = self._new_text()
            if not new:
                continue
            window = self._tail + new
            if any(stop in window for stop in self._stops):
                return len(self._ids)
            self._tail = window[-self._keep :] if self._keep else ""
        return None

    def _new_text(self) -> str:
        """The text the last token completed ("" while it ends inside a character)."""
        text = self._decode(self._ids[self._prefix :])
        pending = len(self._ids) - self._read
        complete = len(text) > len(self._prefix_text) and not text.endswith(REPLACEMENT)
        if not complete and pending < MAX_PENDING:
            return ""
        new = text[len(self._prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix :])
        return new
