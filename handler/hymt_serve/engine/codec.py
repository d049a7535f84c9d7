"""The token codec: a model folder's tokenizer, encoding a user turn through the chat template
(user text always as plain text), stop and pad tokens, and decoding results.

Decoder-only details in one place: special tokens are parsed in the template's frame only and
skipped when decoding; a row cut by its length never ends in half a character.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hymt_serve.core.errors import ConfigurationError, RowRejected
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, FinishReason, GenerationResult
from hymt_serve.engine.checkpoints.tiktoken_folder import (
    has_tiktoken_only,
    load_tiktoken_folder,
    names_remote_tokenizer,
)

STOP_TOKENS = ("<|eos|>",)
REPLACEMENT = "\ufffd"  # what decoding shows for the bytes of an incomplete character


def load_tokenizer(settings: Settings) -> Any:
    """The model folder's tokenizer; raises ConfigurationError without a chat template."""
    if not (settings.model_path / "config.json").is_file():
        raise ConfigurationError(f"model_path {str(settings.model_path)!r} has no config.json")
    tokenizer = read_tokenizer(settings.model_path)
    if not tokenizer.chat_template:
        raise ConfigurationError(f"the tokenizer in {settings.model_path} has no chat template")
    turn_frame(tokenizer)  # refuse a template that does not hold the user text verbatim
    return tokenizer


def read_tokenizer(folder: Path) -> Any:
    """A folder's tokenizer, never running remote code: ``tokenizer.json`` through
    transformers (as a plain fast tokenizer where the config names remote code for it), or a
    ``hy.tiktoken``-only folder converted (:mod:`.tiktoken_folder`)."""
    if has_tiktoken_only(folder):
        return load_tiktoken_folder(folder)
    if names_remote_tokenizer(folder):
        if not (folder / "tokenizer.json").is_file():
            raise ConfigurationError(
                f"the tokenizer in {folder} needs remote code, and the folder has neither "
                "tokenizer.json nor hy.tiktoken to load it from without that code"
            )
        return PreTrainedTokenizerFast.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


class TokenCodec:
    """Text to prompt ids and generated ids to text, for one tokenizer."""

    def __init__(self, tokenizer: Any, stop_ids: Collection[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(_stop_ids(tokenizer) | set(stop_ids))
        self.pad_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids)
        )

    @classmethod
    def load(cls, settings: Settings) -> TokenCodec:
        return cls(load_tokenizer(settings), folder_stop_ids(settings.model_path))

    def encode(self, user_turn: str) -> list[int]:
        """Token ids of ``user_turn`` rendered as one user turn by the chat template."""
        return encode_user_turn(self.tokenizer, user_turn)

    def encode_chat(self, turns: Sequence[ChatTurn]) -> list[int]:
        """Token ids of a conversation rendered by the chat template, ready for the model's
        answer; every turn's text encoded as text."""
        return encode_conversation(self.tokenizer, turns)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def result(self, token_ids: Sequence[int], finish: FinishReason) -> GenerationResult:
        """The result of generated ids (stop token already cut off).

        A row that ``max_new_tokens`` cut may end inside a multi-byte character (a Chinese
        character, an emoji): that incomplete tail is dropped from the text, never shown as
        U+FFFD.
        """
        text = self.decode(token_ids)
        if finish == "length":
            text = text.rstrip(REPLACEMENT)
        return GenerationResult(text, tuple(token_ids), finish)


# Private-use characters: no chat template writes them, so they mark where the user text goes.
_USER_SLOT = "\ue000user-turn\ue000"


# The frame is the same for every request: computed once per tokenizer.
Frame = tuple[tuple[int, ...], tuple[int, ...]]  # ids before and after the user turn
_FRAMES: weakref.WeakKeyDictionary[Any, Frame] = weakref.WeakKeyDictionary()


def turn_frame(tokenizer: Any) -> Frame:
    """Token ids of the chat template before and after the user turn (special tokens parsed).

    Raises ConfigurationError when the template does not place the user text once, verbatim.
    """
    frame = _FRAMES.get(tokenizer)
    if frame is None:
        frame = _FRAMES[tokenizer] = _render_frame(tokenizer)
    return frame


def _render_frame(tokenizer: Any) -> Frame:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": _USER_SLOT}], tokenize=False, add_generation_prompt=True
    )
    parts = rendered.split(_USER_SLOT)
    if len(parts) != 2:
        raise ConfigurationError("the chat template does not hold the user turn once, verbatim")
    before, after = (tokenizer(part, add_special_tokens=False)["input_ids"] for part in parts)
    return tuple(before), tuple(after)


