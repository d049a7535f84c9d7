"""The web front end: serves the page and forwards translations to TorchServe.

The TorchServe inference key stays on this server (read from the key file at each call, so a
renewed key is picked up); the browser never sees it. ``/api/translate`` is a proxy of the
request API: the JSON object the browser sent is forwarded whole, so TorchServe's and the
handler's own answers (errors included) reach the browser. A single text is streamed unless the
client says otherwise: the page receives TorchServe's newline-delimited JSON as it is generated.

Who may call what (``ALWAYS_OPEN``, ``OWN_KEYS``): the page itself and the health probes are
open. The LibreTranslate, DeepL and v2 inference APIs always ask for a client key (each in its
API's own way). Everything else (the page's ``/api/*``, the language and model lists) is open
when the front end listens on loopback only, and asks for a client key (``Authorization:
Bearer <key>``, characters counted against its limit) when ``require_keys`` (``hymt web`` sets
it for any other address). Every call to TorchServe holds an upstream slot, and each client
key's requests in progress are bounded (:mod:`.fairness`).
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from flask import Flask, Response, g, jsonify, request

from hymt_serve.ops.launcher import Server, handler_description
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.web.compat import add_compat_routes
from hymt_serve.web.deepl_documents import DocumentJobs, add_document_routes
from hymt_serve.web.fairness import Busy, KeyLimits, Upstream
from hymt_serve.web.keys import ClientKey, ClientKeys, bearer
from hymt_serve.web.oip_routes import add_oip_routes
from hymt_serve.web.refine import refine
from hymt_serve.web.torchserve import forward, json_response, poster, queue_size, relay_bytes

DEFAULT_MAX_CHARS = 4000
DEFAULT_MAX_DOCUMENT_BYTES = 1_048_576
DEFAULT_MAX_TEXTS = 16
# The family features the page has controls for.
PAGE_FEATURES = (
    "glossary",
    "context",
    "preserve_format",
    "style",
    "preferences",
    "delimiters",
    "data_format",
)
# Open whoever asks: the page and its files, and the probes (a kubelet sends no key).
ALWAYS_OPEN = frozenset({"page", "favicon", "static", "live", "server_ready", "model_ready"})
# Routes that check their API's own client key whatever the address (LibreTranslate, DeepL, v2).
OWN_KEYS = frozenset(
    {
        "libre_translate",
        "libre_detect",
        "deepl_translate",
        "deepl_languages",
        "deepl_usage",
        "deepl_upload",
        "deepl_document_status",
        "deepl_document_result",
        "infer",
    }
)
QUOTA_REACHED = {
    "error": "the character limit of this key is reached",
    "error_type": "quota_exceeded",
}
NEEDS_KEY = {
    "error": "this server needs a client key: send 'Authorization: Bearer <key>' "
    "(a key of hymt web's key file)",
    "error_type": "unauthorized",
}


class QuotaReached(Exception):
    """The client key's character limit would be passed (429 ``quota_exceeded``)."""


def create_app(
    server: Server,
    model: str = "hunyuan-mt",
    refine_model: str | None = None,
    client_keys: ClientKeys | None = None,
    *,
    require_keys: bool = False,
    upstream: Upstream | None = None,
    limits: KeyLimits | None = None,
) -> Flask:
    """The Flask app for the page of TorchServe ``server`` serving ``model`` (and, for
    ``/api/refine``, the Hunyuan-MT-Chimera model named ``refine_model``); with
    ``client_keys``, also the LibreTranslate and DeepL compatible APIs (:mod:`.compat`).
    ``require_keys``: every route but ``ALWAYS_OPEN`` needs a client key (``client_keys``
    required then)."""
    if require_keys and client_keys is None:
        raise ValueError("require_keys needs client_keys")
    app = Flask(__name__, static_folder="static", static_url_path="/static")
    predictions = f"{server.inference_url()}/predictions/{model}"
    upstream = upstream or Upstream(functools.partial(queue_size, server, model))
    limits = limits or KeyLimits()
    post = poster(server, upstream)
    if client_keys is not None:
        known: dict[str, int] = {}

        def max_texts() -> int:
            """The handler's texts per request (read once it answers; 16 until then)."""
            if "max_texts" not in known:
                settings = handler_description(server, model).get("settings")
                if isinstance(settings, dict) and "max_texts_per_request" in settings:
                    known["max_texts"] = int(settings["max_texts_per_request"])
            return known.get("max_texts", DEFAULT_MAX_TEXTS)

        add_compat_routes(app, post, model, client_keys, max_texts, limits)
        jobs = DocumentJobs(post, model, client_keys)
        add_document_routes(app, jobs, client_keys)
        relay = functools.partial(relay_bytes, server, upstream)
        add_oip_routes(app, server, model, client_keys, relay, limits)

    @app.before_request
    def check_key() -> Any:
        """Where keys are required, the key of every request outside the open routes."""
        g.client_key = None
        endpoint = request.endpoint or ""
        if not require_keys or endpoint in ALWAYS_OPEN or endpoint in OWN_KEYS:
            return None
        assert client_keys is not None  # checked above: require_keys needs them
        g.client_key = client_keys.find(bearer(request.headers.get("Authorization", "")))
        if g.client_key is None:
            return json_response(NEEDS_KEY, 401)
        return None

    @app.errorhandler(QuotaReached)
    def quota_reached(_error: QuotaReached) -> Response:
        return json_response(QUOTA_REACHED, 429)

    @app.errorhandler(Busy)
    def busy(error: Busy) -> Response:
        response = json_response(error.body(), error.status)
        response.headers["Retry-After"] = str(error.retry_after)
        return response

    @app.get("/")
    def page() -> Any:
        return app.send_static_file("index.html")

    @app.get("/favicon.ico", endpoint="favicon")
    def favicon() -> Any:
        # Browsers ask for /favicon.ico whatever the page links; the SVG serves both.
        return app.send_static_file("favicon.svg")

    @app.get("/api/config")
    def config() -> Any:
        languages = [
            {"code": lang.code, "english": lang.english, "chinese": lang.chinese}
            for lang in LANGUAGES.values()
        ]
        described = handler_description(server, model)
        return jsonify(
            languages=languages,
            max_chars=_setting(described, "max_chars_per_text", DEFAULT_MAX_CHARS),
            max_document_bytes=_setting(
                described, "max_document_bytes", DEFAULT_MAX_DOCUMENT_BYTES
            ),
            demo_model=_demo_model(described),
            model=model,
            family=_family(described),
            features=_features(described),
            refine=refine_model is not None,
        )

    @app.post("/api/translate")
    def translate() -> Any:
        body = _json_object()
        if body is None:
            return jsonify(
                error="send a JSON object with the header 'Content-Type: application/json'",
                error_type="invalid_request",
            ), 400
        key: ClientKey | None = g.client_key
        with _held(limits, key), _counted(client_keys, key, _characters(body)) as outcome:
            answer = forward(server, upstream, predictions, _with_default_stream(body))
            outcome.append(answer.status_code)
            return answer

    @app.post("/api/refine")
    def refine_translation() -> Any:
        """Candidates from the translation model, refined by Chimera (:mod:`.refine`)."""
        if refine_model is None:
            return jsonify(
                error="refinement is not enabled: start hymt web with --refine-model NAME",
                error_type="not_found",
            ), 404
        body = _json_object()
        if body is None:
            return jsonify(
                error="send a JSON object with the header 'Content-Type: application/json'",
                error_type="invalid_request",
            ), 400
        key: ClientKey | None = g.client_key
        with _held(limits, key), _counted(client_keys, key, _characters(body)) as outcome:
            status, answer = refine(body, post, model, refine_model)
            outcome.append(status)
        return jsonify(answer), status

    return app


