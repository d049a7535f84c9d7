"""Access: tokens on every API but metrics, no registration of models or workflows from URLs."""

from __future__ import annotations

import pytest
import requests
from conftest import refused

from hymt_serve.ops.launcher import Server
from hymt_serve.ops.properties import read_properties

pytestmark = pytest.mark.integration
MODEL = "hunyuan-mt"


@pytest.mark.parametrize("api", ["inference", "management"])
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "wrong"}],
    ids=["none", "wrong", "bare"],
)
def test_every_api_call_needs_its_own_token(
    server: Server, api: str, headers: dict[str, str]
) -> None:
    if api == "inference":
        calls = [
            ("GET", f"{server.inference_url()}/ping"),
            ("POST", f"{server.inference_url()}/predictions/{MODEL}"),
        ]
    else:
        calls = [
            ("GET", f"{server.management_url()}/models"),
            ("GET", f"{server.management_url()}/models/{MODEL}"),
            ("PUT", f"{server.management_url()}/models/{MODEL}?min_worker=1"),
            ("DELETE", f"{server.management_url()}/models/{MODEL}/1.0"),
        ]
    for method, url in calls:
        assert refused(requests.request(method, url, headers=headers, timeout=10)), url
    other = "management" if api == "inference" else "inference"
    for method, url in calls:
        assert refused(requests.request(method, url, headers=server.headers(other), timeout=10))


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/evil.mar",
        "http://127.0.0.1:1/evil.mar",
        "file:///etc/passwd",
        "file:///tmp/elsewhere/model_store/evil.mar",
    ],
)
def test_model_registration_from_a_url_is_refused(server: Server, url: str) -> None:
    response = requests.post(
        f"{server.management_url()}/models",
        params={"url": url},
        headers=server.headers("management"),
        timeout=10,
    )
    assert response.status_code == 405  # enable_model_api=false


def test_workflow_registration_outside_the_model_store_is_refused(server: Server) -> None:
    # 0.12.0's enable_model_api does not cover workflows: allowed_urls has to stop them.
    store = read_properties(server.config_path)["model_store"]
    for url in [
        "https://example.com/evil.war",
        "file:///etc/passwd",
        f"file://{store}/../evil.war",
        f"file://{store}/sub/evil.war",
        "file:///tmp/other/model_store/evil.war",
    ]:
        response = requests.post(
            f"{server.management_url()}/workflows",
            params={"url": url},
            headers=server.headers("management"),
            timeout=10,
        )
        assert response.status_code == 404, url
        assert "does not match any allowed URL" in response.json()["message"]


def test_allowed_urls_names_this_model_store(server: Server) -> None:
    values = read_properties(server.config_path)
    assert values["allowed_urls"].startswith("^file://")
    assert "{model_store}" not in values["allowed_urls"]
    assert values["model_store"].replace("-", "\\\\-") in values["allowed_urls"]


def test_only_the_api_description_is_public(server: Server) -> None:
    # TorchServe serves its OpenAPI description without a token: no model data, no actions.
    response = requests.get(f"{server.inference_url()}/api-description", timeout=10)
    assert response.status_code == 200 and "openapi" in response.json()


def test_metrics_have_no_token_so_they_stay_on_loopback(server: Server) -> None:
    assert server.metrics_url().startswith("http://127.0.0.1:")
    assert requests.get(f"{server.metrics_url()}/metrics", timeout=10).status_code == 200
