"""A batch's language check and its one retry round (the ``target_language_check`` setting).

After a batch's rows are generated, each output is judged against its target
(:func:`hymt_serve.request.target_check.verdict`). A row judged wrong is generated once more,
sampled, with the same prompt, limit and stop strings (a seeded row with a seed derived from
its own: the same seed would draw the same text); every such row of the batch goes to the
engine in one round, fed a window at a time (:class:`~hymt_serve.request.feeding.RowFeed`).
The round is never followed by another: a retry judged wrong again, refused or failed leaves
the first output in place. What each row ends with:

- ``ok``: not judged wrong (its language matched, or the check could not tell: short, mixed or
  copied text);
- ``retried``: judged wrong, and its retry was not: the retry's output replaces it;
- ``mismatch``: judged wrong, and not retried (a stream, whose text is already sent; the
  ``report`` setting) or retried in vain: the first output stays.

The metric counts the same per target language, with ``unsure`` apart from ``ok``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Literal, NamedTuple

from hymt_serve.core.types import GenerationResult, GenerationRow, SamplingParams
from hymt_serve.request.feeding import RowFeed
from hymt_serve.request.languages import Language
from hymt_serve.request.target_check import Verdict, verdict

TargetLanguage = Literal["ok", "retried", "mismatch"]
_WORST: tuple[TargetLanguage, ...] = ("mismatch", "retried", "ok")
# A seeded row's retry samples with its seed plus this (odd: distinct seeds mod 2**64).
RETRY_SEED_STEP = 0x2545F4914F6CDD1D
_INT64 = 2**63


class Job(NamedTuple):
    """One request's generated rows as the check sees them."""

    rows: Sequence[GenerationRow]
    sources: Sequence[str]  # each row's source text
    results: Sequence[GenerationResult]
    target: Language
    retry: SamplingParams | None  # how a wrong row is generated again; None: it is not
    # What the request makes of a generated row before it is judged (a chat form request's
    # stop strings); its first results come with it already.
    finish: Callable[[GenerationResult], GenerationResult] | None = None


class Checked(NamedTuple):
    """One request's results after the check (retries in place) and each row's outcome."""

    results: list[GenerationResult]
    target_language: tuple[TargetLanguage, ...]


class RetryRound:
    """Judges every row of ``jobs`` at construction (pure; a document's thousands of segments
    may be judged off the event loop); :meth:`start` submits the rows to retry, ``done``
    resolves once they have finished (at once when there are none), :meth:`outcome` reads
    them. Nothing here raises for a retry that fails: its row keeps its first output."""

    def __init__(
        self,
        jobs: Sequence[Job],
        confidence: float,
        submit: Callable[[GenerationRow], Future[GenerationResult]],
        window: int,
    ) -> None:
        self.jobs = jobs
        self.confidence = confidence
        self.verdicts: list[list[Verdict]] = [
            [self._judge(job, index, result.text) for index, result in enumerate(job.results)]
            for job in jobs
        ]
        self.wanted = [
            (number, index)
            for number, (job, verdicts) in enumerate(zip(jobs, self.verdicts, strict=True))
            for index, found in enumerate(verdicts)
            if found == "wrong" and job.retry is not None
        ]
        rows = [self._retry_row(jobs[number], index) for number, index in self.wanted]
        self.feed = RowFeed(rows, submit, window)

    @property
    def retrying(self) -> bool:
        return bool(self.wanted)

    @property
    def done(self) -> Future[None]:
        return self.feed.done

    def start(self) -> None:
        self.feed.start()

    def _judge(self, job: Job, index: int, text: str) -> Verdict:
        return verdict(text, job.sources[index], job.target, confidence=self.confidence)

    @staticmethod
    def _retry_row(job: Job, index: int) -> GenerationRow:
        row, sampling = job.rows[index], job.retry
        own = row.sampling.seed if row.sampling is not None else None
        if sampling is not None and own is not None:
            seed = (own + RETRY_SEED_STEP + _INT64) % 2**64 - _INT64
            sampling = replace(sampling, seed=seed)
        return replace(row, sampling=sampling)

    def retries(self) -> list[tuple[GenerationRow, GenerationResult]]:
        """The retry rows that were generated, with their results (the round's engine work)."""
        return [
            (row, future.result())
            for row, future in zip(self.feed.rows, self.feed.futures, strict=True)
            if future is not None and _succeeded(future)
        ]

    def outcome(self) -> tuple[list[Checked], Counter[tuple[str, str]]]:
        """Each job's results and outcomes, and the count of each (target, result) for the
        metric (result: ok, unsure, retried or mismatch)."""
        results = [list(job.results) for job in self.jobs]
        outcomes = [[_first(found) for found in verdicts] for verdicts in self.verdicts]
        for (number, index), future in zip(self.wanted, self.feed.futures, strict=True):
            if future is None or not _succeeded(future):
                continue
            retried = future.result()
            finish = self.jobs[number].finish
            retried = finish(retried) if finish is not None else retried
            if self._judge(self.jobs[number], index, retried.text) != "wrong":
                results[number][index] = retried
                outcomes[number][index] = "retried"
        tally: Counter[tuple[str, str]] = Counter()
        for job, verdicts, ends in zip(self.jobs, self.verdicts, outcomes, strict=True):
            for found, end in zip(verdicts, ends, strict=True):
                tally[job.target.code, "unsure" if found == "unsure" else end] += 1
        checked = [Checked(r, tuple(o)) for r, o in zip(results, outcomes, strict=True)]
        return checked, tally


def worst(outcomes: Sequence[TargetLanguage]) -> TargetLanguage:
    """A request's outcome from its rows': mismatch if any row has it, else retried if any
    row has it, else ok."""
    return next(outcome for outcome in _WORST if outcome in outcomes or outcome == "ok")


def counts(outcomes: Sequence[TargetLanguage]) -> dict[str, int]:
    """How many rows ended with each outcome (all three named)."""
    return {outcome: outcomes.count(outcome) for outcome in ("ok", "retried", "mismatch")}


def _first(found: Verdict) -> TargetLanguage:
    """A row's outcome before any retry: a wrong one is a mismatch until a retry says else."""
    return "mismatch" if found == "wrong" else "ok"


def _succeeded(future: Future[GenerationResult]) -> bool:
    """Finished with a result (a refused row has no future; a failed round leaves some
    unfinished)."""
    return future.done() and not future.cancelled() and future.exception() is None
