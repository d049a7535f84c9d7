"""TorchServe entry point for Hunyuan-MT: a thin adapter from TorchServe's batch to the service.

TorchServe imports this module by name and instantiates its one class. All logic lives in the
``hymt_serve`` package that the model archive carries beside this file: requests are decoded
and replies encoded at :mod:`hymt_serve.request.door`, the work is done by
:class:`~hymt_serve.request.service.TranslationService`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from functools import partial
from typing import Any

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.request import detect, door
from hymt_serve.request.async_guards import cheap_context_copies, drop_entry_point_prints
from hymt_serve.request.errors import Overloaded
from hymt_serve.request.memory_rows import open_memory, precision_of
from hymt_serve.request.metrics import TorchServeRecorder
from hymt_serve.request.service import Outcome, Reply, TranslationService

logger = logging.getLogger(__name__)
DESCRIBE_TIMEOUT_S = 30.0  # async mode: how long a describe call waits for the engine process


class HunyuanMTHandler:
    """TorchServe handler: ``initialize`` once per worker, then ``handle`` per batch.

    ``handle(data, context)`` takes TorchServe's list of requests (dicts holding the body under
    ``body`` or ``data``) and returns one string per request, in order, after setting each
    request's HTTP status with ``context.set_response_status``. It raises only if the service was
    never initialised.

    With ``asyncCommunication: true`` in model-config.yaml (TorchServe's async mode) ``handle``
    returns a coroutine instead: TorchServe awaits one per request as soon as it arrives, and
    the engine's scheduler batches the rows of all requests in flight. That coroutine never
    raises: in async mode an exception would fail every request in flight, so failures become
    per-request replies.
    """

    def __init__(self) -> None:
        self.service: TranslationService | None = None
        self.context: Any = None
        self.async_mode = False
        self.initialized = False
        self.arrivals: list[door.Arrival] = []  # the batch being handled (batch mode)

    def initialize(self, context: Any) -> None:
        """Read the ``handler:`` settings, load the engine, register metrics.

        Raises ConfigurationError (the worker then fails to start with that message).
        """
        settings = self.settings_for(context)
        settings = settings.with_cpu_threads(_engines(context, settings))
        self.async_mode = _async_mode(context)
        engine = _load_engine(context, settings, self.async_mode)
        if settings.checks.target_language_check != "off":
            detect.preload()  # the language check's identifier, so that no request waits for it
        recorder = TorchServeRecorder(context.metrics, context.model_name, coalesce=self.async_mode)
        described = engine.describe()
        recorder.engine_info(described)
        memory = open_memory(settings, context.model_name, precision_of(settings, described))
        self.service = TranslationService(engine, settings, recorder, memory)
        self.context = context
        self.initialized = True
        logger.info("handler ready: %s", json.dumps(self.describe()))

    def settings_for(self, context: Any) -> Settings:
        """The settings of model-config.yaml's ``handler:`` section (a subclass may add to them:
        the tests' fault injection does). Raises ConfigurationError."""
        raw = (getattr(context, "model_yaml_config", None) or {}).get("handler")
        model_dir = context.system_properties.get("model_dir", ".")
        return Settings.from_mapping(raw, model_dir=model_dir)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str] | Awaitable[list[str]]:
        if self.async_mode:
            return self._handle_async(data, context)
        self.context = context
        if _describing(context):
            return [json.dumps(self.describe())]
        replies = self.postprocess(self.inference(self.preprocess(data)))
        if len(replies) != len(data):
            raise RuntimeError(f"{len(replies)} replies for a batch of {len(data)} requests")
        return replies

    def preprocess(self, data: list[dict[str, Any]]) -> list[Outcome]:
        """Decode each request at the door and tokenise it; a bad one becomes its own error."""
        service = self._service()
        self.arrivals = door.decode(data, self.context, service.parse)
        return service.prepare([arrival.request for arrival in self.arrivals])

    def inference(self, outcomes: list[Outcome]) -> list[Reply]:
        """Generate for every valid request of the batch at once and render the replies."""
        service = self._service()
        generated = service.generate(outcomes, sink=partial(door.send_event, self.context))
        return service.render(outcomes, generated, door.request_ids(self.context, len(outcomes)))

    def postprocess(self, replies: list[Reply]) -> list[str]:
        """Each reply encoded in the protocol its request came in, in request order."""
        return door.encode(replies, self.arrivals, self.context)

    async def _handle_async(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        """One request (TorchServe's async mode); ``context`` belongs to this call only."""
        service = self._service()
        describing = _describing(context)
        try:
            if describing:
                return [json.dumps(await self._describe_async())]
            if door.heavy(data):  # a document: split and tokenised off the event loop
                arrivals, outcomes = await asyncio.to_thread(self._prepare, data, context)
            else:
                arrivals, outcomes = self._prepare(data, context)
            sink = partial(door.send_event, context)
            generated = await service.generate_async(outcomes, sink=sink)
            replies = service.render(outcomes, generated, door.request_ids(context, len(data)))
        except Exception as exc:  # never raise here: TorchServe would fail every request
            arrivals, replies = door.fail_all(exc, context, len(data))
        answers = door.encode(replies, arrivals, context)
        # the management API's describe call is one reply (TorchServe answers it another way)
        origins = [arrival.origin for arrival in arrivals]
        return answers if describing else door.as_last_parts(answers, context, origins)

    def _prepare(
        self, data: list[dict[str, Any]], context: Any
    ) -> tuple[list[door.Arrival], list[Outcome]]:
        service = self._service()
        arrivals = door.decode(data, context, service.parse)
        return arrivals, service.prepare([arrival.request for arrival in arrivals])

    async def _describe_async(self) -> dict[str, Any]:
        """:meth:`describe` without blocking the event loop: the engine process answers while
        other requests go on."""
        from hymt_serve.engine.process.private import EngineClient  # loads torch: async only

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
            "memory": service.memory.describe(),
        }

    def describe(self) -> dict[str, Any]:
        """The engine's and the settings' facts, for ``GET /models/<name>?customized=true``."""
        service = self._service()
        return {
            "engine": service.engine.describe(),
            "model_family": service.profile.describe(),
            "settings": service.settings.public(),
            "memory": service.memory.describe(),
        }

    def _service(self) -> TranslationService:
        if self.service is None:
            raise RuntimeError("the handler was not initialised")
        return self.service


