"""The translation service: request bodies in, one reply per request out.

It holds the request-level logic between TorchServe and an :class:`Engine` and imports no torch,
so it is tested with a fake engine in milliseconds. It is the one error boundary: a bad request
becomes its own 4xx reply, an engine failure becomes a 5xx reply for the requests of that batch,
and the number of replies always equals the number of requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from hymt_serve.engine.types import GenerationResult, GenerationRow
from hymt_serve.request.batching import chunks, merge, split
from hymt_serve.request.errors import GenerationFailed, PayloadTooLarge, ServiceError
from hymt_serve.request.metrics import NullRecorder, Recorder
from hymt_serve.request.prompts import Template, build_prompt
from hymt_serve.request.protocol import TranslationRequest, parse_request, render_response
from hymt_serve.request.settings import Settings
from hymt_serve.request.streaming import IncrementalDecoder

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """What the service needs from a model engine."""

    def encode_prompt(self, user_turn: str) -> list[int]:
        """Token ids of ``user_turn`` rendered as one user turn by the chat template."""
        ...

    def generate(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        """One result per row, in order. Raises ServiceError (e.g. OutOfMemory) or anything."""
        ...

    def stream(self, row: GenerationRow, emit: Callable[[list[int]], None]) -> GenerationResult:
        """Generate one row, calling ``emit`` with new token ids as they come."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens."""
        ...

    def submit(
        self, row: GenerationRow, emit: Callable[[list[int]], None] | None = None
    ) -> Future[GenerationResult]:
        """Queue one row for the engine's own scheduler (async mode); ``emit`` gets new token
        ids as they come, on the scheduler's thread. Raises ServiceError (e.g. Overloaded)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the loaded model and the choices made at load."""
        ...


StreamSink = Callable[[int, str], None]  # (request index in the batch, text delta)
Generated = list[GenerationResult] | ServiceError


@dataclass(frozen=True)
class Prepared:
    """A valid request with its prompts tokenised."""

    request: TranslationRequest
    rows: tuple[GenerationRow, ...]
    templates: tuple[Template, ...]


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    stream: bool = False


Outcome = Prepared | ServiceError


