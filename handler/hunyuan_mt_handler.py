"""TorchServe entry point for Hunyuan-MT: a thin adapter from TorchServe's batch to the service.

TorchServe imports this module by name and instantiates its one class. All logic lives in the
``hymt_serve`` package that the model archive carries beside this file.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from functools import partial
from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response

from hymt_serve.core.settings import Settings
from hymt_serve.request import oip
from hymt_serve.request.errors import (
    HTTP_PHRASES,
    ConfigurationError,
    Overloaded,
    ServiceError,
    as_service_error,
)
from hymt_serve.request.service import Outcome, Prepared, Reply, TranslationService
from hymt_serve.request.transport import STREAM_NEXT_HEADER, Origin, body_of, origin, refusal

logger = logging.getLogger(__name__)
JSON, NDJSON = "application/json", "application/x-ndjson"
DESCRIBE_TIMEOUT_S = 30.0  # async mode: how long a describe call waits for the engine process
HEAVY_BODY_BYTES = 65_536  # async mode: bodies prepared on a thread of their own
# Async mode: the largest part of a reply written beside TorchServe's sender thread (a Unix
# socket takes a message this size in one piece; see _as_last_parts).
PART_BYTES = 16_384


class HunyuanMTHandler:
    """TorchServe handler: ``initialize`` once per worker, then ``handle`` per batch.

    ``handle(data, context)`` takes TorchServe's list of requests (dicts holding the body under
    ``body`` or ``data``) and returns one JSON string per request, in order, after setting each
    request's HTTP status with ``context.set_response_status``. It raises only if the service was
    never initialised.

    With ``asyncCommunication: true`` in model-config.yaml (TorchServe's async mode, the GPU
    profile) ``handle`` returns a coroutine instead: TorchServe awaits one per request as soon
    as it arrives, and the engine's scheduler batches the rows of all requests in flight
    (continuous batching on the fast engine). That coroutine never raises: in async mode an
    exception would fail every request in flight, so failures become per-request replies.
    """

    def __init__(self) -> None:
        self.service: TranslationService | None = None
        self.context: Any = None
        self.async_mode = False
        self.initialized = False
        self.origins: list[Origin] = []  # of the batch being handled (batch mode)
        self.calls: list[oip.Call | None] = []  # its v2 (Open Inference Protocol) requests

    def initialize(self, context: Any) -> None:
        """Read the ``handler:`` settings, load the engine, register metrics.

        Raises ConfigurationError (the worker then fails to start with that message).
        """
        from hymt_serve.engine.engine import load_engine
        from hymt_serve.request.metrics import TorchServeRecorder

        properties = context.system_properties
        raw = (getattr(context, "model_yaml_config", None) or {}).get("handler")
        settings = Settings.from_mapping(raw, model_dir=properties.get("model_dir", "."))
        settings = settings.with_cpu_threads(_engines(context, settings))
        self.async_mode = _async_mode(context)
        engine: Any
        if self.async_mode:  # the model runs in a child process, away from this one's GIL
            from hymt_serve.engine.process.private import EngineClient
            from hymt_serve.request.async_guards import (
                cheap_context_copies,
                drop_entry_point_prints,
            )

            cheap_context_copies(context)  # TorchServe deep-copies it for every request
            drop_entry_point_prints()  # and prints a debug line for every request
            engine = EngineClient(settings, properties.get("gpu_id"), settings.max_waiting_rows)
        elif settings.share_engine:
            raise ConfigurationError(
                "share_engine: true shares the async mode's engine process; set "
                "asyncCommunication: true (and batchSize: 1), or leave share_engine false"
            )
        else:  # the engine steps on this thread while a batch is handled
            engine = load_engine(settings, properties.get("gpu_id"))
        recorder = TorchServeRecorder(context.metrics, context.model_name, coalesce=self.async_mode)
        recorder.engine_info(engine.describe())
        self.service = TranslationService(engine, settings, recorder)
        self.context = context
        self.initialized = True
        logger.info("handler ready: %s", json.dumps(self.describe()))

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str] | Awaitable[list[str]]:
        if self.async_mode:
            return self._handle_async(data, context)
        self.context = context
        if context.get_request_header(0, "describe") == "True":
            return [json.dumps(self.describe())]
        self.origins = _origins(context, len(data))
        replies = self.postprocess(self.inference(self.preprocess(data)))
        if len(replies) != len(data):
            raise RuntimeError(f"{len(replies)} replies for a batch of {len(data)} requests")
        return replies

    async def _handle_async(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        """One request (TorchServe's async mode); ``context`` belongs to this call only."""
        service = self._service()
        calls: list[oip.Call | None] = [None] * len(data)
        describing = context.get_request_header(0, "describe") == "True"
        try:
            if describing:
                return [json.dumps(await self._describe_async())]
            origins = _origins(context, len(data))
            if _heavy(data):  # a document: split and tokenised off the event loop
                outcomes, calls = await asyncio.to_thread(self._prepare, data, origins, context)
            else:
                outcomes, calls = self._prepare(data, origins, context)
            sink = partial(_send_event, context)
            generated = await service.generate_async(outcomes, sink=sink)
            replies = service.render(outcomes, generated, _request_ids(context, len(data)))
        except Exception as exc:  # never raise here: TorchServe would fail every request
            error = as_service_error(exc)
            ids = _request_ids(context, len(data))
            replies = [Reply(error.status, error.body(i)) for i in ids]
            origins = _origins(context, len(data))
        answers = _respond(replies, context, origins, calls)
        # the management API's describe call is one reply (TorchServe answers it another way)
        return answers if describing else _as_last_parts(answers, context, origins)

    def preprocess(self, data: list[dict[str, Any]]) -> list[Outcome]:
        """Parse and tokenise each request; a bad one becomes its own error."""
        outcomes, self.calls = self._prepare(data, self.origins, self.context)
        return outcomes

    def _prepare(
        self, data: list[dict[str, Any]], origins: list[Origin], context: Any
    ) -> tuple[list[Outcome], list[oip.Call | None]]:
        """Each request's outcome, and for a v2 request what its response needs."""
        logger.debug("batch of %d requests: %s", len(data), data)
        bodies, calls = [], []
        for index, (row, where) in enumerate(zip(data, origins, strict=True)):
            body, call = _body(row, where, context.get_all_request_header(index))
            bodies.append(body)
            calls.append(call)
        outcomes = self._service().prepare(bodies)
        fitted = [_fit(outcome, where) for outcome, where in zip(outcomes, origins, strict=True)]
        return fitted, calls

    def inference(self, outcomes: list[Outcome]) -> list[Reply]:
        """Generate for every valid request of the batch at once and render the replies."""
        service = self._service()
        generated = service.generate(outcomes, sink=self._send_event)
        return service.render(outcomes, generated, self._request_ids(len(outcomes)))

    def postprocess(self, replies: list[Reply]) -> list[str]:
        """Set each request's status and content type; JSON strings in request order."""
        return _respond(replies, self.context, self.origins, self.calls)

    async def _describe_async(self) -> dict[str, Any]:
        """:meth:`describe` without blocking the event loop: the engine process answers while
        other requests go on."""
        from hymt_serve.engine.process.private import EngineClient

        service = self._service()
        engine = service.engine
        assert isinstance(engine, EngineClient)  # async mode runs the engine in its process
        try:
            facts = await asyncio.wait_for(
                asyncio.wrap_future(engine.describe_later()), DESCRIBE_TIMEOUT_S
            )
        except TimeoutError:
            raise Overloaded(
                f"the engine process did not answer in {DESCRIBE_TIMEOUT_S:g} s",
                allowed="retry later",
            ) from None
        return {
            "engine": engine.with_process(facts),
            "model_family": service.profile.describe(),
            "settings": service.settings.public(),
        }

    def _send_event(self, index: int, event: dict[str, Any]) -> None:
        _send_event(self.context, index, event)

    def describe(self) -> dict[str, Any]:
        """The engine's and the settings' facts, for ``GET /models/<name>?customized=true``."""
        service = self._service()
        return {
            "engine": service.engine.describe(),
            "model_family": service.profile.describe(),
            "settings": service.settings.public(),
        }

    def _request_ids(self, count: int) -> list[str | None]:
        return _request_ids(self.context, count)

    def _service(self) -> TranslationService:
        if self.service is None:
            raise RuntimeError("the handler was not initialised")
        return self.service


def _async_mode(context: Any) -> bool:
    """Whether TorchServe runs this worker in async mode; it then needs ``batchSize: 1``."""
    config = getattr(context, "model_yaml_config", None) or {}
    if config.get("asyncCommunication") is not True:
        return False
    batch_size = int(context.system_properties.get("batch_size") or 1)
    if batch_size != 1:
        raise ConfigurationError(
            f"asyncCommunication: true needs batchSize: 1, got {batch_size}: the engine batches "
            "requests itself, and TorchServe 0.12.0 loses the worker when its async mode hands "
            "over several requests at once"
        )
    return True


def _engines(context: Any, settings: Settings) -> int:
    """How many engines this model may run on this host: one per worker (the larger of
    minWorkers and maxWorkers; workers added through the management API beyond them are not
    counted), or one when the workers share it."""
    if settings.share_engine:
        return 1
    config = getattr(context, "model_yaml_config", None) or {}
    counts = [config.get(key) for key in ("minWorkers", "maxWorkers")]
    return max((n for n in counts if type(n) is int and n > 0), default=1)


def _heavy(data: list[dict[str, Any]]) -> bool:
    """Whether preparing these requests takes long enough (a document: splitting and
    tokenising hundreds of segments) to keep it off the event loop other requests share."""
    for row in data:
        body = row.get("body", row.get("data"))
        if isinstance(body, dict) and ("document" in body or oip.holds_document(body)):
            return True
        if isinstance(body, (bytes, bytearray, str)) and len(body) > HEAVY_BODY_BYTES:
            return True
    return False


def _origins(context: Any, count: int) -> list[Origin]:
    return [origin(context.get_all_request_header(index)) for index in range(count)]


def _body(row: dict[str, Any], where: Origin, headers: Any) -> tuple[Any, oip.Call | None]:
    """The request API's body of one request (a ServiceError when it has none), and for a v2
    request (Open Inference Protocol, HTTP only) what its response needs."""
    try:
        body = body_of(row, where)
        return oip.unwrap(body, headers) if where is Origin.HTTP else (body, None)
    except ServiceError as error:
        return error, None


def _fit(outcome: Outcome, where: Origin) -> Outcome:
    """A valid request that its interface cannot carry safely becomes its own 400."""
    if isinstance(outcome, Prepared):
        return refusal(where, outcome.request.stream) or outcome
    return outcome


def _respond(
    replies: list[Reply],
    context: Any,
    origins: list[Origin],
    calls: list[oip.Call | None],
) -> list[str]:
    """Set each request's status and content type; JSON strings in request order.

    A streaming request's final chunk is one more JSON line (newline-delimited JSON). A gRPC
    reply is marked as the last message of its call (TorchServe's StreamPredictions fails the
    call after a reply without that mark); a StreamPredictions2 request gets no reply. A v2
    request's translations come as a v2 response (its errors keep their body).
    """
    answers = []
    for index, (reply, where, call) in enumerate(zip(replies, origins, calls, strict=True)):
        context.set_response_status(reply.status, HTTP_PHRASES.get(reply.status, ""), index)
        context.set_response_content_type(index, NDJSON if reply.stream else JSON)
        if where.grpc:
            context.set_response_header(index, STREAM_NEXT_HEADER, "false")
        if where is Origin.GRPC_SEQUENCE:
            _withhold(context, index)
        body = reply.body
        if call is not None and reply.status == 200:
            body = call.response(body, context.model_name)
        answers.append(json.dumps(body, ensure_ascii=False) + ("\n" if reply.stream else ""))
    return answers


def _as_last_parts(answers: list[str], context: Any, origins: list[Origin]) -> list[str]:
    """Async mode: send each HTTP answer that is not part of a stream yet as a stream's first
    parts, and return what is left for its last part (nothing).

    TorchServe 0.12.0's front end keeps each request it hands to an async-mode worker in a map,
    and takes it out only at a reply marked as a stream's last part (``ts_stream_next:
    false``). So every plain reply stayed there for good: 4.0 KB of the front end's heap per
    request, and a map that keeps resizing while another thread reads it
    (benchmarks/serving/frontend_jobs/). A single reply marked as a last part does not work:
    the front end sends a stream's status line with its first part. So the answer goes out
    first, with its status, content type and headers; the final, empty reply is then the
    stream's last part, which TorchServe marks itself. The client gets the same status,
    headers and body, in chunked transfer encoding.

    The first parts are written from this event loop while TorchServe's sender thread writes
    other replies to the same socket. A message the kernel takes in one piece cannot be split
    by another writer, so the answer goes in parts of at most ``PART_BYTES``; every last part
    is empty. gRPC replies are marked as last parts already (:func:`_respond`), and a streamed
    HTTP request's deltas were its first parts. An error reply goes as it is: sent as a stream,
    a 400 reached the client cut off (the front end reset the connection after its first
    part); our front-end plugin takes it out of the map once it is written
    (hymt_serve/ops/frontend_guard)."""
    ids = _request_ids(context, len(answers))
    left = []
    for index, (answer, where) in enumerate(zip(answers, origins, strict=True)):
        started = context.get_response_headers(index).get(STREAM_NEXT_HEADER) == "true"
        failed = (context.get_response_status(index)[0] or 200) >= 400
        if where is not Origin.HTTP or started or failed:
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


def _withhold(context: Any, index: int) -> None:
    """Send no reply for request ``index``: TorchServe's worker writes one reply for each index
    left in ``context.request_ids`` (the very dict it encodes the answer from), and its front end
    then forgets the request. Only for StreamPredictions2 (see hymt_serve.request.transport)."""
    request_id = context.request_ids.pop(index, None)
    logger.warning("request %s came over gRPC StreamPredictions2: refused, no reply", request_id)


def _send_event(context: Any, index: int, event: dict[str, Any]) -> None:
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


def _request_ids(context: Any, count: int) -> list[str | None]:
    ids = getattr(context, "request_ids", None) or {}
    return [ids.get(index) for index in range(count)]
