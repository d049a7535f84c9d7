"""The translation memory between the service and the engine (docs/translation-memory.md).

:class:`Memorised` is what :class:`~hymt_serve.request.service.TranslationService` asks: each
request's say about the memory (``"cache"``, its namespace) noted at parsing; before a batch's
rows are submitted, their keys looked up in one query (:meth:`Memorised.recall`: a hit is the
row's result, and the row never reaches the engine); after the batch, the rows generated kept
(:meth:`Memorised.keep`); for each reply, how many rows and characters came from the memory
(``usage.memory_segments``, ``usage.memory_characters``: the front end refunds those characters).

What is kept: a row that was generated (not a hit) for a request that succeeded, as the client
got it (a language retry's output in place). A row the language check still judges wrong is
kept only under ``report`` (a new generation would give the same); under ``retry`` it is not,
so that the next request tries again.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar, cast

from hymt_serve.core.settings import Settings, without_password
from hymt_serve.core.types import FinishReason, GenerationResult
from hymt_serve.request.chat import ChatRequest
from hymt_serve.request.checking import Chosen, Generated, Outcome, Translated
from hymt_serve.request.errors import ServiceError
from hymt_serve.request.memory import Entry, Found, TranslationMemory, resolve_url
from hymt_serve.request.memory_key import (
    Choice,
    check_choice,
    is_plain,
    marker_key,
    model_identity,
    plain_key,
    row_key,
    uses_memory,
)
from hymt_serve.request.protocol import TranslationRequest
from hymt_serve.request.tokenising import Prepared

logger = logging.getLogger(__name__)
T = TypeVar("T")


class _ByObject(Generic[T]):
    """Values noted against objects that cannot carry them (frozen requests), forgotten when
    the object is collected."""

    def __init__(self) -> None:
        self._values: dict[int, T] = {}

    def put(self, owner: object, value: T) -> None:
        if id(owner) not in self._values:
            weakref.finalize(owner, self._values.pop, id(owner), None)
        self._values[id(owner)] = value

    def get(self, owner: object, default: T) -> T:
        return self._values.get(id(owner), default)


class Served(NamedTuple):
    """A request's rows that need no engine: results found in the memory, and twins (rows
    whose key an earlier row of the request has: they take its result), by row index."""

    hits: dict[int, GenerationResult]
    twins: dict[int, int]

    def covers(self, index: int) -> bool:
        return index in self.hits or index in self.twins


@dataclass
class Recall:
    """A batch's lookups: per request (in batch order), each looked-up row's key, the rows
    found, and the twins, by row index."""

    keys: list[dict[int, str]] = field(default_factory=list)
    hits: list[dict[int, Found]] = field(default_factory=list)
    twins: list[dict[int, int]] = field(default_factory=list)

    def served(self, number: int) -> Served:
        """Request ``number``'s rows served without the engine."""
        if number >= len(self.hits):
            return Served({}, {})
        hits = {
            index: GenerationResult(
                found.text, found.token_ids, cast(FinishReason, found.finish_reason)
            )
            for index, found in self.hits[number].items()
        }
        return Served(hits, self.twins[number])

    def count(self) -> int:
        """The batch's rows served without the engine."""
        return sum(
            len(hits) + len(twins) for hits, twins in zip(self.hits, self.twins, strict=True)
        )


