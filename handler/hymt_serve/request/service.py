"""The translation service: request bodies in, one reply per request out.

It holds the request-level logic between TorchServe and the engine and imports no torch, so it
is tested with a fake engine in milliseconds. One path for both of TorchServe's modes: every
valid request's rows are submitted to the engine (``submit(row, on_tokens) -> future``), then
batch mode runs the engine until the batch's futures are done while async mode awaits them.
A bad request becomes its own 4xx reply, a failure while generating the 5xx of the requests
whose rows it hit, and the number of replies always equals the number of requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from hymt_serve.engine.types import GenerationResult, GenerationRow, OnTokens
from hymt_serve.request.errors import PayloadTooLarge, ServiceError, as_service_error
from hymt_serve.request.families import detect_profile
from hymt_serve.request.markup import Markup, to_tags
from hymt_serve.request.metrics import NullRecorder, Recorder
from hymt_serve.request.prompts import Template, build_prompt
from hymt_serve.request.protocol import TranslationRequest, parse_request, render_response
from hymt_serve.request.settings import Settings
from hymt_serve.request.streaming import IncrementalDecoder

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """What the service needs from the engine (in this process or in its own)."""

    def encode_prompt(self, user_turn: str) -> list[int]:
        """Token ids of ``user_turn`` rendered as one user turn by the chat template."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens."""
        ...

    def submit(
        self, row: GenerationRow, on_tokens: OnTokens | None = None
    ) -> Future[GenerationResult]:
        """Queue one row; ``on_tokens`` gets new token ids as they come (on the engine's
        stepping thread). Raises ServiceError (e.g. Overloaded, PayloadTooLarge); failures
        while generating come as the future's ServiceError."""
        ...

    def run(self, futures: Sequence[Future[GenerationResult]]) -> None:
        """Return once every future is done (stepping the engine on this thread if needed)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the loaded model and the choices made at load."""
        ...


StreamSink = Callable[[int, str], None]  # (request index in the batch, text delta)
# How a token callback reaches the sink's thread: called at once (batch mode) or handed to
# the event loop (async mode).
Hop = Callable[[Callable[[], None]], None]
Generated = list[GenerationResult] | ServiceError


@dataclass(frozen=True)
class Prepared:
    """A valid request with its prompts tokenised."""

    request: TranslationRequest
    rows: tuple[GenerationRow, ...]
    templates: tuple[Template, ...]
    markups: tuple[Markup | None, ...]  # per text: its markup behind <sN> tags (preserve_format)


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    stream: bool = False


Outcome = Prepared | ServiceError


class _Stream:
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


@dataclass
class _InFlight:
    """One request's rows in the engine."""

    prepared: Prepared
    futures: list[Future[GenerationResult]] = field(default_factory=list)
    stream: _Stream | None = None


