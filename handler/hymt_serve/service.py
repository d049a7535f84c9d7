"""The translation service: request bodies in, one reply per request out.

It holds the request-level logic between TorchServe and an :class:`Engine` and imports no torch,
so it is tested with a fake engine in milliseconds. It is the one error boundary: a bad request
becomes its own 4xx reply, an engine failure becomes a 5xx reply for the requests of that batch,
and the number of replies always equals the number of requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .batching import chunks, merge, split
from .errors import GenerationFailed, PayloadTooLarge, ServiceError
from .generation import GenerationResult, GenerationRow
from .metrics import NullRecorder, Recorder
from .prompts import Template, build_prompt
from .protocol import TranslationRequest, parse_request, render_response
from .settings import Settings

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """What the service needs from a model engine."""

    def encode_prompt(self, user_turn: str) -> list[int]:
        """Token ids of ``user_turn`` rendered as one user turn by the chat template."""
        ...

    def generate(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        """One result per row, in order. Raises ServiceError (e.g. OutOfMemory) or anything."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the loaded model and the choices made at load."""
        ...


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


Outcome = Prepared | ServiceError


class TranslationService:
    """Parses, tokenises, generates and renders; never raises for a single bad request."""

    def __init__(self, engine: Engine, settings: Settings, recorder: Recorder | None = None):
        self.engine = engine
        self.settings = settings
        self.recorder: Recorder = recorder or NullRecorder()

    def prepare(self, bodies: Sequence[Any]) -> list[Outcome]:
        """Validate each body and tokenise its prompts; a failure stays in its own slot."""
        self.recorder.requests(len(bodies))
        return [self._prepare_one(body) for body in bodies]

    def _prepare_one(self, body: Any) -> Outcome:
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

    def generate(self, outcomes: Sequence[Outcome]) -> list[list[GenerationResult] | ServiceError]:
        """Run every valid request's rows through the engine as one batch."""
        groups = [o.rows if isinstance(o, Prepared) else None for o in outcomes]
        rows, owners = merge(groups)
        if not rows:
            return [o for o in outcomes if isinstance(o, ServiceError)]
        self.recorder.batch(requests=sum(g is not None for g in groups), rows=len(rows))
        try:
            results = self._run_engine(rows)
        except ServiceError as error:
            failure: ServiceError = error
        except Exception as exc:  # the boundary: any engine failure fails this batch only
            logger.exception("generation failed for a batch of %d rows", len(rows))
            failure = GenerationFailed(
                f"generation failed: {type(exc).__name__}", allowed="retry the request"
            )
        else:
            per_request = split(results, owners, len(outcomes))
            return [
                o if isinstance(o, ServiceError) else per_request[i] for i, o in enumerate(outcomes)
            ]
        return [o if isinstance(o, ServiceError) else failure for o in outcomes]

    def _run_engine(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        started = time.perf_counter()
        results: list[GenerationResult] = []
        for chunk in chunks(rows, self.settings.max_batch_rows):
            results.extend(self.engine.generate(chunk))
        seconds = time.perf_counter() - started
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
        return results

    def render(
        self,
        outcomes: Sequence[Outcome],
        generated: Sequence[list[GenerationResult] | ServiceError],
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
                replies.append(Reply(result.status, result.body(request_id)))
                continue
            assert isinstance(outcome, Prepared)
            input_tokens = [len(row.prompt_ids) for row in outcome.rows]
            body = render_response(
                outcome.request, result, input_tokens, outcome.templates, request_id
            )
            replies.append(Reply(200, body))
        return replies
