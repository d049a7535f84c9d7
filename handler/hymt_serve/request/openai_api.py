"""OpenAI's chat and completion APIs in and out of the request API's chat form: what the web
front end's ``/v1`` routes call. Pure Python (no torch, no HTTP). This module reads the calls
and holds the errors and the model list; the replies and the server-sent events are
:mod:`hymt_serve.request.openai_reply`'s.

A route, in order (``Call``'s docstring has the details)::

    call = parse_chat(body, models)            # or parse_completion; raises OpenAIError
    ... the route checks the client's key and quota (unauthorized(), quota_exceeded()),
        charging call.characters ...
    POST call.forward (JSON) to TorchServe's /predictions/<model>
    not 200:   error = openai_reply.error_from_reply(status, body); answer error.status,
               error.body()
    no stream: answer 200, openai_reply.response(call, reply_json)
    stream:    stream = openai_reply.Stream(call); send stream.opening(), then
               stream.event(line) for each NDJSON line TorchServe sends, until
               stream.finished; stream.broken() if the connection ends first (each returns
               SSE strings, the last one "data: [DONE]")

``GET /v1/models`` answers ``models_list(ids, created)``; ``GET /v1/models/<id>``
``model_card(id, created)`` or ``model_not_found(id)``'s body with 404.

Errors are OpenAI's: ``{"error": {"message", "type", "param", "code"}}`` with 400
(invalid_request_error), 401, 404 (model_not_found), 429, 500 and 503 (server_error). Options
the model cannot honour (tools, images and audio, response formats other than text,
log-probabilities, penalties other than 0, reasoning) are refused with 400, never ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hymt_serve.request.chat import TRANSLATION_FIELDS, turns_of
from hymt_serve.request.errors import (
    GenerationFailed,
    InvalidRequest,
    OutOfMemory,
    Overloaded,
    PayloadTooLarge,
    SameLanguage,
    ServiceError,
    UnsupportedLanguage,
)
from hymt_serve.request.protocol import decode_body

Kind = Literal["chat", "completion"]
OWNED_BY = "tencent"
# Fields each API passes on to the chat form as they are (validated by the handler).
GENERATION = ("temperature", "top_p", "n", "stop", "seed")
# Ours, as extra body fields; "cache": the translation memory's switch (docs/translation-memory.md).
EXTRAS = ("top_k", "repetition_penalty", "cache", *TRANSLATION_FIELDS)
# Fields accepted and not passed on: they change nothing about the answer.
IGNORED = ("user", "metadata", "prompt_cache_key", "safety_identifier")
# Fields accepted only at their neutral value (a request for anything else is refused).
CHAT_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (True, False),
    "store": (False,),
    "service_tier": ("auto", "default"),
}
COMPLETION_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (0,),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
    "best_of": (1,),
}
# Why a refused option cannot be honoured (default: the model does not have it).
WHY = {
    "frequency_penalty": "the engine has repetition_penalty (an extra field), not OpenAI's "
    "additive penalties",
    "presence_penalty": "the engine has repetition_penalty (an extra field), not OpenAI's "
    "additive penalties",
    "logprobs": "log-probabilities are not returned",
    "top_logprobs": "log-probabilities are not returned",
    "logit_bias": "the engine does not bias logits",
    "response_format": "the model answers in text only (no JSON mode or schemas)",
    "modalities": "the model answers in text only",
    "audio": "the model answers in text only",
    "tools": "the model has no tool calling",
    "tool_choice": "the model has no tool calling",
    "functions": "the model has no function calling",
    "function_call": "the model has no function calling",
    "reasoning_effort": "the model does not reason before answering",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "the model has no web search",
    "store": "completions are not stored",
    "service_tier": "there are no service tiers",
    "echo": "the prompt is not echoed",
    "suffix": "the model does not fill in between a prompt and a suffix",
    "best_of": "best_of needs log-probabilities; use n",
}
# An error line's status (a stream's status went out with its first delta).
STATUSES = {
    kind.error_type: kind.status
    for kind in (
        *(InvalidRequest, UnsupportedLanguage, SameLanguage, PayloadTooLarge),
        *(GenerationFailed, Overloaded, OutOfMemory),
    )
}
REFUSED = ("audio", "reasoning_effort", "prediction", "web_search_options", "verbosity")


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: ``status`` with :meth:`body`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type, self.param, self.code = kind, param, code  # "type" in OpenAI's body

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param}
        return {"error": {**error, "code": self.code}}


def unauthorized(message: str = "Incorrect API key provided.") -> OpenAIError:
    """401 for a missing or unknown key (the front end's keys)."""
    return OpenAIError(401, message, code="invalid_api_key")


def quota_exceeded(message: str) -> OpenAIError:
    """429 for a key past its character limit."""
    return OpenAIError(429, message, kind="insufficient_quota", code="insufficient_quota")


def rate_limited(message: str) -> OpenAIError:
    """429 for a key with too many requests in flight."""
    return OpenAIError(429, message, kind="requests", code="rate_limit_exceeded")


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model {model!r} does not exist.",
        param="model",
        code="model_not_found",
    )