class TranslationService:
    """Parses, tokenises, generates and renders; never raises for a single bad request."""

    def __init__(self, engine: Engine, settings: Settings, recorder: Recorder | None = None):
        self.engine = engine
        self.settings = settings
        self.recorder: Recorder = recorder or NullRecorder()
        # The model family: its prompt templates and the request fields it supports.
        self.profile = detect_profile(settings.model_path, settings.prompt_family)

    def prepare(self, bodies: Sequence[Any]) -> list[Outcome]:
        """Validate each body and tokenise its prompts; a failure stays in its own slot (a
        ServiceError given as a body is that request's outcome)."""
        self.recorder.requests(len(bodies))
        return [self._prepare_one(body) for body in bodies]

    def _prepare_one(self, body: Any) -> Outcome:
        if isinstance(body, ServiceError):  # the transport already refused it
            return body
        try:
            return self._tokenise(parse_request(body, self.settings, self.profile))
        except Exception as error:  # the boundary: one request's failure stays in its slot
            return as_service_error(error)

    def _tokenise(self, request: TranslationRequest) -> Prepared:
        rows, templates, markups = [], [], []
        options, candidates = request.features.options, request.features.candidates
        for index, text in enumerate(request.texts):
            markup = None
            if options.preserve_format in ("markdown", "html"):
                text, markup = to_tags(text, options.preserve_format)
            prompt, template = build_prompt(
                text,
                request.source,
                request.target,
                profile=self.profile,
                options=options,
                candidates=candidates[index] if candidates else (),
            )
            ids = self.engine.encode_prompt(prompt)
            if len(ids) > self.settings.max_input_tokens:
                where = "text" if request.single else f"text[{index}]"
                where += " with its candidates" if candidates else ""
                raise PayloadTooLarge(
                    f"{where} makes a prompt of {len(ids)} tokens",
                    allowed=f"at most {self.settings.max_input_tokens} prompt tokens per text",
                    field="text",
                )
            rows.append(GenerationRow(tuple(ids), request.max_new_tokens, request.sampling))
            templates.append(template)
            markups.append(markup)
        return Prepared(request, tuple(rows), tuple(templates), tuple(markups))

    def generate(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None = None
    ) -> list[Generated]:
        """TorchServe's batch mode: every valid request's rows go to the engine together, and
        the engine runs on this thread until they are done; streaming requests (when a
        ``sink`` is given) send their text deltas as they come."""
        started = time.perf_counter()
        flights = self._submit_all(outcomes, sink, _at_once)
        futures = _futures(flights)
        try:
            self.engine.run(futures)
        except Exception as error:  # the engine failed as a whole: every request of the batch
            failure = as_service_error(error, rows=len(futures))
            return [failure if isinstance(f, _InFlight) else f for f in flights]
        return self._collect(flights, started)

    async def generate_async(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None = None
    ) -> list[Generated]:
        """TorchServe's async mode: like :meth:`generate`, but awaited: the engine steps on
        its own and batches these rows with those of every other request in flight; text
        deltas reach ``sink`` on the event loop."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()

        def hop(call: Callable[[], None]) -> None:
            loop.call_soon_threadsafe(call)

        flights = self._submit_all(outcomes, sink, hop)
        futures = _futures(flights)
        if futures:
            await asyncio.wait([asyncio.wrap_future(f, loop=loop) for f in futures])
        return self._collect(flights, started)

    def _submit_all(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None, hop: Hop
    ) -> list[_InFlight | ServiceError]:
        valid = [o for o in outcomes if isinstance(o, Prepared)]
        if valid:
            self.recorder.batch(requests=len(valid), rows=sum(len(o.rows) for o in valid))
        return [self._submit(i, o, sink, hop) for i, o in enumerate(outcomes)]

    def _submit(
        self, index: int, outcome: Outcome, sink: StreamSink | None, hop: Hop
    ) -> _InFlight | ServiceError:
        """Submit a valid request's rows; a refusal (e.g. Overloaded) fails the request and
        withdraws its rows already submitted."""
        if isinstance(outcome, ServiceError):
            return outcome
        flight = _InFlight(outcome)
        on_tokens: OnTokens | None = None
        if sink is not None and outcome.request.stream:
            stream = flight.stream = _Stream(self.engine.decode, lambda d: sink(index, d))
            on_tokens = lambda ids: hop(lambda: stream.push(ids))  # noqa: E731
        try:
            for row in outcome.rows:
                flight.futures.append(self.engine.submit(row, on_tokens))
        except Exception as error:
            for future in flight.futures:
                future.cancel()
            return as_service_error(error)
        return flight

    def _collect(
        self, flights: Sequence[_InFlight | ServiceError], started: float
    ) -> list[Generated]:
        """Each request's results, or the first failure among its rows."""
        generated: list[Generated] = []
        rows: list[GenerationRow] = []
        done: list[GenerationResult] = []
        for flight in flights:
            if isinstance(flight, ServiceError):
                generated.append(flight)
                continue
            failure = next(filter(None, (f.exception() for f in flight.futures)), None)
            if failure is not None:
                generated.append(as_service_error(failure, rows=len(flight.futures)))
                continue
            results = [future.result() for future in flight.futures]
            if flight.stream is not None:
                flight.stream.finish(results[0].text)
            rows.extend(flight.prepared.rows)
            done.extend(results)
            generated.append(results)
        if done:
            self._record(rows, done, time.perf_counter() - started)
        return generated

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
                outcome.request,
                result,
                input_tokens,
                outcome.templates,
                outcome.markups,
                request_id,
            )
            replies.append(Reply(200, body, outcome.request.stream))
        return replies


def _futures(flights: Sequence[_InFlight | ServiceError]) -> list[Future[GenerationResult]]:
    return [f for flight in flights if isinstance(flight, _InFlight) for f in flight.futures]


def _at_once(call: Callable[[], None]) -> None:
    call()
