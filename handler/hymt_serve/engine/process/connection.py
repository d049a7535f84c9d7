"""The messages between a worker and the engine process, and the engine's end of one
worker's connection (a pipe to a private engine, or a Unix socket to a shared one).

Errors cross as themselves: engine errors pickle.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from hymt_serve.core.errors import EngineError, as_engine_error
from hymt_serve.core.types import GenerationResult, GenerationRow


# Worker -> child.
@dataclass(frozen=True)
class Submit:
    job: int
    row: GenerationRow
    stream: bool


@dataclass(frozen=True)
class Describe:
    job: int


# Child -> worker.
@dataclass(frozen=True)
class Ready:
    facts: dict[str, Any]


@dataclass(frozen=True)
class LoadFailed:
    reason: str


@dataclass(frozen=True)
class Tokens:
    job: int
    ids: list[int]


@dataclass(frozen=True)
class Done:
    job: int
    result: GenerationResult  # text left empty: the worker decodes


@dataclass(frozen=True)
class Failed:
    job: int
    error: EngineError


@dataclass(frozen=True)
class Facts:
    job: int
    facts: dict[str, Any]


Outbox = queue.SimpleQueue[Ready | Tokens | Done | Failed | Facts | None]


def serve_connection(conn: Connection, engine: Any) -> None:
    """Tell the worker at the other end of ``conn`` that the engine is ready, then serve its
    messages until it closes the connection."""
    outbox: Outbox = queue.SimpleQueue()
    conn.send(Ready({**engine.describe(), "pid": os.getpid()}))
    sender = threading.Thread(target=_send_all, args=(conn, outbox), daemon=True)
    sender.start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if isinstance(message, Describe):
            outbox.put(Facts(message.job, engine.describe()))
            continue
        on_tokens = partial(_tokens, outbox, message.job) if message.stream else None
        try:
            future = engine.submit(message.row, on_tokens)
        except Exception as error:
            outbox.put(Failed(message.job, as_engine_error(error)))
            continue
        future.add_done_callback(partial(_reply, outbox, message.job))
    outbox.put(None)  # ends the sender


def _tokens(outbox: Outbox, job: int, ids: list[int]) -> None:
    outbox.put(Tokens(job, ids))


def _reply(outbox: Outbox, job: int, future: Future[GenerationResult]) -> None:
    error = future.exception()
    if error is not None:  # the scheduler's futures only ever hold engine errors
        outbox.put(Failed(job, as_engine_error(error)))
    else:
        outbox.put(Done(job, future.result()))


def _send_all(conn: Connection, outbox: Outbox) -> None:
    while True:
        message = outbox.get()
        if message is None:
            return
        try:
            conn.send(message)
        except OSError:
            return
