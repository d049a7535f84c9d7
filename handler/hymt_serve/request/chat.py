"""The chat form of the request API: a conversation or a prompt, generated through the model's
chat template with OpenAI's generation options; or, with ``target_lang``, the last user message
translated with the model card's prompt.

Pure Python (no torch). Body (JSON object)::

    {"messages": [{"role": "system", "content": "..."},       system (or developer), user,
                  {"role": "user", "content": "..."}],        assistant; content a string
                                                              or a list of text parts; or:
     "prompt": "...",                                         one user turn
     "max_tokens": 256,                                       at most this many new tokens
                                                              (the server's cap applies)
     "temperature": 0.7, "top_p": 0.9,                        0 or none given: greedy; else
     "top_k": 20, "repetition_penalty": 1.05,                 sampling, the model card's
                                                              values for those not given
     "seed": 7,                                               reproducible sampling
     "stop": ["\\n\\n"],                                        up to 4 strings: the text
                                                              ends before the first
     "n": 2,                                                  choices (rows) to generate
     "stream": true,                                          each choice's text deltas
     "target_lang": "en", "source_lang": "auto",              translation: the last user
     "glossary": [...], ...}                                  message (or the prompt) in
                                                              the model card's prompt

Every message's text is encoded as text, never as control tokens
(:func:`hymt_serve.engine.codec.encode_conversation`): only the chat template's own frame
carries special tokens. A translation reuses the request API's text path
(:func:`~hymt_serve.request.protocol.parse_request`): the conversation's other messages are
not part of the model card's prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationResult, SamplingParams
from hymt_serve.request.chat_options import (
    INT64,
    SAMPLING_FIELDS,
    choices_of,
    cut_at_stop,
    held_length,
    max_tokens_of,
    sampling_of,
    stops_of,
)
from hymt_serve.request.errors import InvalidRequest, PayloadTooLarge, ServiceError
from hymt_serve.request.families import HUNYUAN_MT_7B, Profile
from hymt_serve.request.features import FEATURE_FIELDS
from hymt_serve.request.language_retry import TargetLanguage, worst
from hymt_serve.request.markup import Markup
from hymt_serve.request.protocol import ALIASES, TranslationRequest, decode_body, parse_request
from hymt_serve.request.replies import render_response
from hymt_serve.request.streaming import IncrementalDecoder
from hymt_serve.request.values import brief, flag, is_unicode

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# A message's keys; those after "content" are what OpenAI's SDK returns on an assistant message
# (clients send it back as the conversation goes on): accepted when empty.
MESSAGE_KEYS = ("role", "content", "refusal", "tool_calls", "function_call", "audio", "annotations")
CHAT_FIELDS = ("messages", "prompt", "max_tokens", *SAMPLING_FIELDS, "seed", "stop", "n", "stream")
TRANSLATION_FIELDS = ("target_lang", "source_lang", *ALIASES, *FEATURE_FIELDS)
FIELDS = (*CHAT_FIELDS, *TRANSLATION_FIELDS)
# Choice i of a seeded request samples with seed + i x this (odd: distinct seeds mod 2**64).
CHOICE_SEED_STEP = 0x9E3779B97F4A7C15
CHAT_TEMPLATE = "chat"  # the reply's "prompt" for a conversation through the chat template


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat form: the conversation (one user turn for a prompt), its options, and
    for a translation the request API's request of its text."""

    turns: tuple[ChatTurn, ...]
    completion: bool  # a prompt, not messages
    max_new_tokens: int
    sampling: SamplingParams | None
    n: int = 1
    stop: tuple[str, ...] = ()
    stream: bool = False
    translation: TranslationRequest | None = None

    def choice_sampling(self, choice: int) -> SamplingParams | None:
        """Choice ``choice``'s sampling: with a seed, a seed of its own derived from it."""
        if self.sampling is None or self.sampling.seed is None or choice == 0:
            return self.sampling
        seed = (self.sampling.seed + choice * CHOICE_SEED_STEP + INT64) % 2**64 - INT64
        return replace(self.sampling, seed=seed)

    @property
    def field(self) -> str:
        """The body field that holds the text: for errors about its size."""
        return "prompt" if self.completion else "messages"


def is_chat(body: Mapping[str, Any]) -> bool:
    """Whether a request body is the chat form (it has ``messages`` or ``prompt``)."""
    return "messages" in body or "prompt" in body


def parse_body(
    body: Any, settings: Settings, profile: Profile = HUNYUAN_MT_7B
) -> TranslationRequest | ChatRequest:
    """A request API body, either form: the chat form when it has ``messages`` or ``prompt``.

    Raises InvalidRequest (400) or PayloadTooLarge (413).
    """
    fields = decode_body(body)
    if is_chat(fields):
        return parse_chat(fields, settings, profile)
    return parse_request(fields, settings, profile)


