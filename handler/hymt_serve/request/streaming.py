"""Incremental detokenisation for streamed output (pure Python, no torch).

Text is decoded from all tokens so far and only the new suffix is emitted. A suffix ending in
U+FFFD is held back: the last token(s) ended inside a multi-byte character (a Chinese character,
an emoji), and the next token completes it. No delta ever splits a character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Feed token ids as they are generated; get the text deltas that are safe to send."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._tokens: list[int] = []
        self._sent = ""

    def push(self, token_ids: Sequence[int]) -> str:
        """The new text since the last call ("" while a character is incomplete)."""
        self._tokens.extend(token_ids)
        text = self._decode(self._tokens)
        if text.endswith(REPLACEMENT) or not text.startswith(self._sent):
            return ""
        delta, self._sent = text[len(self._sent) :], text
        return delta

    def finish(self, final_text: str) -> str:
        """What is left to send so that everything sent adds up to ``final_text``."""
        if not final_text.startswith(self._sent):
            return ""
        delta, self._sent = final_text[len(self._sent) :], final_text
        return delta


class DeltaStream:
    """A streaming request's text deltas: token ids in, safe text out to the sink."""

    def __init__(self, decode: Callable[[Sequence[int]], str], send: Callable[[str], None]):
        self._decoder = IncrementalDecoder(decode)
        self._send = send

    def push(self, token_ids: list[int]) -> None:
        delta = self._decoder.push(token_ids)
        if delta:
            self._send(delta)

    def finish(self, final_text: str) -> None:
        tail = self._decoder.finish(final_text)
        if tail:
            self._send(tail)
