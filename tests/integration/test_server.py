"""Against a real TorchServe with the tiny model: inference, batching, management, metrics."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from typing import Any

import pytest
import requests
from conftest import WRONG, refused

from hymt_serve.ops.launcher import Server, model_status, model_workers

pytestmark = pytest.mark.integration
MODEL = "hunyuan-mt"


def predict(server: Server, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(
        f"{server.inference_url()}/predictions/{MODEL}",
        json=body,
        headers=server.headers("inference"),
        timeout=120,
        **kwargs,
    )


def test_ping_needs_the_token(server: Server) -> None:
    ok = requests.get(
        f"{server.inference_url()}/ping", headers=server.headers("inference"), timeout=10
    )
    assert ok.status_code == 200 and ok.json()["status"] == "Healthy"
    assert refused(requests.get(f"{server.inference_url()}/ping", timeout=10))


def test_single_text(server: Server) -> None:
    response = predict(server, {"text": "你好，世界。", "target_lang": "en"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body["translation"], str)
    assert body["target_lang"] == "en" and body["source_lang"] is None
    assert body["translations"][0]["template"] == "zh"
    assert body["usage"]["output_tokens"] == 16  # random weights never stop early
    assert body["request_id"]


def test_multi_text_and_flask_field_names(server: Server) -> None:
    response = predict(
        server,
        {
            "text": ["Good morning.", "Good night.", "Thanks"],
            "src_lang": "en",
            "tgt_lang": "de",
            "max_new_tokens": 5,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert "translation" not in body
    assert [t["output_tokens"] for t in body["translations"]] == [5, 5, 5]
    assert body["source_lang"] == "en" and body["target_lang"] == "de"


def test_glossary_and_context_on_the_demo_family(server: Server) -> None:
    """The CPU demo runs the HY-MT1.5 family: both fields reach their templates."""
    glossary = [{"source": "Hunyuan", "target": "混元"}]
    by_glossary = predict(server, {"text": "Hunyuan", "target_lang": "zh", "glossary": glossary})
    by_context = predict(server, {"text": "He left.", "target_lang": "ja", "context": "Tom"})
    assert (by_glossary.status_code, by_context.status_code) == (200, 200), by_glossary.text
    assert by_glossary.json()["translations"][0]["template"] == "terminology"
    assert by_context.json()["translations"][0]["template"] == "context"
    both = predict(server, {"text": "x", "target_lang": "zh", "glossary": glossary, "context": "y"})
    assert both.status_code == 400 and both.json()["field"] == "context"


def test_concurrent_batch_with_bad_requests(server: Server) -> None:
    bodies: list[Any] = [
        {"text": "Hello", "target_lang": "fr"},
        {"text": "Hello", "target_lang": "klingon"},
        {"text": ["一", "二"], "target_lang": "en", "source_lang": "zh"},
        {"text": "", "target_lang": "en"},
    ]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda b: predict(server, b), bodies))
    assert [r.status_code for r in responses] == [200, 400, 200, 400]
    assert responses[1].json()["error_type"] == "unsupported_language"
    assert "zh-Hant" in responses[1].json()["allowed"]
    assert len(responses[2].json()["translations"]) == 2


def test_non_json_bodies_get_json_errors(server: Server) -> None:
    url = f"{server.inference_url()}/predictions/{MODEL}"
    plain = requests.post(
        url,
        data="hello",
        headers={**server.headers("inference"), "Content-Type": "text/plain"},
        timeout=30,
    )
    assert plain.status_code == 400 and plain.json()["error_type"] == "invalid_request"
    form = requests.post(url, data={"text": "hi"}, headers=server.headers("inference"), timeout=30)
    assert form.status_code == 400 and "Content-Type: application/json" in form.json()["error"]


def test_inference_without_or_with_a_wrong_token_is_refused(server: Server) -> None:
    url = f"{server.inference_url()}/predictions/{MODEL}"
    body = {"text": "hi", "target_lang": "fr"}
    assert refused(requests.post(url, json=body, timeout=30))
    assert refused(requests.post(url, json=body, headers=WRONG, timeout=30))
    assert refused(requests.post(url, json=body, headers=server.headers("management"), timeout=30))


def test_management_describe_needs_its_token(server: Server) -> None:
    url = f"{server.management_url()}/models/{MODEL}"
    assert refused(requests.get(url, timeout=10))
    assert refused(requests.get(url, headers=server.headers("inference"), timeout=10))
    described = requests.get(
        f"{url}?customized=true", headers=server.headers("management"), timeout=30
    ).json()[0]
    assert described["batchSize"] == 4
    assert described["customizedMetadata"]  # our describe(): engine and settings
    assert "sdpa" in str(described["customizedMetadata"])


def test_model_registration_api_is_off(server: Server) -> None:
    response = requests.post(
        f"{server.management_url()}/models",
        params={"url": "https://example.com/evil.mar"},
        headers=server.headers("management"),
        timeout=10,
    )
    assert response.status_code == 405


def hymt_scale(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "hymt_serve.cli",
        "scale",
        "--workdir",
        str(server.workdir),
    ]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    "args", [["--", "-1"], ["0"], ["abc"], ["100000"], ["2", "--max-workers", "1"]]
)
def test_hymt_scale_refuses_bad_counts_before_touching_the_server(
    server: Server, args: list[str]
) -> None:
    """TorchServe takes min_worker=-1 (removing every worker), abc and 100000 without a word."""
    before = [w["pid"] for w in model_workers(server, MODEL)]
    run = hymt_scale(server, *args)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "hymt scale" in run.stderr
    assert [w["pid"] for w in model_workers(server, MODEL)] == before


def test_scale_workers_up_and_down(server: Server) -> None:
    url = f"{server.management_url()}/models/{MODEL}"
    assert refused(
        requests.put(
            url, params={"min_worker": 2, "synchronous": "true"}, headers=WRONG, timeout=10
        )
    )
    up = hymt_scale(server, "2")
    assert up.returncode == 0, up.stderr
    assert model_status(server, MODEL) == ["READY", "READY"]
    assert predict(server, {"text": "hi", "target_lang": "ja"}).status_code == 200
    down = hymt_scale(server, "1")
    assert down.returncode == 0, down.stderr
    assert model_status(server, MODEL) == ["READY"]
    described = requests.get(url, headers=server.headers("management"), timeout=10).json()[0]
    assert (described["minWorkers"], described["maxWorkers"]) == (1, 1)


def test_metrics_show_ours(server: Server) -> None:
    predict(server, {"text": "metrics please", "target_lang": "ko"})
    predict(server, {"text": "x", "target_lang": "nope"})
    text = requests.get(f"{server.metrics_url()}/metrics", timeout=10).text
    for name in (
        "hymt_requests_total",
        "hymt_texts_total",
        "hymt_input_tokens_total",
        "hymt_output_tokens_total",
        "hymt_generation_latency_seconds_bucket",
        "hymt_output_tokens_per_second",
        "hymt_batch_rows",
        "hymt_target_language_total",
    ):
        assert f"\n{name}{{" in text, name
    assert 'ErrorType="unsupported_language"' in text
    assert 'Attention="sdpa"' in text and 'Engine="hf"' in text
    assert "ts_inference_requests_total" in text
