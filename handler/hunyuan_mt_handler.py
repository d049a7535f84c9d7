"""TorchServe entry point for Hunyuan-MT: a thin adapter from TorchServe's batch to the service.

TorchServe imports this module by name and instantiates its one class. All logic lives in the
``hymt_serve`` package that the model archive carries beside this file.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response

from hymt_serve.errors import HTTP_PHRASES
from hymt_serve.service import Outcome, Reply, TranslationService
from hymt_serve.settings import Settings

logger = logging.getLogger(__name__)
JSON, NDJSON = "application/json", "application/x-ndjson"


class HunyuanMTHandler:
    """TorchServe handler: ``initialize`` once per worker, then ``handle`` per batch.

    ``handle(data, context)`` takes TorchServe's list of requests (dicts holding the body under
    ``body`` or ``data``) and returns one JSON string per request, in order, after setting each
    request's HTTP status with ``context.set_response_status``. It raises only if the service was
    never initialised.
    """

    def __init__(self) -> None:
        self.service: TranslationService | None = None
        self.context: Any = None
        self.initialized = False

    def initialize(self, context: Any) -> None:
        """Read the ``handler:`` settings, load the engine, register metrics.

        Raises ConfigurationError (the worker then fails to start with that message).
        """
        from hymt_serve.engine import load_engine
        from hymt_serve.metrics import TorchServeRecorder

        properties = context.system_properties
        raw = (getattr(context, "model_yaml_config", None) or {}).get("handler")
        settings = Settings.from_mapping(raw, model_dir=properties.get("model_dir", "."))
        engine = load_engine(settings, properties.get("gpu_id"))
        recorder = TorchServeRecorder(context.metrics, context.model_name)
        recorder.engine_info(engine.describe())
        self.service = TranslationService(engine, settings, recorder)
        self.context = context
        self.initialized = True
        logger.info("handler ready: %s", json.dumps(self.describe()))

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        self.context = context
        if context.get_request_header(0, "describe") == "True":
            return [json.dumps(self.describe())]
        replies = self.postprocess(self.inference(self.preprocess(data)))
        if len(replies) != len(data):
            raise RuntimeError(f"{len(replies)} replies for a batch of {len(data)} requests")
        return replies

    def preprocess(self, data: list[dict[str, Any]]) -> list[Outcome]:
        """Parse and tokenise each request; a bad one becomes its own error."""
        bodies = [row.get("body", row.get("data")) for row in data]
        logger.debug("batch of %d requests: %s", len(data), data)
        return self._service().prepare(bodies)

    def inference(self, outcomes: list[Outcome]) -> list[Reply]:
        """Generate for every valid request of the batch at once and render the replies."""
        service = self._service()
        generated = service.generate(outcomes, sink=self._send_delta)
        return service.render(outcomes, generated, self._request_ids(len(outcomes)))

    def postprocess(self, replies: list[Reply]) -> list[str]:
        """Set each request's status and content type; JSON strings in request order.

        A streaming request's final chunk is one more JSON line (newline-delimited JSON).
        """
        for index, reply in enumerate(replies):
            self.context.set_response_status(
                reply.status, HTTP_PHRASES.get(reply.status, ""), index
            )
            self.context.set_response_content_type(index, NDJSON if reply.stream else JSON)
        return [
            json.dumps(r.body, ensure_ascii=False) + ("\n" if r.stream else "") for r in replies
        ]

    def _send_delta(self, index: int, delta: str) -> None:
        """Send one streamed text delta to request ``index`` only (HTTP chunked)."""
        request_id = (getattr(self.context, "request_ids", None) or {}).get(index, "")
        self.context.set_response_content_type(index, NDJSON)
        line = json.dumps({"delta": delta, "request_id": request_id}, ensure_ascii=False)
        send_intermediate_predict_response(
            {index: line + "\n"},
            {index: request_id},
            "Intermediate Prediction success",
            200,
            self.context,
        )

    def describe(self) -> dict[str, Any]:
        """The engine's and the settings' facts, for ``GET /models/<name>?customized=true``."""
        service = self._service()
        return {"engine": service.engine.describe(), "settings": service.settings.public()}

    def _request_ids(self, count: int) -> list[str | None]:
        ids = getattr(self.context, "request_ids", None) or {}
        return [ids.get(index) for index in range(count)]

    def _service(self) -> TranslationService:
        if self.service is None:
            raise RuntimeError("the handler was not initialised")
        return self.service
