"""Feeding one request's rows to the engine a window at a time, its progress, its failure."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from hymt_serve.core.types import GenerationResult, GenerationRow
from hymt_serve.request.errors import ServiceError, as_service_error


class RowFeed:
    """A request's rows in the engine, at most ``window`` at a time: each row that finishes
    lets the next one in (a document's hundreds of segments never fill the waiting line).
    ``done`` resolves once every row has finished, or once a failure has stopped the feeding
    and the rows already in have finished; a refusal withdraws the rows still waiting."""

    def __init__(
        self,
        rows: Sequence[GenerationRow],
        submit: Callable[[GenerationRow], Future[GenerationResult]],
        window: int,
        progress: Callable[[int, int], None] | None = None,
    ):
        self.rows = rows
        self.futures: list[Future[GenerationResult] | None] = [None] * len(rows)
        self.done: Future[None] = Future()
        self.refusal: ServiceError | None = None
        self._submit_row = submit
        self._window = window
        self._progress = progress
        self._lock = threading.Lock()
        self._next = 0  # rows taken for submission
        self._outstanding = 0  # taken and not yet finished
        self._finished = 0
        self._reported = -1  # the last progress percentage sent
        self._stopped = False

    def start(self) -> None:
        if not self.futures:
            self.done.set_result(None)
            return
        for _ in range(min(self._window, len(self.futures))):
            if not self._feed():
                break

    def _feed(self) -> bool:
        with self._lock:
            if self._stopped or self._next >= len(self.futures):
                return False
            index, self._next, self._outstanding = self._next, self._next + 1, self._outstanding + 1
        try:
            future = self._submit_row(self.rows[index])
        except Exception as error:  # e.g. QueueFull: the request fails, its rows withdrawn
            self.refusal = as_service_error(error)
            self._stop()
            self._release()
            return False
        self.futures[index] = future
        future.add_done_callback(self._finished_one)
        return True

    def _finished_one(self, future: Future[GenerationResult]) -> None:
        if future.cancelled() or future.exception() is not None:
            self._stop()
        else:
            self._feed()
            self._report()
        self._release()

    def _stop(self) -> None:
        with self._lock:
            self._stopped = True
        for future in self.futures:
            if future is not None:
                future.cancel()

    def _report(self) -> None:
        if self._progress is None:
            return
        with self._lock:
            self._finished += 1
            done, total = self._finished, len(self.futures)
            percent = done * 100 // total
            if percent == self._reported and done < total:
                return
            self._reported = percent
        self._progress(done, total)

    def _release(self) -> None:
        with self._lock:
            self._outstanding -= 1
            over = self._outstanding == 0 and (self._stopped or self._next >= len(self.futures))
            if over and not self.done.done():
                self.done.set_result(None)

    def failure(self) -> BaseException | None:
        """Why the request failed: a refusal, or the first failure among its rows."""
        if self.refusal is not None:
            return self.refusal
        for future in self.futures:
            if future is not None and not future.cancelled() and future.exception() is not None:
                return future.exception()
        return None
