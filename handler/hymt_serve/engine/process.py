"""The model and its scheduler in a process of their own, for TorchServe's async mode.

In async mode the worker's event loop parses, tokenises and renders requests while the
scheduler drives the GPU. In one process both need the GIL, and every GPU call of the decode
loop releases it; whenever the event loop is busy, the decode loop then waits for the GIL at
each of those points (a probe with one busy Python thread slowed a tiny model's decode step
from 2 ms to 600 ms). So the worker keeps only the tokenizer, and a child process owns the
model and the scheduler (continuous batching on the fast engine). They talk over a pipe:

    worker -> child   ("submit", id, GenerationRow, stream) | ("describe", id)
    child -> worker   ("ready", describe) | ("failed", error, message) at start, then
                      ("tokens", id, ids) | ("done", id, ids, finish)
                      | ("error", id, error, message, allowed, field) | ("describe", id, facts)

The child exits when the pipe closes (the worker is gone). When the child dies, the texts it
held fail with 500, new ones get 503 while a new child loads, and the worker carries on; only
if the new child cannot start does the worker exit (TorchServe then starts a new worker).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from hymt_serve.engine.types import FinishReason, GenerationResult, GenerationRow
from hymt_serve.request import errors
from hymt_serve.request.errors import ConfigurationError, GenerationFailed, Overloaded, ServiceError
from hymt_serve.request.settings import Settings

logger = logging.getLogger(__name__)

Emit = Callable[[list[int]], None]
START_TIMEOUT_S = 1800.0
DESCRIBE_TIMEOUT_S = 30.0
EXIT_GRACE_S = 2.0  # for the failed requests' replies to leave before the worker exits


class EngineClient:
    """The worker's side: tokenizer here, generation in the child. Implements the service's
    ``Engine`` protocol; every generation goes through :meth:`submit`."""

    def __init__(self, settings: Settings, gpu_id: int | None, max_waiting: int) -> None:
        from hymt_serve.engine.codec import load_tokenizer

        self.settings = settings
        self.tokenizer = load_tokenizer(settings)
        self._child_args = (settings, gpu_id, max_waiting)
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._jobs: dict[int, tuple[Future[Any], Emit | None]] = {}
        self._closing = False
        self.restarts = 0
        self._spawn()
        self._reader = threading.Thread(target=self._read, name="hymt-engine-reader", daemon=True)
        self._reader.start()

    def _spawn(self) -> None:
        """Start the child and wait until its engine is ready; ConfigurationError if not."""
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        self._process = context.Process(
            target=serve_child, args=(child_end, *self._child_args), name="hymt-engine", daemon=True
        )
        self._process.start()
        child_end.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self._process.kill()
            raise ConfigurationError(f"the engine process did not start in {START_TIMEOUT_S} s")
        try:
            message = self._conn.recv()
        except EOFError:
            raise ConfigurationError(
                f"the engine process died while loading (exit code {self._process.exitcode})"
            ) from None
        if message[0] == "failed":
            self._process.join(10)
            raise ConfigurationError(f"the engine process failed to load: {message[2]}")
        self.available = True

    # The Engine protocol.

    def encode_prompt(self, user_turn: str) -> list[int]:
        from hymt_serve.engine.codec import encode_user_turn

        return encode_user_turn(self.tokenizer, user_turn)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def submit(self, row: GenerationRow, emit: Emit | None = None) -> Future[GenerationResult]:
        """Send ``row`` to the child; its future resolves when the child answers."""
        if not self.available:
            raise Overloaded(
                "the engine process is restarting", allowed="retry in a minute"
            ) from None
        future: Future[GenerationResult] = Future()
        job_id = next(self._ids)
        self._jobs[job_id] = (future, emit)
        try:
            self._send(("submit", job_id, row, emit is not None))
        except OSError:
            self._jobs.pop(job_id, None)
            raise Overloaded(
                "the engine process is restarting", allowed="retry in a minute"
            ) from None
        return future

    def generate(self, rows: Sequence[GenerationRow]) -> list[GenerationResult]:
        return [future.result() for future in [self.submit(row) for row in rows]]

    def stream(self, row: GenerationRow, emit: Emit) -> GenerationResult:
        return self.submit(row, emit).result()

    def describe(self) -> dict[str, Any]:
        """The child's engine facts, now (scheduler counters included)."""
        future: Future[Any] = Future()
        job_id = next(self._ids)
        self._jobs[job_id] = (future, None)
        self._send(("describe", job_id))
        facts: dict[str, Any] = future.result(timeout=DESCRIBE_TIMEOUT_S)
        facts["process"] = {"pid": self._process.pid, "restarts": self.restarts}
        return facts

    def close(self, timeout: float = 30.0) -> None:
        """Stop the child (tests and shutdown)."""
        self._closing = True
        self._conn.close()
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()

    # Internals.

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _read(self) -> None:
        while not self._closing:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._child_gone()
                continue
            self._dispatch(message)

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind, job_id = message[0], message[1]
        if kind == "tokens":
            entry = self._jobs.get(job_id)
            if entry is not None and entry[1] is not None:
                entry[1](message[2])
            return
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return
        future = entry[0]
        with contextlib.suppress(InvalidStateError):
            if kind == "done":
                tokens, finish = message[2], message[3]
                future.set_result(GenerationResult(self.decode(tokens), tuple(tokens), finish))
            elif kind == "describe":
                future.set_result(message[2])
            else:
                future.set_exception(_service_error(*message[2:]))

    def _child_gone(self) -> None:
        """Fail what the dead child held and start a new one; exit the worker if that fails."""
        self.available = False
        jobs, self._jobs = self._jobs, {}
        if self._closing:
            return
        logger.error(
            "the engine process exited (code %s); failing %d texts and restarting it",
            self._process.exitcode,
            len(jobs),
        )
        error = GenerationFailed("the engine process stopped", allowed="retry the request")
        for future, _ in jobs.values():
            with contextlib.suppress(InvalidStateError):
                future.set_exception(error)
        try:
            self._spawn()
        except Exception:
            logger.critical("the engine process could not be restarted; exiting the worker")
            time.sleep(EXIT_GRACE_S)  # let the failed requests' replies leave
            os._exit(1)
        self.restarts += 1
        logger.info("engine process restarted (pid %s)", self._process.pid)


