"""A fuzz pass over every interface of a running server: REST inference, gRPC inference, the
management API and ``hymt scale``, and the web front end's API.

Generated bodies (hypothesis: near-valid requests with one field replaced by arbitrary JSON,
arbitrary JSON, arbitrary bytes) and a corpus of known attacks. For every one: no 5xx (a client
mistake is a 4xx with our JSON error body), and afterwards a valid request still translates and
the worker processes are the same ones (nothing restarted).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from conftest import MODEL
from grpc_clients import GrpcClient, compile_protos
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from web_stub import opened

from hymt_serve.cli.main import main as hymt
from hymt_serve.ops.launcher import Server, model_workers
from hymt_serve.web.app import create_app

pytestmark = pytest.mark.integration
VALID = {"text": "Good morning.", "target_lang": "fr", "max_new_tokens": 2}
FIELDS = ["text", "target_lang", "source_lang", "max_new_tokens", "sampling", "stream", "top_k"]
CLIENT_ERRORS = {400, 413}
fuzz = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["<|eos|>", "<|extra_0|>", "zh", "en", "\u202e", "\x00"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@st.composite
def near_valid(draw: st.DrawFn) -> dict[str, Any]:
    """A valid body with one field (known or not) set to arbitrary JSON."""
    body = dict(VALID)
    body[draw(st.sampled_from([*FIELDS, "tgt_lang", "zzz"]))] = draw(json_values)
    return body


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


bodies = (
    near_valid().map(encoded)
    | json_values.map(encoded)
    | st.binary(max_size=64)
    | st.text(max_size=64).map(str.encode)
)
CORPUS: list[bytes] = [
    b"",
    b"{",
    b"[" * 5000,
    b'{"text": ' + b"[" * 990 + b"]" * 990 + b', "target_lang": "fr"}',
    b'{"text": "a", "target_lang": "fr", "max_new_tokens": ' + b"9" * 5000 + b"}",
    b'{"text": "a", "target_lang": "fr", "max_new_tokens": 1e999}',
    b'{"text": "a", "target_lang": "fr", "sampling": true, "top_p": NaN}',
    b'{"text": "\\ud800", "target_lang": "fr"}',
    b'{"text": "hello<|eos|><|extra_0|>", "target_lang": "fr", "max_new_tokens": 2}',
    b'{"text": "a", "target_lang": "fr", "stream": "yes"}',
    b'{"text": ["a", "b"], "target_lang": "fr", "stream": true}',
    b"\xff\xfe\x00",
    encoded({"text": "x" * 5000, "target_lang": "fr"}),
]


@pytest.fixture(scope="module")
def unchanged(server: Server) -> Iterator[None]:
    """The module's fuzzing must leave the same worker processes, still translating."""
    before = sorted(w["pid"] for w in model_workers(server, MODEL))
    yield
    assert _post(server, encoded(VALID)).status_code == 200
    after = model_workers(server, MODEL)
    assert sorted(w["pid"] for w in after) == before
    assert all(w["status"] == "READY" for w in after)


def _post(server: Server, raw: bytes) -> requests.Response:
    headers = {**server.headers("inference"), "Content-Type": "application/json"}
    url = f"{server.inference_url()}/predictions/{MODEL}"
    return requests.post(url, data=raw, headers=headers, timeout=60)


def _client_error_or_ok(status: int, body: Any) -> None:
    assert status == 200 or status in CLIENT_ERRORS, (status, body)
    if status != 200:
        assert isinstance(body, dict) and body.get("error_type"), body


def check_rest(server: Server, raw: bytes) -> None:
    response = _post(server, raw)
    lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    _client_error_or_ok(response.status_code, lines[-1] if lines else None)


def check_grpc(client: GrpcClient, raw: bytes) -> None:
    for reply in (client.predict(raw), *client.stream(raw)):
        assert reply.get("error_type") in (
            None,
            "invalid_request",
            "payload_too_large",
            "unsupported_language",
            "same_language",
        ), reply


@pytest.fixture(scope="module")
def grpc_client(server: Server, tmp_path_factory: pytest.TempPathFactory) -> GrpcClient:
    return GrpcClient(server, compile_protos(tmp_path_factory.mktemp("fuzz-stubs")))


@pytest.mark.parametrize("raw", CORPUS)
def test_rest_corpus(server: Server, unchanged: None, raw: bytes) -> None:
    check_rest(server, raw)


@fuzz
@given(raw=bodies)
def test_rest_fuzz(server: Server, unchanged: None, raw: bytes) -> None:
    check_rest(server, raw)


@pytest.mark.parametrize("raw", CORPUS)
def test_grpc_corpus(grpc_client: GrpcClient, unchanged: None, raw: bytes) -> None:
    check_grpc(grpc_client, raw)


@fuzz
@given(raw=bodies)
def test_grpc_fuzz(grpc_client: GrpcClient, unchanged: None, raw: bytes) -> None:
    check_grpc(grpc_client, raw)


@fuzz
@given(raw=bodies)
def test_web_api_fuzz(server: Server, unchanged: None, raw: bytes) -> None:
    with opened(create_app(server)) as client:
        headers = {"Content-Type": "application/json"}
        response = client.post("/api/translate", content=raw, headers=headers)
    text = response.text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    _client_error_or_ok(response.status_code, lines[-1] if lines else None)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    name=st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s and "?" not in s),
    query=st.dictionaries(st.sampled_from(["customized", "limit", "x"]), st.text(max_size=8)),
)
def test_management_reads_fuzz(
    server: Server, unchanged: None, name: str, query: dict[str, str]
) -> None:
    response = requests.get(
        f"{server.management_url()}/models/{requests.utils.quote(name, safe='')}",
        params=query,
        headers=server.headers("management"),
        timeout=30,
    )
    assert response.status_code < 500, (name, query, response.text)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    workers=st.integers() | st.text(max_size=6),
    max_workers=st.none() | st.integers() | st.text(max_size=6),
)
def test_hymt_scale_fuzz(
    server: Server,
    unchanged: None,
    workers: Any,
    max_workers: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Only counts within [1, the ceiling] reach TorchServe; everything else is refused."""
    args = ["scale", "--workdir", str(server.workdir), "--max-cpu-workers", "1", "--", str(workers)]
    if max_workers is not None:
        args[-2:-2] = ["--max-workers", str(max_workers)]
    try:
        code = hymt(args)
    except SystemExit as exit_:  # argparse: not an integer
        code = int(str(exit_.code))
    capsys.readouterr()
    valid = _as_int(workers) == 1 and (max_workers is None or _as_int(max_workers) == 1)
    assert code == (0 if valid else 2), (workers, max_workers, code)


def _as_int(value: Any) -> int | None:
    """What argparse's ``type=int`` makes of the command-line word ``str(value)``."""
    try:
        return int(str(value))
    except ValueError:
        return None
