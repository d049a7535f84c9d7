"""What a batch generated for each request, and which of it the language check judges.

The check (:mod:`hymt_serve.request.language_retry`) judges every row that is a translation:
each text or document segment of the request API, and each choice of a chat form request that
carries our translation fields (``target_lang``, ...: the server built the model card's prompt
around the last user message, so the choice is that message translated). A chat form request
without them is never judged: its target language is unknown. A streamed row is judged and
never retried (its deltas are already sent). A chat choice is judged as the client gets it,
after its stop strings; so is its retry.

:func:`judge` picks the requests and builds their retry round; :func:`place` puts the round's
outcome back among the batch's other requests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationResult, GenerationRow
from hymt_serve.request.chat import ChatRequest
from hymt_serve.request.chat_options import apply_stop
from hymt_serve.request.errors import ServiceError
from hymt_serve.request.language_retry import Checked, Job, RetryRound, TargetLanguage
from hymt_serve.request.tokenising import Prepared


@dataclass(frozen=True)
class Translated:
    """A request's results in row order, and what the language check found for each row
    (None: the check is off)."""

    results: list[GenerationResult]
    target_language: tuple[TargetLanguage, ...] | None = None


@dataclass(frozen=True)
class Chosen:
    """A chat form request's choices, in order, their stop strings applied; for a translation,
    what the language check found for each (None: not judged)."""

    results: list[GenerationResult]
    target_language: tuple[TargetLanguage, ...] | None = None


Generated = Translated | Chosen | ServiceError
Outcome = Prepared | ServiceError
Decode = Callable[[Sequence[int]], str]


class Check(NamedTuple):
    """The judged requests' places in the batch and their retry round."""

    numbers: list[int]
    round: RetryRound


def judge(
    outcomes: Sequence[Outcome],
    generated: Sequence[Generated],
    settings: Settings,
    submit: Callable[[GenerationRow], Future[GenerationResult]],
    decode: Decode,
) -> Check | None:
    """Judge every translated row of the batch and plan the retries (``submit`` queues a row on
    the engine, ``decode`` is the engine's); None when ``target_language_check`` is off."""
    checks = settings.checks
    if checks.target_language_check == "off":
        return None
    numbers, jobs = [], []
    for number, (outcome, result) in enumerate(zip(outcomes, generated, strict=True)):
        if isinstance(result, ServiceError):
            continue
        assert isinstance(outcome, Prepared)
        job = _job(outcome, result.results, settings, decode)
        if job is not None:
            numbers.append(number)
            jobs.append(job)
    window = settings.scheduler.document_window_rows
    return Check(numbers, RetryRound(jobs, checks.target_language_confidence, submit, window))


def _job(
    outcome: Prepared, results: Sequence[GenerationResult], settings: Settings, decode: Decode
) -> Job | None:
    """One request's rows as the check sees them; None for a chat that does not translate."""
    request = outcome.request
    retry = settings.checks.target_language_check == "retry"
    if isinstance(request, ChatRequest):
        if request.translation is None:
            return None
        sampling = (request.sampling or settings.sampling) if retry and not request.stream else None
        sources = request.translation.texts * len(outcome.rows)  # every choice: the one text
        finish = functools.partial(apply_stop, stop=request.stop, decode=decode)
        return Job(outcome.rows, sources, results, request.translation.target, sampling, finish)
    streamed = request.stream and outcome.document is None
    sampling = (request.sampling or settings.sampling) if retry and not streamed else None
    sources = outcome.document.segments if outcome.document else request.texts
    return Job(outcome.rows, sources, results, request.target, sampling)


def place(
    generated: Sequence[Generated], numbers: Sequence[int], checked: Sequence[Checked]
) -> list[Generated]:
    """``generated`` with each judged request's checked results (retries in place) and
    outcomes; the others as they were."""
    found = dict(zip(numbers, checked, strict=True))
    placed: list[Generated] = []
    for number, item in enumerate(generated):
        if number not in found:
            placed.append(item)
            continue
        kind = Translated if isinstance(item, Translated) else Chosen
        placed.append(kind(found[number].results, found[number].target_language))
    return placed
