"""Running durable jobs (:mod:`.job_store`) on the front end's event loop: which front end runs
which job, resuming after a restart, and waiting out a model server that went away.

- A job runs in one front end at a time: the one that accepted it, or the one that claimed it
  (:meth:`.job_store.JobStore.claim`) once its runner stopped beating for ``lease_s``. Every
  ``lease_s / 3`` the :class:`JobRunner` says it still runs its jobs and claims stale ones, so
  a restarted front end (or a replica beside a front end that died) resumes a job within
  ``lease_s`` of its runner's end, from where its items stopped. On SQLite (one front end
  per database) a starting front end takes every unfinished job at once.
- A call TorchServe did not answer (unreachable, busy, restarting, timed out: :func:`retryable`)
  is sent again after a back-off that doubles up to ``MAX_BACKOFF_S``; a job that makes no
  progress for ``give_up_s`` fails (and is refunded). Progress already stored is kept.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from hymt_serve.web.job_store import Job, JobStore

log = logging.getLogger(__name__)
LEASE_S = 15.0
MAX_BACKOFF_S = 30.0
GIVE_UP_S = 1800.0  # a TorchServe restart on a GPU (load, compile) takes minutes, not this
# Statuses that say "not now" rather than "never": the front end's own 502 (TorchServe out of
# reach) and 503 (busy), TorchServe's 404 while the model registers again after a restart,
# 408/504 timeouts, 500 (a worker died), 507 (memory).
RETRYABLE = (404, 408, 429, 500, 502, 503, 504, 507)

Run = Callable[[Job], Awaitable[None]]


def retryable(status: int) -> bool:
    return status in RETRYABLE


class Patience:
    """Back-off between failed calls of one job; :meth:`wait` returns False once the job made
    no progress for ``give_up_s``."""

    def __init__(self, give_up_s: float, first_s: float = 0.5) -> None:
        self._give_up_s, self._first_s = give_up_s, first_s
        self._delay = first_s
        self._waited = 0.0

    def progressed(self) -> None:
        self._delay, self._waited = self._first_s, 0.0

    async def wait(self) -> bool:
        if self._waited >= self._give_up_s:
            return False
        await asyncio.sleep(self._delay)
        self._waited += self._delay
        self._delay = min(MAX_BACKOFF_S, self._delay * 2)
        return True


class JobRunner:
    """The jobs this front end runs: one task each, started at submission or when claimed;
    every task is cancelled by :meth:`close`."""

    def __init__(self, store: JobStore, *, lease_s: float = LEASE_S) -> None:
        self.store = store
        self.id = secrets.token_hex(8)  # this front end, as the jobs' runner
        self.lease_s = lease_s
        self._runs: dict[str, Run] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def register(self, kind: str, run: Run) -> None:
        """``run(job)`` runs (or resumes) a job of ``kind`` to its end."""
        self._runs[kind] = run

    async def open(self) -> None:
        """Claim the jobs a stopped front end left (now and every ``lease_s / 3``)."""
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def close(self) -> None:
        """Cancel every job's task (their progress is stored; the next runner resumes them)."""
        tasks = [*self._tasks.values(), *([self._sweeper] if self._sweeper else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def start(self, job: Job) -> None:
        if job.id in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(self._run(job))
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))

    def running(self, job_id: str) -> bool:
        return job_id in self._tasks

    async def cancel(self, job_id: str) -> None:
        """Stop this front end's task of ``job_id`` (if it runs it) and wait for it to end."""
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, job: Job) -> None:
        try:
            await self._runs[job.kind](job)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug or a lost database: the job waits for a runner
            log.exception("job %s stopped (%s); it resumes at the next claim", job.id, error)

    async def _sweep(self) -> None:
        # A SQLite database serves one front end (docs/database.md): at its start every
        # unfinished job is its own, resumed at once rather than after a lease.
        stale_s = 0.0 if self.store.engine.dialect.name == "sqlite" else self.lease_s
        while True:
            try:
                await asyncio.to_thread(self.store.beat, self.id, list(self._tasks))
                claimed = await asyncio.to_thread(self.store.claim, self.id, stale_s)
                stale_s = self.lease_s
            except SQLAlchemyError as error:
                log.warning("jobs not claimed (the database: %s); trying again", error)
                claimed = []
            for job in claimed:
                if job.kind in self._runs:
                    log.info("resuming %s job %s", job.kind, job.id)
                    self.start(job)
            await asyncio.sleep(self.lease_s / 3)


def error_text(status: int, answer: dict[str, Any]) -> str:
    """A failed call's message for a job's status (never the user's text: the handler's
    messages name fields and bounds)."""
    return str(answer.get("error") or f"HTTP {status}")
