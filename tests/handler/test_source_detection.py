"""source_lang "auto" through the service with a fake engine: each text's language is
detected, used where the prompt needs the source language, and reported."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FakeEngine

from hymt_serve.core.settings import Settings
from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.families import CHIMERA, Profile
from hymt_serve.request.service import TranslationService

SETTINGS = Settings.from_mapping({"model_path": "/unused"}, environ={})
FRENCH = "Le train part à sept heures et demie."
CHINESE = "今天天氣很好，我們去公園散步吧。"


def _translate(body: dict[str, Any], profile: Profile | None = None) -> tuple[Any, list[str]]:
    engine = FakeEngine()
    service = TranslationService(engine, SETTINGS)
    if profile is not None:
        service.profile = profile
    outcomes = service.prepare([service.parse(body)])
    reply = service.render(outcomes, service.generate(outcomes), ["r"])[0]
    assert reply.status == 200, reply.body
    return reply.body, engine.prompts


def test_auto_reports_each_texts_detected_language() -> None:
    body, prompts = _translate({"text": [FRENCH, CHINESE, "ok"], "source_lang": "auto",
                                "target_lang": "de"})  # fmt: skip
    detected = [item["detected"] for item in body["translations"]]
    assert [d and d["language"] for d in detected] == ["fr", "zh-Hant", None]
    assert 0.5 <= detected[0]["confidence"] <= 1
    assert "detected" not in body  # a list of texts: per translation only
    # the detected Chinese source chose the model card's Chinese template
    assert prompts[0].startswith("Translate the following segment into German")
    assert prompts[1].startswith("把下面的文本翻译成德语")


def test_a_single_text_also_has_a_top_level_detected() -> None:
    body, _ = _translate({"text": FRENCH, "source_lang": "AUTO", "target_lang": "en"})
    assert body["detected"]["language"] == "fr"
    assert body["translations"][0]["detected"] == body["detected"]
    assert body["source_lang"] is None


def test_a_streams_last_line_reports_it_too() -> None:
    body, _ = _translate({"text": FRENCH, "source_lang": "auto", "target_lang": "en",
                          "stream": True})  # fmt: skip
    assert body["detected"]["language"] == "fr"


def test_a_named_source_is_used_as_before_and_nothing_is_detected() -> None:
    body, prompts = _translate({"text": CHINESE, "source_lang": "en", "target_lang": "fr"})
    assert "detected" not in body and "detected" not in body["translations"][0]
    assert body["source_lang"] == "en"
    assert prompts[0].startswith("Translate the following segment into French")


def test_the_refine_template_names_the_detected_source() -> None:
    body, prompts = _translate(
        {"text": FRENCH, "source_lang": "auto", "target_lang": "en",
         "candidates": ["The train leaves at 7:30.", "Train at half past seven."]},
        CHIMERA,
    )  # fmt: skip
    assert "of the French segment" in prompts[0]
    assert body["detected"]["language"] == "fr"


def test_the_refine_template_refuses_a_text_it_cannot_detect() -> None:
    service = TranslationService(FakeEngine(), SETTINGS)
    service.profile = CHIMERA
    with pytest.raises(InvalidRequest, match="could not be detected"):
        service.parse({"text": "ok", "source_lang": "auto", "target_lang": "en",
                       "candidates": ["a"]})  # fmt: skip


def test_a_document_reports_its_language_at_the_top() -> None:
    text = "# Titel\n\nDer Zug fährt um halb acht ab. Bitte schließen Sie die Tür."
    body, _ = _translate({"document": text, "format": "markdown", "source_lang": "auto",
                          "target_lang": "en"})  # fmt: skip
    assert body["detected"]["language"] == "de"
