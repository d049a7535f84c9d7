"""KServe's Open Inference Protocol (v2) against the real stack, driven by KServe's official
Python client (``InferenceRESTClient``, v2): TorchServe's own ``/v2/models/<name>/infer``
answered by our handler, and the web front end's complete v2 API (health, readiness, metadata,
inference forwarded to TorchServe)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import MODEL, REPO
from web_stub import serving

from hymt_serve.ops.launcher import Server
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys

pytestmark = pytest.mark.integration
CLIENT = REPO / ".venv/kserve-client/bin/python"
TEXTS = ["Good morning.", "今天天气很好。"]


def kserve(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results of ``calls`` made by KServe's client (tests/integration/kserve_calls.py)."""
    if not CLIENT.exists():
        subprocess.run(["bash", str(REPO / "scripts/install_kserve_client.sh")], check=True)
    done = subprocess.run(
        [str(CLIENT), str(Path(__file__).with_name("kserve_calls.py"))],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


@pytest.fixture(scope="module")
def web(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The web front end with a fresh client key: (its URL, the key)."""
    keys = ClientKeys.open(tmp_path_factory.mktemp("kserve-keys") / "web_keys.json")
    with serving(create_app(server, client_keys=keys)) as url:
        yield url.rstrip("/"), keys.keys[0].key


def infer(base: str, key: str, **more: Any) -> dict[str, Any]:
    call = {"call": "infer", "base": base, "model": MODEL, "texts": TEXTS}
    call["headers"] = {"Authorization": f"Bearer {key}"}
    call["parameters"] = {"target_lang": "de", "max_new_tokens": 4}
    return {**call, **more}


def test_torchserve_answers_v2_inference(server: Server) -> None:
    base, key = server.inference_url(), server.keys()["inference"]
    plain = requests.post(
        f"{base}/predictions/{MODEL}",
        json={"text": TEXTS, "target_lang": "de", "max_new_tokens": 4},
        headers=server.headers("inference"),
        timeout=60,
    ).json()
    results = kserve(
        [
            infer(base, key, id="call-1"),
            infer(base, key, binary=True, outputs=["translation"]),
            infer(base, key, parameters={"target_lang": "klingon"}),
            infer(base, key, parameters={"target_lang": "de", "stream": True}),
            infer(base, "not-the-key"),
            {"call": "model_ready", "base": base, "model": MODEL},
        ]
    )
    first, binary, language, stream, wrong_key, ready = results
    value = first["value"]
    assert value["id"] == "call-1" and value["model_name"] == MODEL
    assert value["outputs"]["translation"] == [t["text"] for t in plain["translations"]]
    assert value["outputs"]["output_tokens"] == [t["output_tokens"] for t in plain["translations"]]
    assert value["outputs"]["finish_reason"] == ["length", "length"]
    assert value["parameters"]["target_lang"] == "de"
    assert value["parameters"]["output_tokens"] == plain["usage"]["output_tokens"]
    assert list(binary["value"]["outputs"]) == ["translation"]
    assert binary["value"]["outputs"]["translation"] == value["outputs"]["translation"]
    assert language["status"] == 400 and "klingon" in language["error"]
    assert stream["status"] == 400 and "v2 has no streaming" in stream["error"]
    assert wrong_key["status"] == 400  # TorchServe's InvalidKeyException
    # TorchServe 0.12.0 has no v2 model-ready route over REST (404): the front end has one.
    assert ready == {"value": False}


def test_the_front_end_answers_the_whole_v2_api(server: Server, web: tuple[str, str]) -> None:
    base, key = web
    results = kserve(
        [
            {"call": "live", "base": base},
            {"call": "ready", "base": base},
            {"call": "model_ready", "base": base, "model": MODEL},
            {"call": "model_ready", "base": base, "model": "other-model"},
            infer(base, key, binary=True, id="through-web"),
            infer(base, "wrong"),
            infer(base, key, parameters={"target_lang": "de", "top_p": 7}),
        ]
    )
    live, ready, model_ready, other, translated, wrong_key, bad_value = results
    assert live == ready == model_ready == {"value": True}
    assert other == {"value": False}
    assert translated["value"]["id"] == "through-web"
    assert len(translated["value"]["outputs"]["translation"]) == 2
    assert wrong_key["status"] == 401
    assert bad_value["status"] == 400 and "top_p" in bad_value["error"]
    metadata = requests.get(f"{base}/v2/models/{MODEL}", timeout=10).json()
    assert metadata["name"] == MODEL and metadata["versions"]
    assert {"text", "document"} <= {tensor["name"] for tensor in metadata["inputs"]}
    assert requests.get(f"{base}/v2/models/other/ready", timeout=10).status_code == 404


def test_the_front_end_says_not_ready_while_draining(server: Server, web: tuple[str, str]) -> None:
    base, _ = web
    server.drain_marker.write_text("test\n")
    try:
        answer = requests.get(f"{base}/v2/health/ready", timeout=10)
        assert answer.status_code == 503 and answer.json() == {"ready": False}
    finally:
        server.drain_marker.unlink()
    assert requests.get(f"{base}/v2/health/ready", timeout=10).json() == {"ready": True}
