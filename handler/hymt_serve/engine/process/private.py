"""The engine in a process of its own, for TorchServe's async mode.

In async mode the worker's event loop parses, tokenises and renders requests while the
scheduler drives the GPU. In one process both need the GIL, and every GPU call of the decode
loop releases it; whenever the event loop is busy, the decode loop then waits for the GIL at
each of those points, and a step slows by orders of magnitude. So the worker keeps only the
token codec, and a child process owns the model and the scheduler's serving thread. They talk
over a pipe in the messages of :mod:`hymt_serve.engine.process.connection`; errors cross it as
themselves.

The child exits when the pipe closes (the worker is gone). When the child dies, the texts it
held fail with 500, new ones get 503 while a new child loads, and the worker carries on; only
if the new child cannot start does the worker exit (TorchServe then starts a new worker).

With ``share_engine: true`` the workers of one GPU share one engine process instead, over a
Unix socket with the same messages (:mod:`hymt_serve.engine.process.shared`); when it dies, each
worker connects again, and the first one starts a new engine.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from hymt_serve.core.errors import (
    ConfigurationError,
    EngineFailed,
    EngineUnavailable,
)
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationResult, GenerationRow, OnTokens
from hymt_serve.engine.codec import TokenCodec
from hymt_serve.engine.process.connection import (
    Describe,
    Done,
    Facts,
    Failed,
    LoadFailed,
    Submit,
    Tokens,
    serve_connection,
)
from hymt_serve.engine.process.shared import connect, hang_up

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 1800.0
EXIT_GRACE_S = 2.0  # for the failed requests' replies to leave before the worker exits


@dataclass(frozen=True)
class _Waiter:
    """A worker-side job: its future and, for a stream, who gets its tokens."""

    future: Future[Any]
    on_tokens: OnTokens | None = None


class EngineClient:
    """The worker's side: token codec here, generation in the child. Offers what the service
    needs of an engine; every row goes through :meth:`submit`."""

    _process: Any  # the child (multiprocessing.Process) or the shared engine (_SharedProcess)

    def __init__(self, settings: Settings, gpu_id: int | None, max_waiting: int) -> None:
        self.settings = settings
        self.codec = TokenCodec.load(settings)
        self._child_args = (settings, gpu_id, max_waiting)
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._waiters: dict[int, _Waiter] = {}
        self._closing = False
        self.restarts = 0
        self._spawn()
        self._reader = threading.Thread(target=self._read, name="hymt-engine-reader", daemon=True)
        self._reader.start()

    def _spawn(self) -> None:
        """Start the child (or, shared, connect to the GPU's engine process) and wait until
        its engine is ready; ConfigurationError if not."""
        if self.settings.serving.share_engine:
            self._conn, ready = connect(*self._child_args, start_timeout=START_TIMEOUT_S)
            self._process = _SharedProcess(int(ready.facts.get("pid", 0)))
            self.available = True
            return
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
        if isinstance(message, LoadFailed):
            self._process.join(10)
            raise ConfigurationError(f"the engine process failed to load: {message.reason}")
        self.available = True

    def encode_prompt(self, user_turn: str) -> list[int]:
        return self.codec.encode(user_turn)

    def encode_chat(self, turns: Sequence[ChatTurn]) -> list[int]:
        return self.codec.encode_chat(turns)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.codec.decode(token_ids)

    def submit(
        self, row: GenerationRow, on_tokens: OnTokens | None = None
    ) -> Future[GenerationResult]:
        """Send ``row`` to the child; its future resolves when the child answers."""
        future: Future[GenerationResult] = Future()
        job = next(self._ids)
        self._waiters[job] = _Waiter(future, on_tokens)
        if not self.available or not self._try_send(Submit(job, row, on_tokens is not None)):
            self._waiters.pop(job, None)
            raise EngineUnavailable("the engine process is restarting", allowed="retry in a minute")
        return future

    def run(self, futures: Sequence[Future[Any]]) -> None:
        """Return once every future is done (the child steps)."""
        wait_all(futures)

    def describe_later(self) -> Future[dict[str, Any]]:
        """The child's engine facts (scheduler counters included), when it answers."""
        future: Future[dict[str, Any]] = Future()
        job = next(self._ids)
        self._waiters[job] = _Waiter(future)
        if not self._try_send(Describe(job)):
            self._waiters.pop(job, None)
            future.set_exception(
                EngineUnavailable("the engine process is restarting", allowed="retry in a minute")
            )
        return future

    def describe(self, timeout: float = 30.0) -> dict[str, Any]:
        """:meth:`describe_later`, waited for (start-up; never on an event loop)."""
        return self.with_process(self.describe_later().result(timeout=timeout))

    def with_process(self, facts: dict[str, Any]) -> dict[str, Any]:
        return {**facts, "process": {"pid": self._process.pid, "restarts": self.restarts}}

    def close(self, timeout: float = 30.0) -> None:
        """Stop the child (tests and shutdown)."""
        self._closing = True
        # hang_up, not a plain close: the reader thread blocked on this pipe would keep it open,
        # and the child would not see its end before the join timed out.
        hang_up(self._conn)
        if self.settings.serving.share_engine:  # the engine stays for the GPU's other workers
            return
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()

    def _try_send(self, message: Submit | Describe) -> bool:
        try:
            with self._send_lock:
                self._conn.send(message)
        except OSError:
            return False
        return True

    def _read(self) -> None:
        while not self._closing:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._child_gone()
                continue
            self._dispatch(message)

    def _dispatch(self, message: Tokens | Done | Failed | Facts) -> None:
        if isinstance(message, Tokens):
            waiter = self._waiters.get(message.job)
            if waiter is not None and waiter.on_tokens is not None:
                waiter.on_tokens(message.ids)
            return
        waiter = self._waiters.pop(message.job, None)
        if waiter is None:
            return
        with contextlib.suppress(InvalidStateError):  # the request gave up meanwhile
            if isinstance(message, Done):
                result = message.result
                waiter.future.set_result(self.codec.result(result.token_ids, result.finish_reason))
            elif isinstance(message, Facts):
                waiter.future.set_result(message.facts)
            else:
                waiter.future.set_exception(message.error)

    def _child_gone(self) -> None:
        """Fail what the dead child held and start a new one; exit the worker if that fails."""
        self.available = False
        waiters, self._waiters = self._waiters, {}
        if self._closing:
            return
        logger.error(
            "the engine process exited (code %s); failing %d texts and restarting it",
            self._process.exitcode,
            len(waiters),
        )
        error = EngineFailed("the engine process stopped", allowed="retry the request")
        for waiter in waiters.values():
            with contextlib.suppress(InvalidStateError):
                waiter.future.set_exception(error)
        try:
            self._spawn()
        except Exception:
            logger.critical("the engine process could not be restarted; exiting the worker")
            time.sleep(EXIT_GRACE_S)  # let the failed requests' replies leave
            os._exit(1)
        self.restarts += 1
        logger.info("engine process restarted (pid %s)", self._process.pid)


@dataclass
class _SharedProcess:
    """The shared engine process, as far as one of its workers deals with it: it is not this
    worker's to join or kill (it exits once no worker is connected)."""

    pid: int
    exitcode: int | None = None

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return False

    def kill(self) -> None:
        pass


def serve_child(conn: Connection, settings: Settings, gpu_id: int | None, max_waiting: int) -> None:
    """The child process: load the engine, start its serving thread, serve the pipe until it
    closes."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="engine %(levelname)s %(name)s: %(message)s"
    )
    # Only the engine process loads the model code (and torch): the worker keeps the codec.
    from hymt_serve.engine.engine import load_engine

    try:
        engine = load_engine(settings, gpu_id, max_waiting=max_waiting, decode=False)
        engine.start()
    except Exception as error:
        logger.exception("the engine failed to load")
        conn.send(LoadFailed(f"{type(error).__name__}: {error}"))
        conn.close()
        return
    serve_connection(conn, engine)
    os._exit(0)  # the worker is gone: nothing left to serve
