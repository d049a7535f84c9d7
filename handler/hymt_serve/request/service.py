"""The translation service: requests in, one reply per request out.

Between the door and the engine, without torch (tested with a fake engine). Every valid
request's rows are submitted (``submit(row, on_tokens) -> future``); batch mode then runs the
engine until the futures are done, async mode awaits them. A bad request becomes its own 4xx, a
failure while generating the 5xx of the requests whose rows it hit; one reply per request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationResult, GenerationRow, OnTokens
from hymt_serve.request.chat import ChatRequest, ChoiceStream, parse_body, render_choices
from hymt_serve.request.chat_options import apply_stop
from hymt_serve.request.checking import Check, Chosen, Generated, Translated, judge, place
from hymt_serve.request.checking import Outcome as Outcome  # the handler's too
from hymt_serve.request.errors import ServiceError, as_service_error
from hymt_serve.request.families import detect_profile
from hymt_serve.request.in_flight import InFlight
from hymt_serve.request.memory import TranslationMemory
from hymt_serve.request.memory_key import take_choice
from hymt_serve.request.memory_rows import Memorised, Recall, Served, with_usage
from hymt_serve.request.metrics import NullRecorder, Recorder
from hymt_serve.request.protocol import TranslationRequest
from hymt_serve.request.replies import render_response
from hymt_serve.request.streaming import DeltaStream
from hymt_serve.request.tokenising import Prepared, Tokeniser

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """What the service needs from the engine (in this process or in its own)."""

    def encode_prompt(self, user_turn: str) -> list[int]:
        """Token ids of ``user_turn`` rendered as one user turn by the chat template."""
        ...

    def encode_chat(self, turns: Sequence[ChatTurn]) -> list[int]:
        """Token ids of a conversation rendered by the chat template (texts as text)."""
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

    def run(self, futures: Sequence[Future[Any]]) -> None:
        """Return once every future is done (stepping the engine on this thread if needed;
        the futures may be others than the engine's, resolved by its futures' callbacks)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the loaded model and the choices made at load."""
        ...


# (request index in the batch, event): {"delta": text} for a streamed text (with "index", the
# choice, for the chat form), {"progress": {"done": n, "total": m}} for a document.
StreamSink = Callable[[int, dict[str, Any]], None]
# How a token callback reaches the sink's thread: called at once (batch mode) or handed to
# the event loop (async mode).
Hop = Callable[[Callable[[], None]], None]


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    stream: bool = False


class TranslationService:
    """Parses, tokenises, generates and renders; never raises for a single bad request."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        recorder: Recorder | None = None,
        memory: TranslationMemory | None = None,
    ):
        self.engine = engine
        self.settings = settings
        self.recorder: Recorder = recorder or NullRecorder()
        # The model family: its prompt templates and the request fields it supports.
        self.profile = detect_profile(settings.model_path, settings.loading.prompt_family)
        # The translation memory (memory None: off): rows served without the engine.
        self.memory = Memorised(memory, self.profile.name, settings)

    def parse(self, body: Any) -> TranslationRequest | ChatRequest:
        """One request API body (either form) validated against the settings and the model
        family, its translation memory fields taken out first (``"cache"``, the front end's
        ``"cache_namespace"``). Raises InvalidRequest (400) or PayloadTooLarge (413).
        """
        body, choice = take_choice(body)
        request = parse_body(body, self.settings, self.profile)
        self.memory.note(request, choice)
        return request

    def prepare(
        self, requests: Sequence[TranslationRequest | ChatRequest | ServiceError]
    ) -> list[Outcome]:
        """Tokenise each request's prompts; a failure stays in its own slot (a ServiceError
        given as a request, one refused at the door, is that request's outcome)."""
        self.recorder.requests(len(requests))
        tokeniser = Tokeniser(self.engine, self.settings, self.profile)
        return [tokeniser.prepare_one(request) for request in requests]

    def generate(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None = None
    ) -> list[Generated]:
        """TorchServe's batch mode: every valid request's rows go to the engine together, and
        the engine runs on this thread until they are done; streaming requests (when a
        ``sink`` is given) send their text deltas or their progress as they come. Rows found
        in the translation memory are served from it, the rows generated are kept there."""
        recall = self.memory.recall(outcomes)
        generated = self._generate(outcomes, sink, recall)
        self._remember(outcomes, generated, recall)
        return generated

    def _generate(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None, recall: Recall
    ) -> list[Generated]:
        started = time.perf_counter()
        flights = self._submit_all(outcomes, sink, _at_once, recall)
        live = [flight for flight in flights if isinstance(flight, InFlight)]
        try:
            self.engine.run([flight.done for flight in live])
        except Exception as error:  # the engine failed as a whole: every request of the batch
            failure = as_service_error(error, rows=sum(len(f.futures) for f in live))
            return [failure if isinstance(f, InFlight) else f for f in flights]
        generated = self._collect(flights, started)
        check = self._judge(outcomes, generated)
        if check is None:
            return generated
        started = time.perf_counter()
        check.round.start()
        try:
            if check.round.retrying:
                self.engine.run([check.round.done])
        except Exception as error:  # the retry round failed as a whole: first outputs stand
            logger.warning("the language retry round failed: %s", type(error).__name__)
        return self._checked(check, generated, started)

    async def generate_async(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None = None
    ) -> list[Generated]:
        """TorchServe's async mode: like :meth:`generate`, but awaited: the engine steps on
        its own and batches these rows with those of every other request in flight; stream
        events reach ``sink`` on the event loop. The memory's lookup runs off the loop."""
        recall = Recall()
        if self.memory.on and any(isinstance(o, Prepared) for o in outcomes):
            recall = await asyncio.to_thread(self.memory.recall, outcomes)
        generated = await self._generate_async(outcomes, sink, recall)
        self._remember(outcomes, generated, recall)
        return generated

    async def _generate_async(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None, recall: Recall
    ) -> list[Generated]:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()

        def hop(call: Callable[[], None]) -> None:
            loop.call_soon_threadsafe(call)

        flights = self._submit_all(outcomes, sink, hop, recall)
        dones = [flight.done for flight in flights if isinstance(flight, InFlight)]
        if dones:
            await asyncio.wait([asyncio.wrap_future(done, loop=loop) for done in dones])
        generated = self._collect(flights, started)
        heavy = any(isinstance(o, Prepared) and o.document is not None for o in outcomes)
        if heavy:  # a document's segments are judged off the event loop
            check = await asyncio.to_thread(self._judge, outcomes, generated)
        else:
            check = self._judge(outcomes, generated)
        if check is None:
            return generated
        started = time.perf_counter()
        check.round.start()
        if check.round.retrying:
            await asyncio.wrap_future(check.round.done, loop=loop)
        return self._checked(check, generated, started)

    def _submit_all(
        self, outcomes: Sequence[Outcome], sink: StreamSink | None, hop: Hop, recall: Recall
    ) -> list[InFlight | ServiceError]:
        valid = [o for o in outcomes if isinstance(o, Prepared)]
        if valid:
            served = recall.count()
            rows = sum(len(o.rows) for o in valid) - served
            self.recorder.batch(requests=len(valid), rows=rows)
        return [self._submit(i, o, sink, hop, recall.served(i)) for i, o in enumerate(outcomes)]

    def _submit(
        self,
        index: int,
        outcome: Outcome,
        sink: StreamSink | None,
        hop: Hop,
        served: Served,
    ) -> InFlight | ServiceError:
        """Start feeding a valid request's rows to the engine; a refusal (e.g. Overloaded)
        fails the request and withdraws its rows already submitted."""
        if isinstance(outcome, ServiceError):
            return outcome
        send = sink if sink is not None and outcome.request.stream else None
        listeners: dict[int, OnTokens] = {}  # by id(row): a streamed row's token listener
        progress: Callable[[int, int], None] | None = None
        if send is not None and outcome.document is not None:
            progress = lambda done, total: hop(  # noqa: E731
                lambda: send(index, {"progress": {"done": done, "total": total}})
            )
        flight = InFlight(
            outcome,
            lambda row: self.engine.submit(row, listeners.get(id(row))),
            self.settings.scheduler.document_window_rows,
            progress,
            served,
        )
        if send is not None and outcome.document is None:
            flight.streams = self._streams(outcome.request, functools.partial(send, index))
            for row, stream in zip(outcome.rows, flight.streams, strict=True):
                listeners[id(row)] = functools.partial(_push_on, hop, stream)
        flight.start()
        if flight.refusal is not None and not any(flight.futures):
            return flight.refusal
        return flight

    def _streams(
        self, request: TranslationRequest | ChatRequest, send: Callable[[dict[str, Any]], None]
    ) -> list[DeltaStream | ChoiceStream]:
        """A streamed text's deltas, or each choice's (with its index) for the chat form."""
        decode = self.engine.decode
        if not isinstance(request, ChatRequest):
            return [DeltaStream(decode, lambda delta: send({"delta": delta}))]
        return [
            ChoiceStream(decode, functools.partial(_choice_delta, send, choice), request.stop)
            for choice in range(request.n)
        ]

    def _collect(
        self, flights: Sequence[InFlight | ServiceError], started: float
    ) -> list[Generated]:
        """Each request's results, or the first failure among its rows."""
        generated: list[Generated] = []
        rows: list[GenerationRow] = []
        done: list[GenerationResult] = []
        for flight in flights:
            if isinstance(flight, ServiceError):
                generated.append(flight)
                continue
            failure = flight.failure()
            if failure is not None:
                generated.append(as_service_error(failure, rows=len(flight.futures)))
                continue
            results = flight.results()
            for stream, result in zip(flight.streams, results, strict=False):
                stream.finish(result.text)
            rows.extend(flight.rows)  # the engine's work: the rows not served from memory
            done.extend(flight.made())
            request = flight.prepared.request
            if isinstance(request, ChatRequest):  # the text the client gets: before its stop
                stopped = [apply_stop(r, request.stop, self.engine.decode) for r in results]
                generated.append(Chosen(stopped))
            else:
                generated.append(Translated(results))
        if done:
            self._record(rows, done, time.perf_counter() - started)
        return generated

    def _remember(
        self, outcomes: Sequence[Outcome], generated: Sequence[Generated], recall: Recall
    ) -> None:
        """Keep the batch's new translations; its memory counts to the metrics."""
        self.memory.keep(outcomes, generated, recall)
        hits, misses, evictions = self.memory.counts()
        if hits or misses or evictions:
            self.recorder.memory(hits=hits, misses=misses, evictions=evictions)

    def _judge(self, outcomes: Sequence[Outcome], generated: Sequence[Generated]) -> Check | None:
        """Each translated row's language against its target, and the rows to generate once
        more (:mod:`.checking`); None when the check is off."""
        submit = lambda row: self.engine.submit(row)  # noqa: E731
        return judge(outcomes, generated, self.settings, submit, self.engine.decode)

    def _checked(
        self, check: Check, generated: Sequence[Generated], started: float
    ) -> list[Generated]:
        """``generated`` with the retry round's outputs in place and each row's outcome; the
        round's engine work and the outcomes go to the metrics."""
        retries = check.round.retries()
        if retries:
            rows, results = zip(*retries, strict=True)
            self._record(rows, results, time.perf_counter() - started)
        checked, tally = check.round.outcome()
        for (target, result), count in sorted(tally.items()):
            self.recorder.target_language(target, result, count)
        return place(generated, check.numbers, checked)

    def _record(
        self, rows: Sequence[GenerationRow], results: Sequence[GenerationResult], seconds: float
    ) -> None:
        n_in = sum(len(row.prompt_ids) for row in rows)
        n_out = sum(result.output_tokens for result in results)
        self.recorder.generation(seconds=seconds, input_tokens=n_in, output_tokens=n_out)
        # DEBUG: a line per request costs the worker as much as its metrics (the metrics
        # carry the same counts).
        logger.debug(
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
            if isinstance(outcome.request, ChatRequest):
                assert isinstance(result, Chosen)
                body = render_choices(
                    outcome.request,
                    result.results,
                    len(outcome.rows[0].prompt_ids),
                    outcome.templates[0],
                    outcome.markups[0],
                    request_id,
                    result.target_language,
                )
                body = with_usage(body, self.memory.served(outcome))
                replies.append(Reply(200, body, outcome.request.stream))
                continue
            assert isinstance(result, Translated)
            input_tokens = [len(row.prompt_ids) for row in outcome.rows]
            body = render_response(
                outcome.request,
                result.results,
                input_tokens,
                outcome.templates,
                outcome.markups,
                request_id,
                outcome.document,
                result.target_language,
            )
            body = with_usage(body, self.memory.served(outcome))
            replies.append(Reply(200, body, outcome.request.stream))
        return replies


def _push_on(hop: Hop, stream: DeltaStream | ChoiceStream, ids: list[int]) -> None:
    """A streamed row's new token ids, handed to its stream on the sink's thread."""
    hop(lambda: stream.push(ids))


def _choice_delta(send: Callable[[dict[str, Any]], None], choice: int, delta: str) -> None:
    send({"delta": delta, "index": choice})


def _at_once(call: Callable[[], None]) -> None:
    call()