def is_loopback(host: str) -> bool:
    """Whether ``host`` (hymt web's --host) listens on this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def _with_default_stream(body: dict[str, Any]) -> dict[str, Any]:
    """The browser's request ``body`` as it goes to TorchServe: unchanged, except that a single
    text streams when the client did not choose (``"stream": true`` added)."""
    if "stream" not in body and isinstance(body.get("text"), str):
        return {**body, "stream": True}
    return body


def _json_object() -> dict[str, Any] | None:
    """The request's JSON object, or None when the body is not one."""
    if not request.is_json:
        return None
    try:
        body = json.loads(request.get_data())
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def _held(limits: KeyLimits, key: ClientKey | None) -> AbstractContextManager[None]:
    """One request in progress for ``key`` (nothing counted without a key: on loopback the
    front end cannot tell its clients apart)."""
    return limits.hold(f"key:{key.name}") if key is not None else nullcontext()


@contextmanager
def _counted(
    keys: ClientKeys | None, key: ClientKey | None, characters: int
) -> Iterator[list[int]]:
    """Count ``characters`` against ``key`` (QuotaReached past its limit); given back
    unless the block appends a 200 to the list it gets. Nothing counted without a key."""
    outcome: list[int] = []
    if key is None or keys is None:
        yield outcome
        return
    if not keys.reserve(key, characters):
        raise QuotaReached()
    try:
        yield outcome
    finally:
        if outcome != [200]:
            keys.refund(key, characters)


def _characters(body: dict[str, Any]) -> int:
    """The characters a request API body asks to translate (its texts and its document)."""
    text, document = body.get("text"), body.get("document")
    texts = [text] if isinstance(text, str) else text if isinstance(text, list) else []
    count = sum(len(item) for item in texts if isinstance(item, str))
    return count + (len(document) if isinstance(document, str) else 0)


def _setting(described: dict[str, Any], name: str, default: int) -> int:
    """A limit from the handler's settings in ``described``, or ``default``."""
    try:
        return int(described["settings"][name])
    except (KeyError, TypeError, ValueError):
        return default


def _family(described: dict[str, Any]) -> str | None:
    """The loaded model family's name ("HY-MT1.5", ...) from ``described``; None when unknown."""
    family = described.get("model_family")
    title = family.get("model_family") if isinstance(family, dict) else None
    return title if isinstance(title, str) else None


def _features(described: dict[str, Any]) -> list[str]:
    """The request fields beyond the basics that the loaded model family supports and the page
    offers (PAGE_FEATURES), from ``described``; none when unknown."""
    family = described.get("model_family")
    features = family.get("features") if isinstance(family, dict) else None
    if not isinstance(features, list):
        return []
    return [name for name in features if name in PAGE_FEATURES]


def _demo_model(described: dict[str, Any]) -> bool:
    """Whether ``described`` says the engine serves the random-weight demo model (False when
    unknown)."""
    engine = described.get("engine")
    return isinstance(engine, dict) and engine.get("random_weights") is True
