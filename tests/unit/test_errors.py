from __future__ import annotations

import ast
import logging
import pickle
from pathlib import Path

import pytest
import torch

from hymt_serve.core import errors as domain
from hymt_serve.core.errors import EngineError
from hymt_serve.request import errors
from hymt_serve.request.errors import ENGINE_STATUSES, HTTP_PHRASES, ServiceError

ALL_ERRORS = [
    cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, ServiceError)
]
ENGINE_ERRORS = [
    cls for cls in vars(domain).values() if isinstance(cls, type) and issubclass(cls, EngineError)
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


@pytest.mark.parametrize("cls", ENGINE_ERRORS, ids=lambda c: c.__name__)
def test_every_engine_error_maps_to_a_status(cls: type[EngineError]) -> None:
    assert cls in ENGINE_STATUSES
    mapped = errors.as_service_error(cls("what went wrong", allowed=["x"], field="f"))
    assert type(mapped) is ENGINE_STATUSES[cls] and mapped.status in HTTP_PHRASES
    assert mapped.body("req-1") == {
        "error": "what went wrong",
        "error_type": mapped.error_type,
        "field": "f",
        "allowed": ["x"],
        "request_id": "req-1",
    }


def test_engine_statuses() -> None:
    statuses = {cls.__name__: ENGINE_STATUSES[cls].status for cls in ENGINE_ERRORS}
    assert statuses == {
        "EngineError": 500,
        "RowRejected": 400,
        "ContextTooLong": 413,
        "QueueFull": 503,
        "EngineUnavailable": 503,
        "DeviceOutOfMemory": 507,
        "EngineFailed": 500,
    }


# Every place the package creates a service error or an engine error, with the status the
# client then gets. A new raise site fails test_every_raise_site_is_mapped until it is added.
RAISE_SITES: dict[tuple[str, str, str], int] = {
    # The transport: what TorchServe handed over is not a body we can read.
    ("hymt_serve/request/transport.py", "body_of", "InvalidRequest"): 400,
    ("hymt_serve/request/transport.py", "refusal", "InvalidRequest"): 400,
    # The protocol: the body itself.
    ("hymt_serve/request/values.py", "flag", "InvalidRequest"): 400,
    # The translation memory's request fields ("cache", "cache_namespace").
    ("hymt_serve/request/memory_key.py", "take_choice", "InvalidRequest"): 400,
    ("hymt_serve/request/memory_key.py", "check_choice", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "decode_body", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_json_from_bytes", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_canonical_fields", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_texts", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_texts", "PayloadTooLarge"): 413,
    ("hymt_serve/request/protocol.py", "_stream", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_language", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_language", "UnsupportedLanguage"): 400,
    ("hymt_serve/request/protocol.py", "parse_request", "SameLanguage"): 400,
    ("hymt_serve/request/protocol.py", "_check_detectable", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_max_new_tokens", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_sampling", "InvalidRequest"): 400,
    ("hymt_serve/request/protocol.py", "_check_sampling_value", "InvalidRequest"): 400,
    # The chat form: messages or a prompt, OpenAI's generation options.
    ("hymt_serve/request/chat.py", "_check_fields", "InvalidRequest"): 400,
    ("hymt_serve/request/chat.py", "turns_of", "InvalidRequest"): 400,
    ("hymt_serve/request/chat.py", "_turn", "InvalidRequest"): 400,
    ("hymt_serve/request/chat.py", "_content", "InvalidRequest"): 400,
    ("hymt_serve/request/chat.py", "_text_part", "InvalidRequest"): 400,
    ("hymt_serve/request/chat.py", "_prompt_turns", "InvalidRequest"): 400,
    ("hymt_serve/request/chat.py", "parse_chat", "PayloadTooLarge"): 413,
    ("hymt_serve/request/chat_options.py", "stops_of", "InvalidRequest"): 400,
    ("hymt_serve/request/chat_options.py", "max_tokens_of", "InvalidRequest"): 400,
    ("hymt_serve/request/chat_options.py", "choices_of", "InvalidRequest"): 400,
    ("hymt_serve/request/chat_options.py", "_check_knob", "InvalidRequest"): 400,
    ("hymt_serve/request/chat_options.py", "_check_top_k", "InvalidRequest"): 400,
    ("hymt_serve/request/chat_options.py", "_seed", "InvalidRequest"): 400,
    # KServe v2 (Open Inference Protocol): the request's tensors and parameters.
    ("hymt_serve/request/oip.py", "_binary_length", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "_field", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "_flat", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "_inputs", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "_object", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "_parameters", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "_requested", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "_strings", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "check_used", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "strings", "InvalidRequest"): 400,
    ("hymt_serve/request/oip.py", "unwrap", "InvalidRequest"): 400,
    ("hymt_serve/web/oip_routes.py", "_characters", "InvalidRequest"): 400,
    # Fields only some model families support (glossary, context, preserve_format, ...).
    ("hymt_serve/request/features.py", "parse_features", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_glossary", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_glossary", "PayloadTooLarge"): 413,
    ("hymt_serve/request/features.py", "_pair", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_bounded", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_bounded", "PayloadTooLarge"): 413,
    ("hymt_serve/request/features.py", "_one_line", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_candidate_list", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_markup", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_true", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_preferences", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_preferences", "PayloadTooLarge"): 413,
    ("hymt_serve/request/features.py", "_data_format", "InvalidRequest"): 400,
    ("hymt_serve/request/features.py", "_candidates", "InvalidRequest"): 400,
    ("hymt_serve/request/markup.py", "to_tags", "InvalidRequest"): 400,
    # Documents: their fields, a malformed SRT file, too many segments.
    ("hymt_serve/request/document_fields.py", "parse_document", "InvalidRequest"): 400,
    ("hymt_serve/request/document_fields.py", "_check_size", "PayloadTooLarge"): 413,
    ("hymt_serve/request/document_formats.py", "_malformed", "InvalidRequest"): 400,
    # Localisation and Office files: malformed XML, PO lines, packages, base64; versions.
    ("hymt_serve/request/xml_tree.py", "error", "InvalidRequest"): 400,
    ("hymt_serve/request/localisation_po.py", "_read", "InvalidRequest"): 400,
    ("hymt_serve/request/localisation_xliff.py", "_version", "InvalidRequest"): 400,
    ("hymt_serve/request/office.py", "_invalid", "InvalidRequest"): 400,
    ("hymt_serve/request/office.py", "decode_base64", "InvalidRequest"): 400,
    ("hymt_serve/request/tokenising.py", "_tokenise_document", "PayloadTooLarge"): 413,
    # A durable job's resuming document call: its done segments, fingerprint, max_segments.
    ("hymt_serve/request/document_resume.py", "parse_resume", "InvalidRequest"): 400,
    ("hymt_serve/request/document_resume.py", "_done", "InvalidRequest"): 400,
    ("hymt_serve/request/document_resume.py", "resume", "InvalidRequest"): 400,
    # The service: a text (or a document's segment) or a conversation whose prompt is too long.
    ("hymt_serve/request/tokenising.py", "_row", "PayloadTooLarge"): 413,
    ("hymt_serve/request/tokenising.py", "_tokenise_chat", "PayloadTooLarge"): 413,
    # The engine (its domain errors): rows it cannot take, too many waiting, its process gone.
    ("hymt_serve/engine/scheduler/loop.py", "submit", "RowRejected"): 400,
    ("hymt_serve/engine/codec.py", "encode_conversation", "RowRejected"): 400,
    ("hymt_serve/engine/scheduler/jobs.py", "put", "QueueFull"): 503,
    ("hymt_serve/engine/scheduler/loop.py", "submit", "ContextTooLong"): 413,
    ("hymt_serve/engine/process/private.py", "submit", "EngineUnavailable"): 503,
    ("hymt_serve/engine/process/private.py", "describe_later", "EngineUnavailable"): 503,
    ("hymt_serve/engine/process/private.py", "_child_gone", "EngineFailed"): 500,
    ("hunyuan_mt_handler.py", "_describe_async", "Overloaded"): 503,
    # The one translation of every other exception of a running engine.
    ("hymt_serve/core/errors.py", "as_engine_error", "DeviceOutOfMemory"): 507,
    ("hymt_serve/core/errors.py", "as_engine_error", "EngineFailed"): 500,
}


def status_of(name: str) -> int:
    """The status a client gets for the error class ``name`` (a service or an engine error)."""
    if hasattr(errors, name) and issubclass(getattr(errors, name), ServiceError):
        return int(getattr(errors, name).status)
    return ENGINE_STATUSES[getattr(domain, name)].status


def raise_sites() -> set[tuple[str, str, str]]:
    """(file, function, error class) of every construction of a service error or an engine
    error in handler/."""
    names = {cls.__name__ for cls in ALL_ERRORS + ENGINE_ERRORS}
    root = Path(__file__).resolve().parents[2] / "handler"
    sites = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id in names
                ):
                    sites.add((path.relative_to(root).as_posix(), node.name, call.func.id))
    return sites


def test_every_raise_site_is_mapped() -> None:
    assert raise_sites() == set(RAISE_SITES)
    for (_, _, name), status in RAISE_SITES.items():
        assert status_of(name) == status, name


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_errors_cross_a_pipe_as_themselves(cls: type[ServiceError]) -> None:
    error = cls("what went wrong", allowed={"max": 3}, field="text")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert copy.body("r") == error.body("r") and str(copy) == str(error)


@pytest.mark.parametrize("cls", ENGINE_ERRORS, ids=lambda c: c.__name__)
def test_engine_errors_cross_a_pipe_as_themselves(cls: type[EngineError]) -> None:
    error = cls("what went wrong", allowed={"max": 3}, field="text")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and str(copy) == str(error)
    assert (copy.message, copy.allowed, copy.field) == (error.message, error.allowed, error.field)


def test_as_service_error_translates_once() -> None:
    mine = errors.Overloaded("busy")
    assert errors.as_service_error(mine) is mine
    oom = errors.as_service_error(torch.OutOfMemoryError("CUDA out of memory"), rows=3)
    assert (type(oom), oom.status, oom.message) == (
        errors.OutOfMemory,
        507,
        "the device ran out of memory for a batch of 3 texts",
    )
    other = errors.as_service_error(KeyError("secret detail"))
    assert (type(other), other.status) == (errors.GenerationFailed, 500)
    assert "secret" not in other.message and "KeyError" in other.message
    busy = errors.as_service_error(domain.QueueFull("busy", allowed="retry"))
    assert (type(busy), busy.message, busy.allowed) == (errors.Overloaded, "busy", "retry")


def test_as_engine_error_translates_once() -> None:
    mine = domain.QueueFull("busy")
    assert domain.as_engine_error(mine) is mine
    oom = domain.as_engine_error(torch.OutOfMemoryError("CUDA out of memory"), rows=3)
    assert (type(oom), oom.message) == (
        domain.DeviceOutOfMemory,
        "the device ran out of memory for a batch of 3 texts",
    )
    other = domain.as_engine_error(KeyError("secret detail"))
    assert type(other) is domain.EngineFailed
    assert "secret" not in other.message and "KeyError" in other.message


def test_a_failure_logs_no_user_text_above_debug(caplog: pytest.LogCaptureFixture) -> None:
    def fail() -> None:
        raise ValueError("the user wrote: secret words")

    try:
        fail()
    except ValueError as error:
        with caplog.at_level(logging.INFO, logger="hymt_serve.core.errors"):
            errors.as_service_error(error)
        assert "ValueError at " in caplog.text and "in fail" in caplog.text
        assert "secret" not in caplog.text
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="hymt_serve.core.errors"):
            errors.as_service_error(error)
        assert "secret words" in caplog.text  # the whole traceback, at DEBUG only
