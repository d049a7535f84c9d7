"""In-process handler test helpers: TorchServe's real Context and metric cache, a fake engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from hymt_serve.core.types import ChatTurn, GenerationResult, GenerationRow, OnTokens
from hymt_serve.request.errors import as_service_error

REPO = Path(__file__).resolve().parents[2]


def make_context(
    handler_settings: dict[str, Any],
    model_dir: Path | str = ".",
    *,
    batch_size: int = 4,
    frontend: dict[str, Any] | None = None,
) -> Context:
    """The Context TorchServe builds for a worker; ``frontend`` adds model-config.yaml's
    top-level keys (e.g. ``asyncCommunication``)."""
    metrics = MetricsCacheYamlImpl(config_file_path=str(REPO / "configs/metrics.yaml"))
    metrics.initialize_cache()
    metrics.model_name = "hunyuan-mt"
    return Context(
        "hunyuan-mt",
        str(model_dir),
        {},
        batch_size,
        None,
        "0.12.0",
        metrics=metrics,
        model_yaml_config={**(frontend or {}), "handler": handler_settings},
    )


# The header maps TorchServe 0.12.0 builds per request (seen on a running server): an HTTP JSON
# post, a gRPC Predictions/StreamPredictions call, a gRPC StreamPredictions2 call.
HTTP_HEADERS: dict[str, Any] = {
    "body": {"content-type": "application/json"},
    "Content-Type": "application/json",
    "explain": "False",
    "url_path": "",
}
GRPC_HEADERS: dict[str, Any] = {"data": {"content-type": ""}}
GRPC_SEQUENCE_HEADERS: dict[str, Any] = {
    "data": {"content-type": ""},
    "ts_request_sequence_id": "seq-1",
    "ts_request_sequence_end": "true",
}


def set_batch(
    context: Context, size: int, headers: Sequence[Mapping[str, Any]] | None = None
) -> None:
    """What TorchServe's worker does before each call of handle() (HTTP requests by default)."""
    context.request_ids = {i: f"req-{i}" for i in range(size)}
    chosen = headers or [HTTP_HEADERS] * size
    context.request_processor = [RequestProcessor(dict(h)) for h in chosen]
    context.metrics.request_ids = context.request_ids


class FakeEngine:
    """Encodes characters as ids; "translates" the source text of the prompt (what follows its
    first blank line) with ``translate``: upper-casing by default.

    Rows submitted before :meth:`run` make one batch (``calls`` records the batch sizes,
    ``rows`` every row generated; rows submitted while a batch finishes make the next); with
    ``failure`` set, the engine fails that batch's rows with it (as the scheduler does). A
    streaming row gets its ids one at a time."""

    def __init__(
        self,
        failure: BaseException | None = None,
        translate: Callable[[str], str] = str.upper,
    ) -> None:
        self.failure = failure
        self.translate = translate
        self.prompts: list[str] = []
        self.rows: list[GenerationRow] = []
        self.calls: list[int] = []
        self._queued: list[tuple[GenerationRow, Future[GenerationResult], OnTokens | None]] = []

    def encode_prompt(self, user_turn: str) -> list[int]:
        return [ord(c) for c in user_turn]

    def encode_chat(self, turns: Sequence[ChatTurn]) -> list[int]:
        """Each turn as "[role] text", the last one after a blank line (so the fake's reply
        is the last turn's text, upper-cased)."""
        *earlier, last = turns
        head = "".join(f"[{turn.role}] {turn.content} " for turn in earlier)
        return [ord(c) for c in f"{head}[{last.role}]\n\n{last.content}"]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(map(chr, token_ids))

    def submit(
        self, row: GenerationRow, on_tokens: OnTokens | None = None
    ) -> Future[GenerationResult]:
        future: Future[GenerationResult] = Future()
        self._queued.append((row, future, on_tokens))
        return future

    def run(self, futures: Sequence[Future[Any]]) -> None:
        while self._queued:
            self._batch()

    def _batch(self) -> None:
        queued, self._queued = self._queued, []
        self.calls.append(len(queued))
        for row, future, on_tokens in queued:
            if future.cancelled():
                continue
            if self.failure is not None:
                future.set_exception(as_service_error(self.failure, rows=len(queued)))
                continue
            prompt = "".join(chr(i) for i in row.prompt_ids)
            self.prompts.append(prompt)
            self.rows.append(row)
            source = prompt.split("\n\n", 1)[-1]  # a prompt with no blank line: all of it
            ids = tuple(ord(c) for c in self.translate(source))[: row.max_new_tokens]
            for token in ids if on_tokens is not None else ():
                on_tokens([token])  # type: ignore[misc]
            finish = "stop" if len(ids) < row.max_new_tokens else "length"
            future.set_result(GenerationResult("".join(map(chr, ids)), ids, finish))

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "fake",
            "attention": "none",
            "dtype": "none",
            "device": "cpu",
            "quantization": "none",
        }


class SentParts:
    """Stands in for TorchServe's ``send_intermediate_predict_response``: what the handler sent
    ahead of its final replies, per request id and in order. Text deltas of streams are
    strings; async mode's replies go ahead of their (empty) final reply as bytes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | bytes]] = []

    def __call__(
        self, ret: dict[int, Any], ids: dict[int, str], message: str, code: int, context: Any
    ) -> None:
        for index, value in ret.items():
            self.sent.append((ids[index], value))
            # as TorchServe's does: the request's final reply becomes its stream's last part
            context.set_response_header(index, "ts_stream_next", "true")

    def reply(self, request_id: str) -> str:
        """The body sent ahead for ``request_id``, joined."""
        parts = [v for r, v in self.sent if r == request_id and isinstance(v, bytes)]
        return b"".join(parts).decode("utf-8")

    def events(self) -> list[tuple[str, str]]:
        """(request id, JSON line) of each stream event, in order."""
        return [(r, v) for r, v in self.sent if isinstance(v, str)]