@dataclass(frozen=True)
class Call:
    """One OpenAI request, validated: what to send TorchServe and what its answer needs.

    ``forward`` is the request API's chat form (docs/api.md, request/chat.py): ``messages``
    (roles system, user, assistant; content strings) or ``prompt``, ``max_tokens``, the
    generation options as given, ``stream``, and our extra fields (``target_lang``, ...). POST
    it as JSON to ``/predictions/<model>`` on TorchServe. Its reply is ``{"choices": [{"index",
    "text", "finish_reason", "output_tokens"}], "usage": {"input_tokens", "output_tokens"},
    "prompt", "request_id", ...}``; streamed, NDJSON lines ``{"delta", "index"}`` and that
    reply as the last line. ``characters`` is what a key's character limit is charged.
    """

    kind: Kind
    model: str
    forward: dict[str, Any]
    characters: int
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    id: str = ""  # chatcmpl-... or cmpl-...
    created: int = field(default_factory=lambda: int(time.time()))


def parse_chat(body: Any, models: Sequence[str]) -> Call:
    """A ``POST /v1/chat/completions`` body (a dict, or the raw bytes) checked against what the
    server can do; ``models`` are the ids it serves. Raises OpenAIError (400, 404)."""
    fields = _fields(body, ("model", "messages"))
    _check_options(fields, CHAT_NEUTRAL, ("messages", "max_tokens", "max_completion_tokens"))
    try:
        turns = turns_of(fields["messages"])
    except ServiceError as error:
        raise OpenAIError(400, error.message, param=error.field) from None
    forward: dict[str, Any] = {
        "messages": [{"role": turn.role, "content": turn.content} for turn in turns]
    }
    tokens = _max_tokens(fields)
    return _call("chat", fields, models, forward, tokens, sum(len(t.content) for t in turns))


def parse_completion(body: Any, models: Sequence[str]) -> Call:
    """A ``POST /v1/completions`` body; the prompt is one user turn through the model's chat
    template. Raises OpenAIError (400, 404)."""
    fields = _fields(body, ("model", "prompt"))
    _check_options(fields, COMPLETION_NEUTRAL, ("prompt", "max_tokens"))
    prompt = fields["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise OpenAIError(
            400,
            "prompt must be a string (or a list of one string): token ids and several prompts "
            "are not supported",
            param="prompt",
        )
    tokens = fields.get("max_tokens")
    return _call("completion", fields, models, {"prompt": prompt}, tokens, len(prompt))