def _service_error(
    name: str, message: str, allowed: Any = None, field: str | None = None
) -> ServiceError:
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, ServiceError)):
        cls = GenerationFailed
    return cls(message, allowed=allowed, field=field)


def _error_message(job_id: int, error: BaseException) -> tuple[Any, ...]:
    if isinstance(error, ServiceError):
        return ("error", job_id, type(error).__name__, error.message, error.allowed, error.field)
    return ("error", job_id, "GenerationFailed", f"generation failed: {type(error).__name__}")


def serve_child(conn: Connection, settings: Settings, gpu_id: int | None, max_waiting: int) -> None:
    """The child process: load the engine, start its scheduler, serve the pipe until it closes."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="engine %(levelname)s %(name)s: %(message)s"
    )
    from hymt_serve.engine.engine import load_engine

    try:
        engine = load_engine(settings, gpu_id)
        engine.start_scheduler(max_waiting, decode=False)
    except Exception as error:
        logger.exception("the engine failed to load")
        conn.send(("failed", type(error).__name__, str(error)))
        conn.close()
        return
    outbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    conn.send(("ready", engine.describe()))
    sender = threading.Thread(target=_send_all, args=(conn, outbox), daemon=True)
    sender.start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message[0] == "describe":
            outbox.put(("describe", message[1], engine.describe()))
            continue
        _, job_id, row, stream = message
        emit = partial(_emit_tokens, outbox, job_id) if stream else None
        try:
            future = engine.submit(row, emit)
        except Exception as error:
            outbox.put(_error_message(job_id, error))
            continue
        future.add_done_callback(partial(_reply, outbox, job_id))
    os._exit(0)  # the worker is gone: nothing left to serve


def _emit_tokens(outbox: queue.SimpleQueue[tuple[Any, ...]], job_id: int, ids: list[int]) -> None:
    outbox.put(("tokens", job_id, ids))


def _reply(
    outbox: queue.SimpleQueue[tuple[Any, ...]], job_id: int, future: Future[GenerationResult]
) -> None:
    error = future.exception()
    if error is not None:
        outbox.put(_error_message(job_id, error))
        return
    result = future.result()
    finish: FinishReason = result.finish_reason
    outbox.put(("done", job_id, list(result.token_ids), finish))


def _send_all(conn: Connection, outbox: queue.SimpleQueue[tuple[Any, ...]]) -> None:
    while True:
        message = outbox.get()
        try:
            conn.send(message)
        except OSError:
            return
