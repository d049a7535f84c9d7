"""Typed errors, each carrying its HTTP status, and the one JSON error body.

Exception tree::

    ServiceError                  -- a request (or batch) failed; has .status and .error_type
    ├── InvalidRequest            400 invalid_request: malformed body, wrong types, bad values
    │   ├── UnsupportedLanguage   400 unsupported_language: unknown code
    │   └── SameLanguage          400 same_language: source equals target
    ├── PayloadTooLarge           413 payload_too_large: too many texts, characters or tokens
    ├── GenerationFailed          500 generation_failed: the engine failed for the whole batch
    ├── Overloaded                503 overloaded: too many rows already wait for the engine
    └── OutOfMemory               507 out_of_memory: the device ran out of memory for the batch
    ConfigurationError            -- bad settings at start-up (not an HTTP error: the worker
                                     refuses to start and the message says which key is wrong)

Every other exception becomes one of these in one place, :func:`as_service_error`: the engine's
scheduler calls it when rows fail, the service and the handler when a request fails otherwise.
Service errors pickle as themselves (they cross the engine process's pipe).
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any, ClassVar

logger = logging.getLogger(__name__)


class ConfigurationError(ValueError):
    """A setting in model-config.yaml's ``handler:`` section (or the environment) is invalid."""


class ServiceError(Exception):
    """A failure reported to the client as ``status`` with the JSON body of :meth:`body`."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, allowed: Any = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.allowed = allowed
        self.field = field

    def body(self, request_id: str | None) -> dict[str, Any]:
        """The JSON error body: what was wrong, what is allowed, which request."""
        body: dict[str, Any] = {"error": self.message, "error_type": self.error_type}
        if self.field is not None:
            body["field"] = self.field
        if self.allowed is not None:
            body["allowed"] = self.allowed
        body["request_id"] = request_id
        return body

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles only ``args``; the keyword fields travel as the instance's state.
        return (type(self), (self.message,), self.__dict__)


class InvalidRequest(ServiceError):
    status = 400
    error_type = "invalid_request"


class UnsupportedLanguage(InvalidRequest):
    error_type = "unsupported_language"


class SameLanguage(InvalidRequest):
    error_type = "same_language"


class PayloadTooLarge(ServiceError):
    status = 413
    error_type = "payload_too_large"


class GenerationFailed(ServiceError):
    status = 500
    error_type = "generation_failed"


class Overloaded(ServiceError):
    status = 503
    error_type = "overloaded"


class OutOfMemory(ServiceError):
    status = 507
    error_type = "out_of_memory"


def as_service_error(error: BaseException, *, rows: int = 1) -> ServiceError:
    """The one translation of a failure into what its requests get.

    A ServiceError stays itself; the device running out of memory is 507 (for ``rows`` texts);
    anything else becomes 500 generation_failed, its details kept out of the reply and, above
    DEBUG, out of the log (its type and place only).
    """
    if isinstance(error, ServiceError):
        return error
    if _out_of_memory(error):
        return OutOfMemory(
            f"the device ran out of memory for a batch of {rows} texts",
            allowed="fewer or shorter texts per request, or retry",
        )
    # An exception's message may quote user text: above DEBUG only its type and where it rose.
    logger.error(
        "generation failed for %d texts: %s at %s", rows, type(error).__name__, _origin(error)
    )
    logger.debug("generation failure in full", exc_info=error)
    return GenerationFailed(
        f"generation failed: {type(error).__name__}", allowed="retry the request"
    )


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


HTTP_PHRASES: dict[int, str] = {
    200: "OK",
    400: "Bad Request",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}
