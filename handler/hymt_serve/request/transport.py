"""Which TorchServe interface a request came through, and what each one can safely carry.

Pure Python. TorchServe 0.12.0 hands the handler every request the same way, whichever door it
came in by; only the request headers tell them apart:

- HTTP requests carry the client's headers plus TorchServe's own (``explain``, ``url_path``):
  request-level headers are plain strings.
- gRPC ``Predictions`` and ``StreamPredictions`` carry no request-level header at all (only
  the per-parameter ``{"content-type": ...}`` entries). The handler cannot tell the two apart.
- gRPC ``StreamPredictions2`` carries ``ts_request_sequence_id``.

What that means on the wire (checked against a running 0.12.0, see tests/integration/test_grpc.py):

- A second message to a unary ``Predictions`` call makes the front end throw "Stream is
  already completed", drop the worker and never replace it. Since a streamed request over
  ``Predictions`` looks exactly like one over ``StreamPredictions``, text deltas are never sent
  to either: ``"stream": true`` over gRPC is a 400 that points to HTTP.
- ``StreamPredictions`` completes its stream only on a reply marked ``ts_stream_next: false``;
  without that header the front end fails the call with "Worker died." after the reply. Every
  gRPC reply is therefore marked as the last one.
- ``StreamPredictions2`` does not work for a model without sequence batching (ours): the front
  end queues the request, then fails the call with ``UNKNOWN`` while looking up its sequence. If
  the client has half-closed its request stream by then, the reply makes the front end throw as
  above and the worker is lost. So the handler does no work for such a request and sends no
  reply at all (TorchServe then forgets the request): nothing reaches a closed call.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from hymt_serve.request.errors import InvalidRequest

SEQUENCE_ID_HEADER = "ts_request_sequence_id"  # TorchServe's default ts_header_key_sequence_id
STREAM_NEXT_HEADER = "ts_stream_next"


class Origin(Enum):
    HTTP = "http"
    GRPC = "grpc"  # Predictions or StreamPredictions: one message per request, no deltas
    GRPC_SEQUENCE = "grpc_sequence"  # StreamPredictions2: refused, and no reply is sent

    @property
    def grpc(self) -> bool:
        return self is not Origin.HTTP


def origin(headers: Mapping[str, Any] | None) -> Origin:
    """The interface of a request, from TorchServe's header map for it."""
    headers = headers or {}
    if SEQUENCE_ID_HEADER in headers:
        return Origin.GRPC_SEQUENCE
    if any(not isinstance(value, Mapping) for value in headers.values()):
        return Origin.HTTP
    return Origin.GRPC


def body_of(row: Mapping[str, Any], where: Origin) -> Any:
    """The request body of one TorchServe input row (None when there is none).

    Over HTTP the body is under ``body`` (or ``data`` for form posts); over gRPC our API reads
    the JSON object under the input key ``data``. Raises InvalidRequest for a gRPC input map
    without it, since the HTTP wording of that error would mislead.
    """
    body = row.get("body", row.get("data"))
    if body is None and where.grpc:
        keys = sorted(str(key) for key in row)[:8]
        raise InvalidRequest(
            f"over gRPC, put the JSON request under the input key 'data' (got keys {keys})",
            allowed={"input": {"data": "<the JSON object of the HTTP API, as bytes>"}},
            field="input",
        )
    return body


def refusal(where: Origin, stream: bool) -> InvalidRequest | None:
    """The 400 for a valid request that ``where`` cannot carry safely, or None."""
    if where is Origin.GRPC_SEQUENCE:
        return InvalidRequest(
            "StreamPredictions2 is not supported (TorchServe 0.12.0 fails it for models without "
            "sequence batching); use Predictions or StreamPredictions",
            allowed=["Predictions", "StreamPredictions"],
        )
    if where is Origin.GRPC and stream:
        return InvalidRequest(
            "stream: true is not available over gRPC: TorchServe 0.12.0 gives the handler no "
            "way to tell Predictions from StreamPredictions, and a second message on a unary "
            "call takes the worker down. Leave stream out (the reply comes whole) or stream "
            "over HTTP",
            allowed="stream: false over gRPC",
            field="stream",
        )
    return None