class Memorised:
    """The memory of one model's service: ``memory`` (None: off, every call a no-op), the
    model's prompt family ``family`` and the ``settings``."""

    def __init__(self, memory: TranslationMemory | None, family: str, settings: Settings):
        self.memory, self.family, self.settings = memory, family, settings
        self.isolated = settings.memory.memory_isolation
        self._choices: _ByObject[Choice] = _ByObject()
        self._served: _ByObject[tuple[int, int]] = _ByObject()
        self._reported = (0, 0, 0)  # hits, misses, evictions already in the metrics

    @property
    def on(self) -> bool:
        return self.memory is not None

    def note(self, request: TranslationRequest | ChatRequest, choice: Choice) -> None:
        """``request``'s say about the memory (InvalidRequest for ``"cache": true`` on a
        sampled request without a seed)."""
        sampling = request.sampling
        check_choice(
            choice, sampling is not None, sampling is not None and sampling.seed is not None
        )
        if choice != Choice():
            self._choices.put(request, choice)

    def recall(self, outcomes: Sequence[Outcome]) -> Recall:
        """Every row of ``outcomes`` that uses the memory, looked up in one query."""
        recall = Recall()
        if self.memory is None:
            return recall
        try:
            for outcome in outcomes:
                recall.keys.append(self._keys(outcome) if isinstance(outcome, Prepared) else {})
            found = self.memory.recall(key for keys in recall.keys for key in keys.values())
        except Exception as error:  # never fail a translation because of its memory
            logger.warning("translation memory skipped: %s", type(error).__name__)
            return Recall()
        recall.hits = [
            {index: found[key] for index, key in keys.items() if key in found}
            for keys in recall.keys
        ]
        recall.twins = [_twins(keys, found) for keys in recall.keys]
        served = recall.count()  # rows, a key found for two rows counting twice
        self.memory.tally(hits=served, misses=sum(map(len, recall.keys)) - served)
        return recall

    def _keys(self, outcome: Prepared) -> dict[int, str]:
        assert self.memory is not None
        choice = self._choices.get(outcome.request, Choice())
        namespace = self._namespace(choice)
        if namespace is None:
            return {}
        return {
            index: row_key(self.memory.model, namespace, row)
            for index, row in enumerate(outcome.rows)
            if uses_memory(row, choice)
        }

    def keep(
        self, outcomes: Sequence[Outcome], generated: Sequence[Generated], recall: Recall
    ) -> None:
        """Queue the rows generated for the batch's successful requests (the module's rule),
        and note each reply's rows and characters served from memory."""
        if self.memory is None or not recall.keys:
            return
        try:
            self.memory.keep(self._kept(outcomes, generated, recall))
        except Exception as error:  # never fail a translation because of its memory
            logger.warning("translation memory not written: %s", type(error).__name__)

    def _kept(
        self, outcomes: Sequence[Outcome], generated: Sequence[Generated], recall: Recall
    ) -> list[Entry]:
        entries: list[Entry] = []
        for number, (outcome, result) in enumerate(zip(outcomes, generated, strict=True)):
            if not isinstance(outcome, Prepared) or isinstance(result, ServiceError):
                continue
            served = [*recall.hits[number], *recall.twins[number]]
            if served:
                self._served.put(outcome, (len(served), _characters(outcome, served)))
            entries += self._entries(outcome, result, recall.keys[number], served)
        return entries

    def _entries(
        self,
        outcome: Prepared,
        result: Translated | Chosen,
        keys: dict[int, str],
        served: Sequence[int],
    ) -> list[Entry]:
        assert self.memory is not None
        request = outcome.request
        namespace = self._namespace(self._choices.get(request, Choice())) or ""
        plain = isinstance(request, TranslationRequest) and is_plain(request)
        verdicts = result.target_language
        entries = []
        for index, key in keys.items():
            verdict = verdicts[index] if verdicts is not None else None
            if index in served or not self._keepable(verdict):
                continue
            generated, row = result.results[index], outcome.rows[index]
            entries.append(
                Entry(
                    key,
                    plain_key(self.memory.model, namespace, self.family, request, index)
                    if plain and isinstance(request, TranslationRequest)
                    else None,
                    namespace,
                    generated.text,
                    generated.token_ids,
                    generated.finish_reason,
                    len(row.prompt_ids),
                    outcome.templates[index],
                    None if verdict is None else "mismatch" if verdict == "mismatch" else "ok",
                )
            )
        return entries

    def _namespace(self, choice: Choice) -> str | None:
        """The namespace of a request's rows: "" (one memory) unless isolated per key; then
        the one it names, None (no memory) when it names none."""
        return choice.namespace if self.isolated else ""

    def _keepable(self, verdict: str | None) -> bool:
        """A row judged wrong in the end is kept only when the check only reports."""
        return verdict != "mismatch" or self.settings.checks.target_language_check == "report"

    def served(self, outcome: Outcome) -> tuple[int, int]:
        """(rows, characters) of ``outcome``'s reply served from memory."""
        return self._served.get(outcome, (0, 0))

    def counts(self) -> tuple[int, int, int]:
        """(hits, misses, evictions) since the last call, for the metrics."""
        if self.memory is None:
            return 0, 0, 0
        now = (self.memory.hits, self.memory.misses, self.memory.evictions)
        delta = tuple(a - b for a, b in zip(now, self._reported, strict=True))
        self._reported = now
        return delta[0], delta[1], delta[2]

    def describe(self) -> dict[str, Any]:
        """The memory's facts for the describe output (the front end reads them)."""
        if self.memory is None:
            return {"enabled": False}
        return {
            "enabled": True,
            "model": self.memory.model,
            "database": without_password(self.memory.url),
            "isolation": self.isolated,
            "max_rows": self.memory.max_rows,
        }