def parse_chat(
    fields: Mapping[str, Any], settings: Settings, profile: Profile = HUNYUAN_MT_7B
) -> ChatRequest:
    """Validate a chat form body against the settings' limits (and, translating, the model
    family's features). Raises InvalidRequest (400) or PayloadTooLarge (413)."""
    _check_fields(fields)
    completion = "prompt" in fields
    turns = _prompt_turns(fields["prompt"]) if completion else turns_of(fields["messages"])
    total = sum(len(turn.content) for turn in turns)
    field = "prompt" if completion else "messages"
    if total > settings.limits.max_chars_per_text:
        raise PayloadTooLarge(
            f"the {field} hold {total} characters",
            allowed=f"at most {settings.limits.max_chars_per_text}",
            field=field,
        )
    limits = settings.limits
    request = ChatRequest(
        turns=turns,
        completion=completion,
        max_new_tokens=max_tokens_of(fields.get("max_tokens"), limits.max_new_tokens),
        sampling=sampling_of(fields, settings.sampling),
        n=choices_of(fields.get("n"), limits.max_texts_per_request),
        stop=stops_of(fields.get("stop")),
        stream=flag(fields, "stream"),
    )
    if not any(name in fields for name in TRANSLATION_FIELDS):
        return request
    return replace(request, translation=_translation(request, fields, settings, profile))


def _check_fields(fields: Mapping[str, Any]) -> None:
    for key in fields:
        if key not in FIELDS:
            raise InvalidRequest(f"unknown field {brief(key)}", allowed=list(FIELDS), field=key)
    if "messages" in fields and "prompt" in fields:
        raise InvalidRequest(
            "messages and prompt together: a request is a conversation or a prompt",
            allowed="messages or prompt",
            field="prompt",
        )


def turns_of(messages: Any) -> tuple[ChatTurn, ...]:
    """OpenAI ``messages`` as the conversation's turns: roles checked (developer is system),
    text parts joined, system messages first (merged into one) and a user message last.

    Raises InvalidRequest naming the message, for anything but text.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            "messages must be a non-empty list of {role, content} objects",
            allowed=[{"role": "user", "content": "..."}],
            field="messages",
        )
    turns = [_turn(message, index) for index, message in enumerate(messages)]
    leading = 0
    while leading < len(turns) and turns[leading].role == "system":
        leading += 1
    if any(turn.role == "system" for turn in turns[leading:]):
        raise InvalidRequest(
            "system (or developer) messages must come first: the model's chat template has a "
            "system prompt only at the start",
            allowed="system messages, then user and assistant messages",
            field="messages",
        )
    if turns[-1].role != "user":
        raise InvalidRequest(
            f"the last message must be a user message, got {turns[-1].role}: the model answers "
            "the last user turn",
            allowed="a conversation ending with a user message",
            field="messages",
        )
    if leading > 1:
        merged = ChatTurn("system", "\n\n".join(turn.content for turn in turns[:leading]))
        turns = [merged, *turns[leading:]]
    return tuple(turns)


def _turn(message: Any, index: int) -> ChatTurn:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidRequest(
            f"{where} must be an object with role and content, got {type(message).__name__}",
            allowed={"role": list(ROLES), "content": "string or text parts"},
            field=where,
        )
    for key, value in message.items():
        if key not in MESSAGE_KEYS:
            why = "participant names" if key == "name" else f"the message field {brief(key)}"
            raise InvalidRequest(
                f"{where}: {why} cannot be rendered by the model's chat template",
                allowed=["role", "content"],
                field=f"{where}.{key}",
            )
        if key in MESSAGE_KEYS[2:] and value not in (None, [], ""):
            raise InvalidRequest(
                f"{where}.{key}: the model has no tools, audio or refusals",
                allowed="leave it out (or null)",
                field=f"{where}.{key}",
            )
    role = message.get("role")
    if role not in ROLES:
        raise InvalidRequest(
            f"{where}.role {brief(role)} is not supported (the model has no tools)",
            allowed=list(ROLES),
            field=f"{where}.role",
        )
    return ChatTurn(ROLES[role], _content(message.get("content"), f"{where}.content"))


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined by line breaks."""
    if isinstance(content, list):
        texts = [_text_part(part, f"{where}[{i}]") for i, part in enumerate(content)]
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise InvalidRequest(
            f"{where} must be a string or a list of text parts, got {brief(content)}",
            allowed=["...", [{"type": "text", "text": "..."}]],
            field=where,
        )
    if not is_unicode(content):
        raise InvalidRequest(
            f"{where} contains a lone surrogate (not valid Unicode)",
            allowed="text that encodes as UTF-8",
            field=where,
        )
    return content