def _load_engine(context: Any, settings: Settings, async_mode: bool) -> Any:
    """The engine: in a child process of its own in async mode (away from this process's GIL),
    else in this process, stepping on the thread that handles a batch."""
    # Imported here, not at the top: the engine loads torch and transformers, which only a
    # starting worker needs.
    from hymt_serve.engine.engine import load_engine
    from hymt_serve.engine.process.private import EngineClient

    gpu_id = context.system_properties.get("gpu_id")
    if async_mode:
        cheap_context_copies(context)  # TorchServe deep-copies it for every request
        drop_entry_point_prints()  # and prints a debug line for every request
        return EngineClient(settings, gpu_id, settings.serving.max_waiting_rows)
    if settings.serving.share_engine:
        raise ConfigurationError(
            "share_engine: true shares the async mode's engine process; set "
            "asyncCommunication: true (and batchSize: 1), or leave share_engine false"
        )
    return load_engine(settings, gpu_id)


def _describing(context: Any) -> bool:
    """Whether this call is the management API's describe call (``?customized=true``)."""
    return bool(context.get_request_header(0, "describe") == "True")


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
    if settings.serving.share_engine:
        return 1
    config = getattr(context, "model_yaml_config", None) or {}
    counts = [config.get(key) for key in ("minWorkers", "maxWorkers")]
    return max((n for n in counts if type(n) is int and n > 0), default=1)
