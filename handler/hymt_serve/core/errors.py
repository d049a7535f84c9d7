"""The errors the engine raises: what went wrong, with no HTTP status.

Exception tree::

    ConfigurationError        bad settings or model folder at start-up (the worker refuses to
                              start and the message says which key or file is wrong)
    EngineError               the engine could not serve a row; has .message, .allowed, .field
    ├── RowRejected           the row is malformed (no prompt tokens, max_new_tokens < 1)
    ├── ContextTooLong        prompt + max_new_tokens past the engine's context
    ├── QueueFull             too many rows wait for the engine already
    ├── EngineUnavailable     the engine process is restarting
    ├── DeviceOutOfMemory     the device ran out of memory for the rows
    └── EngineFailed          anything else went wrong while generating

Every other exception of a running engine becomes an EngineError in one place,
:func:`as_engine_error`; the request side alone turns engine errors into HTTP statuses
(:func:`hymt_serve.request.errors.as_service_error`). Engine errors pickle as themselves: they
cross the engine process's pipe.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

logger = logging.getLogger(__name__)


class ConfigurationError(ValueError):
    """A setting in model-config.yaml's ``handler:`` section (or the environment) is invalid."""


class EngineError(Exception):
    """A row the engine could not serve: ``message`` says why, ``allowed`` what would do,
    ``field`` which request field is at fault (when one is)."""

    def __init__(self, message: str, *, allowed: Any = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.allowed = allowed
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles only ``args``; the keyword fields travel as the instance's state.
        return (type(self), (self.message,), self.__dict__)


class RowRejected(EngineError):
    """The row has no prompt tokens, or asks for fewer than one new token."""


class ContextTooLong(EngineError):
    """The row's prompt and new tokens do not fit the cache or the model's positions."""


class QueueFull(EngineError):
    """As many rows as the engine lets wait are waiting already."""


class EngineUnavailable(EngineError):
    """The engine process is restarting; a later retry may succeed."""


class DeviceOutOfMemory(EngineError):
    """The device ran out of memory for the rows of a step."""


class EngineFailed(EngineError):
    """Generation failed for another reason (the engine process stopped, a kernel raised)."""


def as_engine_error(error: BaseException, *, rows: int = 1) -> EngineError:
    """The one translation of a failure while generating into an engine error.

    An EngineError stays itself; the device running out of memory is DeviceOutOfMemory (for
    ``rows`` texts); anything else becomes EngineFailed, its details kept out of the message
    and, above DEBUG, out of the log (its type and place only).
    """
    if isinstance(error, EngineError):
        return error
    if _out_of_memory(error):
        return DeviceOutOfMemory(
            f"the device ran out of memory for a batch of {rows} texts",
            allowed="fewer or shorter texts per request, or retry",
        )
    # An exception's message may quote user text: above DEBUG only its type and where it rose.
    logger.error(
        "generation failed for %d texts: %s at %s", rows, type(error).__name__, _origin(error)
    )
    logger.debug("generation failure in full", exc_info=error)
    return EngineFailed(f"generation failed: {type(error).__name__}", allowed="retry the request")


def _origin(error: BaseException) -> str:
    """``file:line in function`` of the frame the exception rose in ("unknown" without one)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "unknown"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _out_of_memory(error: BaseException) -> bool:
    torch = sys.modules.get("torch")  # never imported here: the request side runs without it
    return torch is not None and isinstance(error, torch.OutOfMemoryError)
