from __future__ import annotations

import pytest

from hymt_serve.request import errors
from hymt_serve.request.errors import HTTP_PHRASES, ServiceError

ALL_ERRORS = [
    cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, ServiceError)
]


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_maps_to_a_status_and_a_body(cls: type[ServiceError]) -> None:
    assert cls.status in HTTP_PHRASES
    assert (cls.status >= 500) == (
        cls in (errors.GenerationFailed, errors.Overloaded, errors.OutOfMemory, ServiceError)
    )
    body = cls("what went wrong", allowed=["x"], field="f").body("req-1")
    assert body == {
        "error": "what went wrong",
        "error_type": cls.error_type,
        "field": "f",
        "allowed": ["x"],
        "request_id": "req-1",
    }


def test_error_types_are_distinct() -> None:
    types = [cls.error_type for cls in ALL_ERRORS]
    assert len(types) == len(set(types))


def test_statuses() -> None:
    assert errors.InvalidRequest.status == 400
    assert errors.UnsupportedLanguage.status == 400
    assert errors.PayloadTooLarge.status == 413
    assert errors.Overloaded.status == 503
    assert errors.OutOfMemory.status == 507
