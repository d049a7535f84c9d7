"""One valid request's rows in the engine, fed a window at a time (:class:`RowFeed`), with its
stream of deltas; the rows the translation memory served never go there."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from hymt_serve.core.types import GenerationResult, GenerationRow
from hymt_serve.request.chat import ChoiceStream
from hymt_serve.request.feeding import RowFeed
from hymt_serve.request.memory_rows import Served
from hymt_serve.request.streaming import DeltaStream
from hymt_serve.request.tokenising import Prepared


class InFlight(RowFeed):
    """One valid request's rows in the engine (:class:`RowFeed`), with its stream of deltas.
    The rows ``served`` by the translation memory never go there: its hits, and the twins of an
    earlier row of the request (the same key), which take that row's result."""

    def __init__(
        self,
        prepared: Prepared,
        submit: Callable[[GenerationRow], Future[GenerationResult]],
        window: int,
        progress: Callable[[int, int], None] | None = None,
        served: Served | None = None,
    ):
        self.served = served or Served({}, {})
        skipped = len(self.served.hits) + len(self.served.twins)
        if progress is not None and skipped:  # the rows served count as done from the start
            given = progress
            progress = lambda done, total: given(done + skipped, total + skipped)  # noqa: E731
        misses = [row for index, row in enumerate(prepared.rows) if not self.served.covers(index)]
        super().__init__(misses, submit, window, progress)
        self.prepared = prepared
        self.streams: list[DeltaStream | ChoiceStream] = []  # a streamed request's, per row

    def made(self) -> list[GenerationResult]:
        """The engine's results, in the order of its rows (``self.rows``)."""
        return [future.result() for future in self.futures if future is not None]

    def results(self) -> list[GenerationResult]:
        """Every row's result, in the request's order: from the engine or the memory."""
        made = iter(self.made())
        hits, twins = self.served
        results: list[GenerationResult] = []
        for index in range(len(self.prepared.rows)):
            if index in hits:
                results.append(hits[index])
            elif index in twins:
                results.append(results[twins[index]])
            else:
                results.append(next(made))
        return results
