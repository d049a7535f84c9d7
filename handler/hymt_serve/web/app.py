"""The web front end: serves the page and forwards translations to TorchServe.

The TorchServe inference key stays on this server (read from the key file at each call, so a
renewed key is picked up); the browser never sees it. Translations are always streamed: the
page receives TorchServe's newline-delimited JSON as it is generated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import requests
from flask import Flask, Response, jsonify, request

from ..languages import LANGUAGES
from ..launcher import Server

DEFAULT_MAX_CHARS = 4000
TORCHSERVE_TYPES = {400: "invalid_request", 413: "payload_too_large", 503: "server_busy"}


def create_app(server: Server, model: str = "hunyuan-mt") -> Flask:
    """The Flask app for the page of TorchServe ``server`` serving ``model``."""
    app = Flask(__name__, static_folder="static", static_url_path="/static")
    predictions = f"{server.inference_url()}/predictions/{model}"

    @app.get("/")
    def page() -> Any:
        return app.send_static_file("index.html")

    @app.get("/api/config")
    def config() -> Any:
        languages = [
            {"code": lang.code, "english": lang.english, "chinese": lang.chinese}
            for lang in LANGUAGES.values()
        ]
        return jsonify(languages=languages, max_chars=_max_chars(server, model), model=model)

    @app.post("/api/translate")
    def translate() -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            return jsonify(error="send a JSON object", error_type="invalid_request"), 400
        payload = {key: body[key] for key in ("text", "source_lang", "target_lang") if key in body}
        try:
            upstream = requests.post(
                predictions,
                json={**payload, "stream": True},
                headers=server.headers("inference"),
                stream=True,
                timeout=(5, 600),
            )
        except requests.RequestException:
            return jsonify(
                error="the translation server cannot be reached", error_type="server_unavailable"
            ), 502
        if upstream.status_code != 200:
            return _error_from(upstream)
        return Response(_relay(upstream), mimetype="application/x-ndjson")

    return app


def _relay(upstream: requests.Response) -> Iterator[bytes]:
    try:
        yield from upstream.iter_content(chunk_size=None)
    finally:
        upstream.close()


def _error_from(upstream: requests.Response) -> tuple[Any, int]:
    """Our JSON errors pass through; TorchServe's own ({code, type, message}) are mapped."""
    status = upstream.status_code
    try:
        body = upstream.json()
    except ValueError:
        body = {}
    if "error_type" not in body:
        body = {
            "error": body.get("message") or f"HTTP {status}",
            "error_type": TORCHSERVE_TYPES.get(status, "server_error"),
        }
    return jsonify(body), status


def _max_chars(server: Server, model: str) -> int:
    """The character limit from the handler's settings (describe API), or the default."""
    try:
        described = requests.get(
            f"{server.management_url()}/models/{model}?customized=true",
            headers=server.headers("management"),
            timeout=10,
        ).json()
        metadata = described[0]["customizedMetadata"]
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        return int(metadata["settings"]["max_chars_per_text"])
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
        return DEFAULT_MAX_CHARS
