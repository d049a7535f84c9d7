"""Chimera refinement end to end on CPU: two tiny models in one real TorchServe (a translation
model and a Chimera model, each its own archive and workers), the web front end's /api/refine
between them, scaling one without the other, and the page's refinement option in Chromium."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import MODEL, running_server
from test_web_page import CHROMIUM, CHROMIUM_FLAGS
from web_stub import opened, serving

from hymt_serve.ops.launcher import Server, model_workers
from hymt_serve.web.app import create_app

pytestmark = pytest.mark.integration
CHIMERA = "hunyuan-mt-chimera"
BODY = {"text": "今天天气很好。", "source_lang": "zh", "target_lang": "en", "max_new_tokens": 6}


@pytest.fixture(scope="module")
def two_models(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    chimera = {"handler.prompt_family": "hunyuan-mt-chimera", "handler.max_new_tokens": 8}
    with running_server(
        tiny_model_dir,
        tmp_path_factory.mktemp("refine"),
        {"handler.max_new_tokens": 8},
        more_models={CHIMERA: (tiny_model_dir, chimera)},
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(two_models: Server) -> Iterator[Any]:
    with opened(create_app(two_models, MODEL, refine_model=CHIMERA)) as client:
        yield client


def predict(server: Server, model: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(
        f"{server.inference_url()}/predictions/{model}",
        json=body,
        headers=server.headers("inference"),
        timeout=60,
    )


def test_refine_generates_candidates_and_chimera_answers(client: Any) -> None:
    response = client.post("/api/refine", json=BODY)
    assert response.status_code == 200, response.json()
    answer = response.json()
    [item] = answer["translations"]
    assert 1 <= len(item["candidates"]) <= 6
    assert len({" ".join(c.split()) for c in item["candidates"]}) == len(item["candidates"])
    if item["refined"]:
        assert item["template"] == "refine" and answer["usage"]["refine"]["input_tokens"] > 0
    assert answer["usage"]["candidates"]["output_tokens"] > 0
    assert answer["translation"] == item["text"]


def test_the_chimera_model_takes_candidates_directly(two_models: Server, client: Any) -> None:
    own = {**BODY, "candidates": ["It is fine today.", "The weather is nice today."]}
    direct = predict(two_models, CHIMERA, own)
    assert direct.status_code == 200
    assert direct.json()["translations"][0]["candidates"] == own["candidates"]
    via_page = client.post("/api/refine", json=own).json()
    assert via_page["translations"][0]["refined"] is True
    missing = predict(two_models, CHIMERA, BODY)
    assert missing.status_code == 400 and missing.json()["field"] == "candidates"
    plain = predict(two_models, MODEL, own)  # the translation model takes no candidates
    assert plain.status_code == 400 and "does not support 'candidates'" in plain.json()["error"]


def test_refine_errors_reach_the_client(client: Any) -> None:
    no_source = client.post("/api/refine", json={"text": "x", "target_lang": "en"})
    assert no_source.status_code == 400 and no_source.json()["field"] == "source_lang"
    bad = client.post("/api/refine", json={**BODY, "target_lang": "xx"})
    assert bad.status_code == 400 and bad.json()["error_type"] == "unsupported_language"


def test_each_model_scales_on_its_own(two_models: Server) -> None:
    def scale(model: str, workers: int) -> None:
        response = requests.put(
            f"{two_models.management_url()}/models/{model}",
            params={"min_worker": workers, "max_worker": workers, "synchronous": "true"},
            headers=two_models.headers("management"),
            timeout=240,
        )
        assert response.status_code == 200, response.text

    scale(CHIMERA, 2)
    try:
        assert len(model_workers(two_models, CHIMERA)) == 2
        assert len(model_workers(two_models, MODEL)) == 1
        assert predict(two_models, CHIMERA, {**BODY, "candidates": ["a"]}).status_code == 200
    finally:
        scale(CHIMERA, 1)


def test_the_page_shows_the_candidates(two_models: Server) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    app = create_app(two_models, MODEL, refine_model=CHIMERA)
    with serving(app) as url, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function("window.hymt && window.hymt.ready === true")
        assert page.is_visible("#refine-field")
        page.fill("#input", BODY["text"])
        page.check("#refine")
        with page.expect_request("**/api/refine") as sent:
            page.click("#translate")
        assert json.loads(sent.value.post_data)["text"] == BODY["text"]
        page.wait_for_function(
            "/refined by Chimera|candidates agreed/.test("
            "document.getElementById('stats').textContent)"
        )
        assert page.locator("#candidates li").count() >= 1
        assert page.inner_text("#output").strip() and page.is_hidden("#error")
        browser.close()
