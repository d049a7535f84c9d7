"""The README's request examples are valid on the demo server (the CPU profile's settings)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from hymt_serve.core.settings import Settings
from hymt_serve.request import oip
from hymt_serve.request.families import detect_profile
from hymt_serve.request.protocol import parse_request

REPO = Path(__file__).resolve().parents[2]
# A curl to a model's predictions endpoint, then its -d '<json>' (the README's shell examples).
CURL_BODY = re.compile(r"curl [^\n]*?/predictions/([\w-]+)[^']*?-d '(\{[^']*\})'", re.DOTALL)
# The demo's models: the translation model (its configured family) and the Chimera model.
DEMO_MODELS = {"hunyuan-mt": None, "hunyuan-mt-chimera": "hunyuan-mt-chimera"}


def demo_settings() -> Settings:
    config = yaml.safe_load((REPO / "configs/model-config-cpu.yaml").read_text())
    return Settings.from_mapping({**config["handler"], "model_path": "/unused"}, environ={})


def readme_bodies() -> list[tuple[str, dict[str, Any]]]:
    found = CURL_BODY.findall((REPO / "README.md").read_text())
    return [(model, json.loads(body)) for model, body in found]


def test_every_readme_request_example_is_accepted_by_the_demo_server() -> None:
    bodies = readme_bodies()
    assert len(bodies) >= 4  # the single, multi-text, sampling and streaming examples
    settings = demo_settings()
    for model, body in bodies:
        family = DEMO_MODELS[model] or settings.prompt_family
        profile = detect_profile(settings.model_path, family)
        parse_request(body, settings, profile)  # raises InvalidRequest / PayloadTooLarge


# A curl to a model's v2 inference endpoint (KServe's Open Inference Protocol), then its body.
V2_CURL_BODY = re.compile(r"curl [^\n]*?/v2/models/([\w-]+)/infer[^']*?-d '(\{[^']*\})'", re.DOTALL)


def test_every_readme_v2_example_is_accepted_by_the_demo_server() -> None:
    found = V2_CURL_BODY.findall((REPO / "README.md").read_text())
    assert found
    settings = demo_settings()
    profile = detect_profile(settings.model_path, settings.prompt_family)
    for _, body in found:
        fields, call = oip.unwrap(json.loads(body), {"Content-Type": "application/json"})
        assert call is not None
        parse_request(fields, settings, profile)
