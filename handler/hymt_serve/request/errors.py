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

The engine raises the domain errors of :mod:`hymt_serve.core.errors`, which know no HTTP;
every other exception becomes a service error in one place, :func:`as_service_error` (the
service and the handler call it when a request fails). Service errors pickle as themselves.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hymt_serve.core.errors import (
    ContextTooLong,
    DeviceOutOfMemory,
    EngineError,
    EngineFailed,
    EngineUnavailable,
    QueueFull,
    RowRejected,
    as_engine_error,
)


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


# What each engine error is to a client.
ENGINE_STATUSES: dict[type[EngineError], type[ServiceError]] = {
    RowRejected: InvalidRequest,
    ContextTooLong: PayloadTooLarge,
    QueueFull: Overloaded,
    EngineUnavailable: Overloaded,
    DeviceOutOfMemory: OutOfMemory,
    EngineFailed: GenerationFailed,
    EngineError: GenerationFailed,
}


def as_service_error(error: BaseException, *, rows: int = 1) -> ServiceError:
    """The one translation of a failure into what its requests get.

    A ServiceError stays itself; an engine error becomes the service error
    :data:`ENGINE_STATUSES` gives its class, with its message; anything else first becomes an
    engine error (:func:`~hymt_serve.core.errors.as_engine_error`: out of memory for ``rows``
    texts, or generation failed).
    """
    if isinstance(error, ServiceError):
        return error
    failure = as_engine_error(error, rows=rows)
    kind = next(ENGINE_STATUSES[cls] for cls in type(failure).__mro__ if cls in ENGINE_STATUSES)
    return kind(failure.message, allowed=failure.allowed, field=failure.field)


HTTP_PHRASES: dict[int, str] = {
    200: "OK",
    400: "Bad Request",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}