class TranslationService:
    """Parses, tokenises, generates and renders; never raises for a single bad request."""

    def __init__(self, engine: Engine, settings: Settings, recorder: Recorder | None = None):
        self.engine = engine
        self.settings = settings
        self.recorder: Recorder = recorder or NullRecorder()

    def prepare(self, bodies: Sequence[Any]) -> list[Outcome]:
        """Validate each body and tokenise its prompts; a failure stays in its own slot (a
        ServiceError given as a body is that request's outcome)."""
        self.recorder.requests(len(bodies))
        return [self._prepare_one(body) for body in bodies]

    def _prepare_one(self, body: Any) -> Outcome:
        if isinstance(body, ServiceError):  # the transport already refused it
            return body
        try:
            request = parse_request(body, self.settings)
            return self._tokenise(request)
        except ServiceError as error:
            return error
        except Exception as exc:  # the boundary: one request's failure stays in its slot
            logger.exception("preparing a request failed")
            return GenerationFailed(
                f"the request could not be prepared: {type(exc).__name__}",
                allowed="a JSON object as documented",
            )

    def _tokenise(self, request: TranslationRequest) -> Prepared:
        rows, templates = [], []
        for index, text in enumerate(request.texts):
            prompt, template = build_prompt(text, request.source, request.target)
            ids = self.engine.encode_prompt(prompt)
            if len(ids) > self.settings.max_input_tokens:
                where = "text" if request.single else f"text[{index}]"
                raise PayloadTooLarge(
                    f"{where} makes a prompt of {len(ids)} tokens",
                    allowed=f"at most {self.settings.max_input_tokens} prompt tokens per text",
                    field="text",
                )
            rows.append(GenerationRow(tuple(ids), request.max_new_tokens, request.sampling))
            templates.append(template)
        return Prepared(request, tuple(rows), tuple(templates))

    def generate(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None = None
    ) -> list[Generated]:
        """Every valid request's rows through the engine as one batch, except streaming
        requests (when a ``sink`` is given), which run one at a time and send text deltas."""
        streaming = {
            i
            for i, o in enumerate(outcomes)
            if sink is not None and isinstance(o, Prepared) and o.request.stream
        }
        results = self._generate_batch(
            [None if i in streaming else o for i, o in enumerate(outcomes)]
        )
        for index in sorted(streaming):
            prepared = outcomes[index]
            assert isinstance(prepared, Prepared) and sink is not None
            results[index] = self._stream_one(index, prepared, sink)
        return [r if r is not None else GenerationFailed("no result") for r in results]

    def _generate_batch(self, outcomes: Sequence[Outcome | None]) -> list[Generated | None]:
        groups = [o.rows if isinstance(o, Prepared) else None for o in outcomes]
        rows, owners = merge(groups)
        if not rows:
            return [o if isinstance(o, ServiceError) else None for o in outcomes]
        self.recorder.batch(requests=sum(g is not None for g in groups), rows=len(rows))
        generated = self._guarded(lambda: self._run_engine(rows, self._chunked(rows)))
        if isinstance(generated, ServiceError):
            return [generated if isinstance(o, Prepared) else o for o in outcomes]
        per_request = split(generated, owners, len(outcomes))
        return [per_request[i] if isinstance(o, Prepared) else o for i, o in enumerate(outcomes)]

    def _stream_one(self, index: int, prepared: Prepared, sink: StreamSink) -> Generated:
        row = prepared.rows[0]
        decoder = IncrementalDecoder(self.engine.decode)

        def emit(token_ids: list[int]) -> None:
            delta = decoder.push(token_ids)
            if delta:
                sink(index, delta)

        self.recorder.batch(requests=1, rows=1)
        outcome = self._guarded(
            lambda: self._run_engine([row], lambda: [self.engine.stream(row, emit)])
        )
        if isinstance(outcome, ServiceError):
            return outcome
        tail = decoder.finish(outcome[0].text)
        if tail:
            sink(index, tail)
        return outcome

    def _guarded(self, run: Callable[[], list[GenerationResult]]) -> Generated:
        """The boundary: an engine failure becomes the ServiceError of the requests it served."""
        try:
            return run()
        except Exception as exc:
            return _as_failure(exc)

    def _chunked(self, rows: Sequence[GenerationRow]) -> Callable[[], list[GenerationResult]]:
        def run() -> list[GenerationResult]:
            results: list[GenerationResult] = []
            for chunk in chunks(rows, self.settings.max_batch_rows):
                results.extend(self.engine.generate(chunk))
            return results

        return run

    def _run_engine(
        self, rows: Sequence[GenerationRow], run: Callable[[], list[GenerationResult]]
    ) -> list[GenerationResult]:
        started = time.perf_counter()
        results = run()
        self._record(rows, results, time.perf_counter() - started)
        return results

    def _record(
        self, rows: Sequence[GenerationRow], results: Sequence[GenerationResult], seconds: float
    ) -> None:
        n_in = sum(len(row.prompt_ids) for row in rows)
        n_out = sum(result.output_tokens for result in results)
        self.recorder.generation(seconds=seconds, input_tokens=n_in, output_tokens=n_out)
        logger.info(
            "generated %d rows: %d prompt tokens, %d output tokens in %.3f s",
            len(rows),
            n_in,
            n_out,
            seconds,
        )

    async def generate_async(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None = None
    ) -> list[Generated]:
        """Like :meth:`generate`, for TorchServe's async mode: each request's rows go to the
        engine's scheduler, which batches them with the rows of every other request in flight;
        a streaming request's text deltas reach ``sink`` on the event loop."""
        loop = asyncio.get_running_loop()
        tasks = [
            self._request_async(loop, index, o, sink) if isinstance(o, Prepared) else _done(o)
            for index, o in enumerate(outcomes)
        ]
        return list(await asyncio.gather(*tasks))

    async def _request_async(
        self,
        loop: asyncio.AbstractEventLoop,
        index: int,
        prepared: Prepared,
        sink: StreamSink | None,
    ) -> Generated:
        stream = sink is not None and prepared.request.stream
        decoder = IncrementalDecoder(self.engine.decode)

        def on_loop(token_ids: list[int]) -> None:
            delta = decoder.push(token_ids)
            if delta and sink is not None:
                sink(index, delta)

        def emit(token_ids: list[int]) -> None:  # called on the scheduler's thread
            loop.call_soon_threadsafe(on_loop, token_ids)

        self.recorder.batch(requests=1, rows=len(prepared.rows))
        started = time.perf_counter()
        futures: list[asyncio.Future[GenerationResult]] = []
        try:
            for row in prepared.rows:
                submitted = self.engine.submit(row, emit if stream else None)
                futures.append(asyncio.wrap_future(submitted, loop=loop))
            results = await asyncio.gather(*futures)
        except Exception as exc:
            _cancel(futures)
            return _as_failure(exc)
        if stream and sink is not None:
            tail = decoder.finish(results[0].text)
            if tail:
                sink(index, tail)
        self._record(prepared.rows, results, time.perf_counter() - started)
        return list(results)

    def render(
        self,
        outcomes: Sequence[Outcome],
        generated: Sequence[Generated],
        request_ids: Sequence[str | None],
    ) -> list[Reply]:
        """One reply per request: 200 with the translations, or the error's status and body."""
        replies = []
        for outcome, result, request_id in zip(outcomes, generated, request_ids, strict=True):
            if isinstance(result, ServiceError):
                self.recorder.error(result.error_type)
                logger.info(
                    "request %s failed: %d %s", request_id, result.status, result.error_type
                )
                stream = isinstance(outcome, Prepared) and outcome.request.stream
                replies.append(Reply(result.status, result.body(request_id), stream))
                continue
            assert isinstance(outcome, Prepared)
            input_tokens = [len(row.prompt_ids) for row in outcome.rows]
            body = render_response(
                outcome.request, result, input_tokens, outcome.templates, request_id
            )
            replies.append(Reply(200, body, outcome.request.stream))
        return replies


def _as_failure(exc: Exception) -> ServiceError:
    """The boundary's translation: a ServiceError stays itself; anything else is logged and
    becomes 500 generation_failed (its details stay in the log)."""
    if isinstance(exc, ServiceError):
        return exc
    logger.error("generation failed", exc_info=exc)
    return GenerationFailed(f"generation failed: {type(exc).__name__}", allowed="retry the request")


async def _done(outcome: ServiceError) -> Generated:
    return outcome


def _cancel(futures: Sequence[asyncio.Future[GenerationResult]]) -> None:
    """Drop the results of rows already submitted for a request that failed."""
    for future in futures:
        future.cancel()