def with_usage(body: dict[str, Any], served: tuple[int, int]) -> dict[str, Any]:
    """A reply ``body`` whose usage says what came from memory (when anything did)."""
    rows, characters = served
    usage = body.get("usage")
    if rows and isinstance(usage, dict):
        usage.update(memory_segments=rows, memory_characters=characters)
    return body


def _twins(keys: dict[int, str], found: dict[str, Found]) -> dict[int, int]:
    """The rows whose key an earlier row has and the memory has not: row -> that first row."""
    first: dict[str, int] = {}
    twins = {}
    for index, key in keys.items():
        if key in found:
            continue
        if key in first:
            twins[index] = first[key]
        else:
            first[key] = index
    return twins


def _characters(outcome: Prepared, served: Sequence[int]) -> int:
    """The characters billed for the rows served from memory: each text's or segment's own;
    for a chat form request its messages' (as the front end counts them), when every choice
    came from memory (one generated choice costs the whole prompt)."""
    request = outcome.request
    if isinstance(request, ChatRequest):
        whole = len(served) == len(outcome.rows)
        return sum(len(turn.content) for turn in request.turns) if whole else 0
    sources = outcome.document.segments if outcome.document is not None else request.texts
    return sum(len(sources[index]) for index in served)


def open_memory(
    settings: Settings, model_name: str, precision: dict[str, Any]
) -> TranslationMemory | None:
    """The memory the settings ask for, announced as ``model_name``'s current model; None when
    off, when no database is found, or when it cannot be opened (logged: the worker serves
    without it)."""
    config = settings.memory
    url = resolve_url(config.memory_database_url) if config.translation_memory else None
    if url is None:
        logger.info(
            "translation memory off (%s)",
            "setting" if not config.translation_memory else "no database",
        )
        return None
    try:
        identity = model_identity(settings.model_path, precision)
        memory = TranslationMemory.open(url, identity, config.memory_max_rows)
        memory.announce(model_name, marker_key(model_name))
    except Exception as error:  # any failure: serve without the memory, and say why
        logger.warning("translation memory unavailable: %s", type(error).__name__)
        return None
    logger.info("translation memory on (model %s)", identity)
    return memory


def precision_of(settings: Settings, described: dict[str, Any]) -> dict[str, Any]:
    """What of the precision decides outputs beside the files: the quantization asked for and
    the engine's own account of its dtype and quantization."""
    return {
        "quantization": settings.loading.quantization.value,
        "quantize_lm_head": settings.loading.quantize_lm_head,
        "dtype": described.get("dtype"),
        "engine_quantization": described.get("quantization"),
        "weights_format": described.get("weights_format"),
    }