def _fields(body: Any, required: Sequence[str]) -> dict[str, Any]:
    """The body's fields, null ones dropped (OpenAI reads null as not given)."""
    try:
        decoded = decode_body(body)
    except ServiceError as error:
        raise OpenAIError(400, error.message) from None
    fields = {key: value for key, value in decoded.items() if value is not None}
    for name in required:
        if name not in fields:
            raise OpenAIError(
                400, f"Missing required parameter: {name!r}.", param=name,
                code="missing_required_parameter",
            )  # fmt: skip
    if not isinstance(fields["model"], str):
        raise OpenAIError(400, "model must be a string", param="model")
    return fields


def _check_options(
    fields: Mapping[str, Any], neutral: Mapping[str, tuple[Any, ...]], own: Sequence[str]
) -> None:
    """Every field known; options the model cannot honour only at their neutral value."""
    known = {"model", "stream", "stream_options", *own, *GENERATION, *EXTRAS, *IGNORED}
    for key, value in fields.items():
        if key in neutral:
            if any(_same(value, ok) for ok in neutral[key]):
                continue
            why = WHY.get(key, "the model does not support it")
            raise OpenAIError(
                400,
                f"{key}={json.dumps(value)[:80]} is not supported: {why}",
                param=key,
                code="unsupported_parameter",
            )
        if key in REFUSED:
            why = WHY.get(key, "the model does not support it")
            raise OpenAIError(
                400, f"{key} is not supported: {why}", param=key, code="unsupported_parameter"
            )
        if key not in known:
            raise OpenAIError(
                400,
                f"Unrecognized request argument supplied: {key}",
                param=key,
                code="unknown_parameter",
            )


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same kind (``0 == False`` in Python, not in JSON)."""
    return bool(value == neutral and isinstance(value, bool) == isinstance(neutral, bool))


def _max_tokens(fields: Mapping[str, Any]) -> Any:
    """``max_completion_tokens`` (OpenAI's current name) or ``max_tokens``."""
    old, new = fields.get("max_tokens"), fields.get("max_completion_tokens")
    if old is not None and new is not None and old != new:
        raise OpenAIError(
            400,
            "max_tokens and max_completion_tokens differ; give one",
            param="max_completion_tokens",
        )
    return new if new is not None else old


def _call(
    kind: Kind,
    fields: Mapping[str, Any],
    models: Sequence[str],
    forward: dict[str, Any],
    max_tokens: Any,
    characters: int,
) -> Call:
    if fields["model"] not in models:
        raise model_not_found(fields["model"])
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError(
            400, f"stream must be a boolean, got {json.dumps(stream)}", param="stream"
        )
    include_usage = _include_usage(fields.get("stream_options"), stream)
    forward.update({key: fields[key] for key in (*GENERATION, *EXTRAS) if key in fields})
    if max_tokens is not None:
        forward["max_tokens"] = max_tokens
    forward["stream"] = stream
    n = fields.get("n", 1)
    return Call(
        kind,
        fields["model"],
        forward,
        characters,
        stream=stream,
        include_usage=include_usage,
        n=n if isinstance(n, int) and not isinstance(n, bool) else 1,
        id=f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
    )


def _include_usage(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise OpenAIError(
            400,
            "stream_options is only allowed when stream is true",
            param="stream_options",
        )
    ok = isinstance(options, dict) and set(options) <= {"include_usage"}
    usage = options.get("include_usage", False) if isinstance(options, dict) else None
    if not ok or not isinstance(usage, bool):
        raise OpenAIError(
            400,
            f'stream_options must be {{"include_usage": true|false}}, got {json.dumps(options)}',
            param="stream_options",
        )
    return usage


# Models.


def model_card(model_id: str, created: int, owned_by: str = OWNED_BY) -> dict[str, Any]:
    """One model as ``GET /v1/models/<id>`` answers it."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}


def models_list(ids: Sequence[str], created: int, owned_by: str = OWNED_BY) -> dict[str, Any]:
    """``GET /v1/models``: the ids the server answers to (``created``: when it started)."""
    return {"object": "list", "data": [model_card(i, created, owned_by) for i in ids]}