def _text_part(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str) and set(part) <= {"type", "text"}:
        return str(part["text"])
    what = f"a {kind!r} part" if isinstance(kind, str) else brief(part)
    raise InvalidRequest(
        f"{where} is {what}: the model reads text only (no images, audio or files)",
        allowed={"type": "text", "text": "..."},
        field=where,
    )


def _prompt_turns(prompt: Any) -> tuple[ChatTurn, ...]:
    """A completion's prompt (a string, or a list of one string) as one user turn."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest(
            f"prompt must be a non-empty string (or a list of one), got {brief(prompt)}",
            allowed="a string; token ids and several prompts are not supported",
            field="prompt",
        )
    if not is_unicode(prompt):
        raise InvalidRequest(
            "prompt contains a lone surrogate (not valid Unicode)",
            allowed="text that encodes as UTF-8",
            field="prompt",
        )
    return (ChatTurn("user", prompt),)


def _translation(
    request: ChatRequest, fields: Mapping[str, Any], settings: Settings, profile: Profile
) -> TranslationRequest:
    """The request API's request for translating the last user message (or the prompt)."""
    body = {key: fields[key] for key in TRANSLATION_FIELDS if key in fields}
    body.update(
        text=request.turns[-1].content,
        max_new_tokens=request.max_new_tokens,
        stream=request.stream,
    )
    try:
        return parse_request(body, settings, profile)
    except ServiceError as error:
        if error.field == "text":  # name the field the client sent
            what = "the prompt" if request.completion else "the last user message"
            error.message = f"{what}: {error.message}"
            error.field = request.field
            error.args = (error.message,)
        raise


# Rendering.


def render_choices(
    request: ChatRequest,
    results: Sequence[GenerationResult],
    input_tokens: int,
    template: str,
    markup: Markup | None,
    request_id: str | None,
    target_language: Sequence[TargetLanguage] | None = None,
) -> dict[str, Any]:
    """The reply of a chat form request whose choices were all generated (stop strings already
    applied: :func:`~hymt_serve.request.chat_options.apply_stop`); a translation's choices
    rendered as the request API renders a text (its ``<target>`` wrapper or markup, and its
    ``source_lang``, ``target_lang`` and ``detected`` at the top), with the language check's
    outcome (``target_language``, when it judged them) on each choice and the worst at the top."""
    if request.translation is None:
        return render_chat(request, results, input_tokens, template, request_id)
    rendered = [
        render_response(request.translation, [r], [input_tokens], [template], [markup], None)
        for r in results
    ]
    texts = [
        replace(r, text=body["translation"]) for r, body in zip(results, rendered, strict=True)
    ]
    reply = render_chat(request, texts, input_tokens, template, request_id)
    if target_language is not None:
        for choice, outcome in zip(reply["choices"], target_language, strict=True):
            choice["target_language"] = outcome
        reply["target_language"] = worst(target_language)
    keys = ("detected", "source_lang", "target_lang")
    return {**reply, **{key: rendered[0][key] for key in keys if key in rendered[0]}}


def render_chat(
    request: ChatRequest,
    results: Sequence[GenerationResult],
    input_tokens: int,
    prompt: str,
    request_id: str | None,
) -> dict[str, Any]:
    """The reply of a chat form request whose choices were all generated (stop strings already
    applied): ``choices`` (index, text, finish_reason, output_tokens), which ``prompt`` the
    text went through ("chat", or the model card's template), ``usage`` (the prompt counted
    once) and the request id."""
    choices = [
        {
            "index": index,
            "text": result.text,
            "finish_reason": result.finish_reason,
            "output_tokens": result.output_tokens,
        }
        for index, result in enumerate(results)
    ]
    return {
        "choices": choices,
        "prompt": prompt,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": sum(result.output_tokens for result in results),
        },
        "request_id": request_id,
    }


class ChoiceStream:
    """One choice's streamed text: token ids in, text deltas out (``{"delta", "index"}`` events
    through ``send``), never past a stop string and never holding part of one: text that could
    begin a stop string waits until the next tokens tell."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        send: Callable[[str], None],
        stop: Sequence[str] = (),
    ) -> None:
        self._decoder = IncrementalDecoder(decode)
        self._send = send
        self._stop = tuple(stop)
        self._text = ""
        self._sent = 0
        self._stopped = False

    def push(self, token_ids: list[int]) -> None:
        if not self._stopped:
            self._text += self._decoder.push(token_ids)
            self._flush(final=False)

    def finish(self, final_text: str) -> None:
        """Send what is left of the row's whole text ``final_text`` (before any stop string)."""
        if not self._stopped:
            self._text += self._decoder.finish(final_text)
            self._flush(final=True)

    def _flush(self, *, final: bool) -> None:
        cut, self._stopped = cut_at_stop(self._text, self._stop)
        end = len(cut) if self._stopped or final else len(cut) - held_length(cut, self._stop)
        if end > self._sent:
            self._send(self._text[self._sent : end])
            self._sent = end