def encode_user_turn(tokenizer: Any, user_turn: str) -> list[int]:
    """Token ids of ``user_turn`` rendered as one user turn by the chat template.

    The user turn is always encoded as plain text: a "<|eos|>" or "<|extra_0|>" in it is those
    characters, never the control token, so user text cannot end its turn or write the model's.
    """
    before, after = turn_frame(tokenizer)
    return [*before, *text_ids(tokenizer, user_turn), *after]


def encode_conversation(tokenizer: Any, turns: Sequence[ChatTurn]) -> list[int]:
    """Token ids of ``turns`` rendered by the chat template, ready for the model's answer.

    The template is rendered with a private-use placeholder for each turn's text; only the
    template's own frame between them is parsed for special tokens, and each turn's text is
    encoded as plain text: a "<|startoftext|>" or "<|eos|>" typed in a message is those
    characters. An empty turn is rendered empty (templates test for that). Raises RowRejected
    when the template refuses the conversation or does not hold each text once, verbatim.
    """
    slots = [f"\ue000turn-{i}\ue000" if turn.content else "" for i, turn in enumerate(turns)]
    messages = [{"role": t.role, "content": slot} for t, slot in zip(turns, slots, strict=True)]
    try:
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    except Exception as error:  # jinja's TemplateError, the template's raise_exception
        raise RowRejected(
            f"the model's chat template refused these messages: {error}",
            allowed="the roles and order the model's chat template accepts",
            field="messages",
        ) from None
    ids: list[int] = []
    rest = str(rendered)
    for turn, slot in zip(turns, slots, strict=True):
        if not slot:
            continue
        before, found, rest = rest.partition(slot)
        if not found or slot in rest:
            raise RowRejected(
                f"the model's chat template does not hold a {turn.role} message verbatim",
                allowed="messages of the roles the model's chat template renders",
                field="messages",
            )
        ids += _frame_ids(tokenizer, before)
        ids += text_ids(tokenizer, turn.content)
    return ids + _frame_ids(tokenizer, rest)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as plain text: no added token, special or not, is matched in it.

    ``split_special_tokens`` keeps special tokens out; some tokenizers also add control tokens
    that are not marked special (Hy-MT2-30B-A3B's ``<think>``, ``</think>`` and reasoning-mode
    token). A text that holds one of those is encoded by the tokenizer's own normalizer,
    pre-tokenizer and model alone, which know no added tokens."""
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    if not any(content in text for content in _unmarked_controls(tokenizer)):
        return ids
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    pieces = (
        backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer else [(text, None)]
    )
    return [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]


_UNMARKED: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _unmarked_controls(tokenizer: Any) -> tuple[str, ...]:
    """The added tokens not marked special (computed once per tokenizer)."""
    found = _UNMARKED.get(tokenizer)
    if found is None:
        added = getattr(tokenizer, "added_tokens_decoder", {})
        found = _UNMARKED[tokenizer] = tuple(t.content for t in added.values() if not t.special)
    return found


def _frame_ids(tokenizer: Any, frame: str) -> list[int]:
    """The template's own text, its special tokens parsed."""
    return list(tokenizer(frame, add_special_tokens=False)["input_ids"]) if frame else []


def folder_stop_ids(folder: Path) -> set[int]:
    """The end ids a model folder's ``config.json`` and ``generation_config.json`` name
    (``eos_token_id``, one or a list) and, for ``hy_v3``, ``eod_token_id``: Hy-MT2-30B-A3B ends
    on 120025 and 120026, and its tokenizer's texts for them differ between its releases. (The
    dense family's configs carry an ``eod_token_id`` too, transformers' default, that is no
    end of theirs.)"""
    ids: set[int] = set()
    keys = ["eos_token_id"]
    for name in ("config.json", "generation_config.json"):
        try:
            config = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("model_type") == "hy_v3":
            keys.append("eod_token_id")
        for key in keys:
            value = config.get(key) if isinstance(config, dict) else None
            values = value if isinstance(value, list) else [value]
            ids |= {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
    return ids


def _stop_ids(tokenizer: Any) -> set[int]:
    ids = {tokenizer.convert_tokens_to_ids(token) for token in STOP_TOKENS}
    ids.discard(tokenizer.unk_token_id)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    ids = {i for i in ids if isinstance(i, int)}
    if not ids:
        raise ConfigurationError(f"the tokenizer has none of the stop tokens {STOP_TOKENS}")
    return ids
