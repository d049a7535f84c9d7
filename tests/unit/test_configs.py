"""The shipped config files: metrics declared once, secure defaults, valid model configs, and
a configuration reference that matches the settings' definitions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hymt_serve.core import reference
from hymt_serve.core.settings import Settings
from hymt_serve.ops.properties import read_properties
from hymt_serve.request.metrics import DECLARED

REPO = Path(__file__).resolve().parents[2]


def test_metrics_yaml_declares_exactly_our_metrics() -> None:
    model_metrics = yaml.safe_load((REPO / "configs/metrics.yaml").read_text())["model_metrics"]
    declared = {
        (m["name"], kind, m["unit"], tuple(m["dimensions"]))
        for kind, items in model_metrics.items()
        for m in items
        if m["name"].startswith("hymt_")
    }
    assert declared == {(s.name, s.kind, s.unit, s.dimensions) for s in DECLARED}


@pytest.mark.parametrize("path", [REPO / "config.properties", REPO / "docker/config.properties"])
def test_token_auth_on_and_model_api_off(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    values = read_properties(path)
    assert values["disable_token_authorization"] == "false"
    assert values["enable_model_api"] == "false"
    assert values["metrics_mode"] == "prometheus"
    assert "allowed_urls" in values
    for key in ("job_queue_size", "default_response_timeout", "max_request_size"):
        assert int(values[key]) > 0


def test_default_config_binds_loopback_only() -> None:
    values = read_properties(REPO / "config.properties")
    for key in ("inference_address", "management_address", "metrics_address"):
        assert values[key].startswith("http://127.0.0.1:"), key
    assert values["grpc_inference_address"] == values["grpc_management_address"] == "127.0.0.1"


def test_every_config_line_is_commented() -> None:
    lines = (REPO / "config.properties").read_text().splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith("#"):
            above = lines[index - 1]
            assert above.startswith("#") or "=" in above, f"no comment for {line!r}"


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_model_configs_are_valid(profile: str) -> None:
    config = yaml.safe_load((REPO / f"configs/model-config-{profile}.yaml").read_text())
    for key in ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout"):
        assert isinstance(config[key], int) and not isinstance(config[key], bool), key
    assert config["maxBatchDelay"] > 0  # 0 silently becomes 100 ms
    Settings.from_mapping({**config["handler"], "model_path": "/m"}, environ={})


def test_the_configuration_reference_is_current() -> None:
    doc = REPO / reference.DOC
    assert reference.render(doc.read_text(encoding="utf-8")) == doc.read_text(encoding="utf-8"), (
        f"{reference.DOC} is stale: run `{reference.COMMAND}` from the repository's root"
    )


def test_the_reference_names_every_key_with_its_bounds() -> None:
    from hymt_serve.core.config import CONCERNS, specs

    block = reference.reference()
    for name in reference.TITLES:
        for field_, spec in specs(CONCERNS[name]):
            assert f"| `{field_.name}` | {spec.kind} |" in block
            assert spec.bounds() in block and spec.doc in block
    assert "test_oom" not in block


def test_the_reference_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(f"intro\n{reference.BEGIN}\nold\n{reference.END}\nend\n", encoding="utf-8")
    assert reference.main(["--check", "--doc", str(stale)]) == 1
    assert reference.main(["--doc", str(stale)]) == 0
    assert reference.main(["--check", "--doc", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8").startswith("intro\n") and "max_new_tokens" in (
        stale.read_text(encoding="utf-8")
    )
