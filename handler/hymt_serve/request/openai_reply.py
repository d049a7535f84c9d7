"""OpenAI's replies to the calls :mod:`hymt_serve.request.openai_api` reads, from
TorchServe's: the whole response (``response``, ``usage_of``), TorchServe's error answers as
OpenAI's (``error_from_reply``), and a streamed call's server-sent events (``Stream``,
``sse``, ``DONE``). Pure Python (no torch, no HTTP).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hymt_serve.request.openai_api import STATUSES, Call, Kind, OpenAIError

DONE = "data: [DONE]\n\n"


# Replies.


def response(call: Call, reply: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI response (``chat.completion`` or ``text_completion``) for TorchServe's reply
    to ``call.forward``; a translation the language check judged carries its outcome as an
    extra field, ``target_language`` (ok, retried or mismatch: the worst of its choices)."""
    choices = [_choice(call.kind, choice) for choice in reply["choices"]]
    body = {
        "id": call.id,
        "object": "chat.completion" if call.kind == "chat" else "text_completion",
        "created": call.created,
        "model": call.model,
        "choices": choices,
        "usage": usage_of(reply),
        "system_fingerprint": None,
    }
    return {**body, **_checked(reply)}


def _checked(found: Mapping[str, Any]) -> dict[str, Any]:
    """``{"target_language": ...}`` when the reply (or a choice of it) has one, else empty."""
    return {"target_language": found["target_language"]} if "target_language" in found else {}


def _choice(kind: Kind, choice: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "chat":
        return {
            "index": choice["index"],
            "message": {"role": "assistant", "content": choice["text"], "refusal": None},
            "logprobs": None,
            "finish_reason": choice["finish_reason"],
        }
    return {
        "index": choice["index"],
        "text": choice["text"],
        "logprobs": None,
        "finish_reason": choice["finish_reason"],
    }


def usage_of(reply: Mapping[str, Any]) -> dict[str, int]:
    """OpenAI's usage from the reply's: the prompt counted once, every choice's tokens."""
    prompt, completion = reply["usage"]["input_tokens"], reply["usage"]["output_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def error_from_reply(status: int, body: Any) -> OpenAIError:
    """TorchServe's error answer (our JSON error body, TorchServe's own, or an empty body:
    bytes, text or parsed JSON) as OpenAI's.

    400 stays 400; 413 (too many characters or tokens) becomes 400 with
    ``context_length_exceeded``, as OpenAI answers an input too long; 503 and 507 (overloaded,
    out of memory: worth a retry) 503; the rest 500.
    """
    found = _json_of(body)
    message = str(found.get("error") or found.get("message") or "").strip()
    allowed = found.get("allowed")
    if message and allowed:  # the limit the request passed ("at most 4000 characters")
        message = f"{message} (allowed: {allowed})"
    param = found.get("field")
    kind = found.get("error_type")
    if status == 400 and kind is not None:
        code = None if kind == "invalid_request" else str(kind)
        return OpenAIError(400, message, param=param, code=code)
    if status == 413:
        return OpenAIError(
            400,
            message or "the request is larger than the server accepts (max_request_size)",
            param=param,
            code="context_length_exceeded",
        )
    if status in (503, 507):
        code = "out_of_memory" if status == 507 else "overloaded"
        retry = "the server is overloaded; retry after a short pause"
        return OpenAIError(503, message or retry, kind="server_error", code=code)
    if status == 400:  # TorchServe's own 400: its key for TorchServe was refused
        message = "the front end's key for TorchServe was refused"
    return OpenAIError(500, message or f"the model server answered {status}", kind="server_error")


def _json_of(body: Any) -> dict[str, Any]:
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {}
    return body if isinstance(body, dict) else {}


# Streams.


def sse(data: Mapping[str, Any]) -> str:
    """One server-sent event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class Stream:
    """A streamed call's server-sent events from TorchServe's NDJSON lines.

    Chat: a role chunk per choice (:meth:`opening`), a ``chat.completion.chunk`` with
    ``delta.content`` per text delta, a chunk with each choice's ``finish_reason``, the usage
    chunk (``choices: []``) when ``stream_options.include_usage``, then ``data: [DONE]``.
    Completions: ``text_completion`` chunks with ``text`` in the same order. An error line
    (or a stream cut short, :meth:`broken`) gives an ``{"error": ...}`` event, then
    ``data: [DONE]``.
    """

    def __init__(self, call: Call) -> None:
        self.call = call
        self.finished = False

    def opening(self) -> list[str]:
        """The first events: each chat choice's role (nothing for completions)."""
        if self.call.kind != "chat":
            return []
        return [self._chunk(i, {"role": "assistant", "content": ""}) for i in range(self.call.n)]

    def event(self, line: Mapping[str, Any]) -> list[str]:
        """The events for one of TorchServe's NDJSON lines (already parsed)."""
        if self.finished:
            return []
        if "delta" in line:
            return [self._chunk(int(line.get("index", 0)), {"content": line["delta"]})]
        if "choices" in line:
            return self._closing(line)
        status = STATUSES.get(str(line.get("error_type")), 500)
        return self.failed(error_from_reply(status, line))

    def failed(self, error: OpenAIError) -> list[str]:
        """The error event and the end of the stream."""
        self.finished = True
        return [sse(error.body()), DONE]

    def broken(self) -> list[str]:
        """The end of a stream whose connection closed before its last line."""
        if self.finished:
            return []
        message = "the model server's stream ended before the reply was complete"
        return self.failed(OpenAIError(500, message, kind="server_error"))

    def _closing(self, reply: Mapping[str, Any]) -> list[str]:
        """Each choice's finish chunk (with its ``target_language`` when the language check
        judged it), the usage chunk when asked for, ``[DONE]``."""
        self.finished = True
        events = [
            self._chunk(choice["index"], {}, choice["finish_reason"], _checked(choice))
            for choice in reply["choices"]
        ]
        if self.call.include_usage:
            events.append(sse({**self._head(), "choices": [], "usage": usage_of(reply)}))
        return [*events, DONE]

    def _head(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.call.kind == "chat" else "text_completion"
        head = {"id": self.call.id, "object": kind, "created": self.call.created}
        return {**head, "model": self.call.model, "system_fingerprint": None}

    def _chunk(
        self,
        index: int,
        delta: dict[str, Any],
        finish: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        if self.call.kind == "chat":
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            text = delta.get("content", "")
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        chunk = {**self._head(), "choices": [choice], **(extra or {})}
        if self.call.include_usage:
            chunk["usage"] = None
        return sse(chunk)
