"""Language detection on the front end's compatible APIs, against the stub TorchServe:
LibreTranslate's POST /detect and ``auto``, DeepL's ``detected_source_language``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_stub import MODEL, PREDICTIONS, Upstream, client_keys, opened, workdir

from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json")


@pytest.fixture
def client(upstream: Upstream, tmp_path: Path, keys: ClientKeys) -> Iterator[TestClient]:
    with opened(create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys)) as client:
        yield client


def _reply(*items: tuple[str, dict[str, Any] | None]) -> dict[str, Any]:
    return {"translations": [{"text": text, "detected": found} for text, found in items]}


def test_detect_answers_libretranslates_shape(client: TestClient, keys: ClientKeys) -> None:
    key = keys.keys[0].key
    answer = client.post("/detect", json={"q": "Der Zug fährt um halb acht ab.", "api_key": key})
    assert answer.status_code == 200
    [found] = answer.json()
    assert found["language"] == "de" and 50 <= found["confidence"] <= 100
    form = client.post("/detect", data={"q": "請把這份文件發給我。", "api_key": key})
    assert [f["language"] for f in form.json()] == ["zh-Hant"]


def test_detect_is_empty_when_unsure(client: TestClient, keys: ClientKeys) -> None:
    answer = client.post("/detect", json={"q": "Hello 你好世界", "api_key": keys.keys[0].key})
    assert answer.status_code == 200 and answer.json() == []


def test_detect_keeps_the_key_rules(client: TestClient, keys: ClientKeys) -> None:
    assert client.post("/detect", json={"q": "Bonjour"}).status_code == 403
    wrong = client.post("/detect", json={"q": "Bonjour", "api_key": "nope"})
    assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key"}
    empty = client.post("/detect", json={"api_key": keys.keys[0].key})
    assert empty.status_code == 400 and "q" in empty.json()["error"]


def test_libretranslate_auto_asks_for_detection_and_reports_it(
    client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, _reply(("Hello", {"language": "fr", "confidence": 0.93})))
    body = {"q": "Bonjour", "source": "auto", "target": "en", "api_key": keys.keys[0].key}
    answer = client.post("/translate", json=body)
    assert answer.json() == {
        "translatedText": "Hello",
        "detectedLanguage": {"confidence": 93.0, "language": "fr"},
    }
    assert upstream.forwarded()[-1].json()["source_lang"] == "auto"
    upstream.reply(PREDICTIONS, _reply(("a", None), ("b", {"language": "de", "confidence": 1})))
    listed = client.post("/translate", json={**body, "q": ["x", "y"]}).json()
    assert listed["detectedLanguage"] == [
        {"confidence": 0.0, "language": ""},
        {"confidence": 100.0, "language": "de"},
    ]


def test_libretranslate_with_a_named_source_is_unchanged(
    client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(PREDICTIONS, {"translations": [{"text": "Hello"}]})
    body = {"q": "Bonjour", "source": "fr", "target": "en", "api_key": keys.keys[0].key}
    assert client.post("/translate", json=body).json() == {"translatedText": "Hello"}
    assert upstream.forwarded()[-1].json()["source_lang"] == "fr"


def test_deepl_without_source_reports_the_detected_language(
    client: TestClient, upstream: Upstream, keys: ClientKeys
) -> None:
    upstream.reply(
        PREDICTIONS,
        _reply(("a", {"language": "zh-Hant", "confidence": 1.0}), ("b", None),
               ("c", {"language": "pt", "confidence": 0.8})),
    )  # fmt: skip
    headers = {"Authorization": f"DeepL-Auth-Key {keys.keys[0].key}"}
    body = {"text": ["x", "y", "z"], "target_lang": "EN-US"}
    answer = client.post("/v2/translate", json=body, headers=headers).json()
    assert [t["detected_source_language"] for t in answer["translations"]] == ["ZH", "", "PT"]
    assert upstream.forwarded()[-1].json()["source_lang"] == "auto"
    upstream.reply(PREDICTIONS, {"translations": [{"text": "a"}]})
    named = client.post("/v2/translate", json={**body, "text": ["x"], "source_lang": "de"},
                        headers=headers).json()  # fmt: skip
    assert named["translations"][0]["detected_source_language"] == "DE"
    assert upstream.forwarded()[-1].json()["source_lang"] == "de"
