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

Foreign exceptions are translated into these once, in :mod:`hymt_serve.request.service`.
"""

from __future__ import annotations

from typing import Any, ClassVar


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


HTTP_PHRASES: dict[int, str] = {
    200: "OK",
    400: "Bad Request",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}
