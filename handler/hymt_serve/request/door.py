"""The door: each request TorchServe hands over is decoded once into our request type, and its
reply is encoded once in the protocol it came in.

A request comes as the request API's JSON (or text) over HTTP, as a KServe v2 (Open Inference
Protocol) request on TorchServe's ``/v2`` route (:mod:`hymt_serve.request.oip`), or as a gRPC
message (:mod:`hymt_serve.request.transport` tells the interfaces apart). :func:`decode` turns
each into an :class:`Arrival`: a :class:`TranslationRequest` (or the chat form's
:class:`~hymt_serve.request.chat.ChatRequest`) or the error that refused it, and what its reply
needs. Everything past the door sees the request only. :func:`encode` sets each
reply's status and headers and writes its body: the request API's JSON, a stream's last JSON
line, or a v2 response.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response

from hymt_serve.request import oip
from hymt_serve.request.chat import ChatRequest
from hymt_serve.request.errors import HTTP_PHRASES, ServiceError, as_service_error
from hymt_serve.request.protocol import TranslationRequest
from hymt_serve.request.service import Reply
from hymt_serve.request.transport import STREAM_NEXT_HEADER, Origin, body_of, origin, refusal

logger = logging.getLogger(__name__)
JSON, NDJSON = "application/json", "application/x-ndjson"
HEAVY_BODY_BYTES = 65_536  # async mode: bodies decoded and prepared on a thread of their own
# Async mode: the largest part of a reply written beside TorchServe's sender thread (a Unix
# socket takes a message this size in one piece; see as_last_parts).
PART_BYTES = 16_384

Request = TranslationRequest | ChatRequest
Parse = Callable[[Any], Request]  # the request API's body (either form) -> our request


@dataclass(frozen=True)
class Arrival:
    """One request past the door: our request (or why it was refused) and how to answer it."""

    request: Request | ServiceError
    origin: Origin
    call: oip.Call | None = None  # a v2 request: what its response needs


def decode(rows: Sequence[Mapping[str, Any]], context: Any, parse: Parse) -> list[Arrival]:
    """Each of TorchServe's input rows as an :class:`Arrival`, in order; never raises."""
    logger.debug("batch of %d requests: %s", len(rows), rows)
    return [
        _arrive(row, context.get_all_request_header(index), parse) for index, row in enumerate(rows)
    ]


def _arrive(row: Mapping[str, Any], headers: Mapping[str, Any] | None, parse: Parse) -> Arrival:
    where = origin(headers)
    refused = refusal(where, stream=False)
    if refused is not None:  # StreamPredictions2: no work, and no reply goes back
        return Arrival(refused, where)
    call = None
    try:
        body = body_of(row, where)
        if where is Origin.HTTP:
            body, call = oip.unwrap(body, headers)
        request = parse(body)
    except Exception as error:  # the boundary: one request's failure stays in its slot
        return Arrival(as_service_error(error), where, call)
    return Arrival(refusal(where, request.stream) or request, where, call)


def fail_all(error: BaseException, context: Any, count: int) -> tuple[list[Arrival], list[Reply]]:
    """Every request of a call answered with ``error`` (each with its own request id)."""
    failure = as_service_error(error)
    arrivals = [
        Arrival(failure, origin(context.get_all_request_header(index))) for index in range(count)
    ]
    replies = [Reply(failure.status, failure.body(i)) for i in request_ids(context, count)]
    return arrivals, replies


def heavy(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether decoding and preparing these rows takes long enough (a document: splitting and
    tokenising hundreds of segments) to keep it off the event loop other requests share."""
    for row in rows:
        body = row.get("body", row.get("data"))
        if isinstance(body, dict) and ("document" in body or oip.holds_document(body)):
            return True
        if isinstance(body, (bytes, bytearray, str)) and len(body) > HEAVY_BODY_BYTES:
            return True
    return False


def encode(replies: Sequence[Reply], arrivals: Sequence[Arrival], context: Any) -> list[str]:
    """Set each request's status and content type; its body as a string, in request order.

    A streaming request's final chunk is one more JSON line (newline-delimited JSON). A gRPC
    reply is marked as the last message of its call (TorchServe's StreamPredictions fails the
    call after a reply without that mark); a StreamPredictions2 request gets no reply. A v2
    request's translations come as a v2 response (its errors keep their body).
    """
    answers = []
    for index, (reply, arrival) in enumerate(zip(replies, arrivals, strict=True)):
        context.set_response_status(reply.status, HTTP_PHRASES.get(reply.status, ""), index)
        context.set_response_content_type(index, NDJSON if reply.stream else JSON)
        if arrival.origin.grpc:
            context.set_response_header(index, STREAM_NEXT_HEADER, "false")
        if arrival.origin is Origin.GRPC_SEQUENCE:
            _withhold(context, index)
        body = reply.body
        if arrival.call is not None and reply.status == 200:
            body = arrival.call.response(body, context.model_name)
        answers.append(json.dumps(body, ensure_ascii=False) + ("\n" if reply.stream else ""))
    return answers


def send_event(context: Any, index: int, event: dict[str, Any]) -> None:
    """Send one stream event (a text delta, a document's progress) to request ``index`` only,
    as one JSON line (HTTP chunked)."""
    request_id = (getattr(context, "request_ids", None) or {}).get(index, "")
    context.set_response_content_type(index, NDJSON)
    line = json.dumps({**event, "request_id": request_id}, ensure_ascii=False)
    send_intermediate_predict_response(
        {index: line + "\n"},
        {index: request_id},
        "Intermediate Prediction success",
        200,
        context,
    )


def as_last_parts(answers: Sequence[str], context: Any, origins: Sequence[Origin]) -> list[str]:
    """Async mode: send each plain HTTP answer ahead as a stream's first parts (status,
    headers and body, in parts of at most ``PART_BYTES``) and return what is left for its last
    part: nothing.

    Why: TorchServe 0.12.0's front end forgets an async-mode request only at a stream's last
    part, so a plain reply would stay in its map for good. Parts that small go into the socket
    whole while TorchServe's sender thread writes other replies. gRPC replies, streamed
    requests and errors go as they are (a 400 sent as a stream reaches the client cut off; the
    front-end plugin, ``hymt_serve/ops/frontend_guard``, forgets an error once it is written).
    """
    ids = request_ids(context, len(answers))
    left = []
    for index, (answer, where) in enumerate(zip(answers, origins, strict=True)):
        started = context.get_response_headers(index).get(STREAM_NEXT_HEADER) == "true"
        error = (context.get_response_status(index)[0] or 200) >= 400
        if where is not Origin.HTTP or started or error:
            left.append(answer)
            continue
        encoded = answer.encode("utf-8")
        for offset in range(0, max(len(encoded), 1), PART_BYTES):
            send_intermediate_predict_response(
                {index: encoded[offset : offset + PART_BYTES]},
                {index: ids[index]},
                "Prediction success",
                200,
                context,
            )
        left.append("")
    return left


def request_ids(context: Any, count: int) -> list[str | None]:
    """TorchServe's id of each request of the call, in order."""
    ids = getattr(context, "request_ids", None) or {}
    return [ids.get(index) for index in range(count)]


def _withhold(context: Any, index: int) -> None:
    """Send no reply for request ``index``: TorchServe's worker writes one reply for each index
    left in ``context.request_ids`` (the very dict it encodes the answer from), and its front end
    then forgets the request. Only for StreamPredictions2 (see hymt_serve.request.transport)."""
    request_id = context.request_ids.pop(index, None)
    logger.warning("request %s came over gRPC StreamPredictions2: refused, no reply", request_id)
