"""Our API's glossaries (``/api/glossaries``) on the web front end, in process against the
stub TorchServe: the same objects as DeepL's, entries as JSON pairs, TSV or CSV, each key's
own (and, on loopback without a key, the open page API's own), errors as ``{error,
error_type}``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_stub import MODEL, PREDICTIONS, Upstream, client_keys, opened, workdir
from werkzeug.wrappers import Response

from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys

PAIRS = [["Hunyuan", "混元"], ["engine", "引擎"]]


@pytest.fixture
def keys(tmp_path: Path) -> ClientKeys:
    return client_keys(tmp_path / "web_keys.json", ("alice", "bob"))


@contextmanager
def _app(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys, **options: Any
) -> Iterator[TestClient]:
    app = create_app(workdir(tmp_path, upstream.url), MODEL, client_keys=keys, **options)
    with opened(app) as client:
        yield client


def _bearer(keys: ClientKeys, index: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys.keys[index].key}"}


def _new(client: TestClient, headers: dict[str, str] | None = None, **fields: Any) -> Any:
    body = {"name": "g", "source_lang": "en", "target_lang": "zh", "entries": PAIRS, **fields}
    return client.post("/api/glossaries", json=body, headers=headers)


def test_create_list_get_entries_delete(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    with _app(upstream, tmp_path, keys) as client:
        made = _new(client)
        assert made.status_code == 201
        glossary = made.json()
        assert glossary["entry_count"] == 2 and glossary["ready"] is True
        assert (glossary["source_lang"], glossary["target_lang"]) == ("en", "zh")
        assert glossary["creation_time"].endswith("Z")
        tsv = _new(client, entries="a\tb\nc\td", target_lang="zh-Hant").json()
        csv = _new(client, entries='"a, b",c', entries_format="csv", source_lang="EN-US").json()
        assert tsv["target_lang"] == "zh" and csv["source_lang"] == "en"
        listed = client.get("/api/glossaries").json()["glossaries"]
        assert listed == [glossary, tsv, csv]
        path = f"/api/glossaries/{glossary['glossary_id']}"
        assert client.get(path).json() == glossary
        entries = client.get(f"{path}/entries").json()
        assert entries == {
            "glossary_id": glossary["glossary_id"],
            "entries": [{"source": s, "target": t} for s, t in PAIRS],
        }
        assert client.delete(path).status_code == 204
        for answer in (client.get(path), client.get(f"{path}/entries"), client.delete(path)):
            assert answer.status_code == 404
            assert answer.json() == {"error": "Glossary not found", "error_type": "not_found"}
    assert not upstream.forwarded()


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [({"entries": [["a", "b"], ["a", "c"]]}, 400, "entry 2 duplicates the source term of entry 1"),
     ({"entries": [["a", ""]]}, 400, "its target is empty"),
     ({"entries": []}, 400, "no entries"),
     ({"entries": "a\tb", "entries_format": "xml"}, 400, "Unsupported entry format"),
     ({"target_lang": "en", "source_lang": "en"}, 400, "Unsupported glossary source and target"),
     ({"source_lang": None}, 400, "'source_lang' not supported"),
     ({"name": ""}, 400, "the name is empty"),
     ({"name": 3}, 400, "the name is missing or not a string")],
)  # fmt: skip
def test_refused_glossaries(
    upstream: Upstream,
    tmp_path: Path,
    keys: ClientKeys,
    fields: dict[str, Any],
    status: int,
    message: str,
) -> None:
    with _app(upstream, tmp_path, keys) as client:
        answer = _new(client, **fields)
        assert answer.status_code == status and message in answer.json()["error"]
        assert answer.json()["error_type"] == "invalid_request"
        form = client.post("/api/glossaries", data={"name": "g"})
        assert form.status_code == 400 and "JSON object" in form.json()["error"]
        assert client.get("/api/glossaries").json() == {"glossaries": []}


def test_each_key_sees_its_own_and_deepls_are_the_same_objects(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    with _app(upstream, tmp_path, keys) as client:
        local = _new(client).json()  # loopback, no key: the open page API's own
        alice = _new(client, _bearer(keys, 0), name="alice's").json()
        deepl = client.post(
            "/v2/glossaries",
            data={"name": "d", "source_lang": "EN", "target_lang": "DE", "entries": "x\ty"},
            headers={"Authorization": f"DeepL-Auth-Key {keys.keys[0].key}"},
        )
        assert deepl.status_code == 201
        listings = [
            [g["name"] for g in client.get("/api/glossaries", headers=h).json()["glossaries"]]
            for h in (None, _bearer(keys, 0), _bearer(keys, 1))
        ]
        assert listings == [["g"], ["alice's", "d"], []]
        for glossary, allowed in ((local, None), (alice, _bearer(keys, 0))):
            path = f"/api/glossaries/{glossary['glossary_id']}"
            others = [h for h in (None, _bearer(keys, 0), _bearer(keys, 1)) if h != allowed]
            for headers in others:
                assert client.get(path, headers=headers).status_code == 404
                assert client.delete(path, headers=headers).status_code == 404
            assert client.get(path, headers=allowed).json() == glossary
        wrong = client.get("/api/glossaries", headers={"Authorization": "Bearer not-a-key"})
        assert wrong.status_code == 401 and wrong.json()["error_type"] == "unauthorized"


def test_off_loopback_glossaries_need_a_key(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    with _app(upstream, tmp_path, keys, require_keys=True) as client:
        assert _new(client).status_code == 401
        made = _new(client, _bearer(keys, 1))
        assert made.status_code == 201
        listed = client.get("/api/glossaries", headers=_bearer(keys, 1)).json()["glossaries"]
        assert listed == [made.json()]


def test_api_translate_with_a_glossary_id(
    upstream: Upstream, tmp_path: Path, keys: ClientKeys
) -> None:
    upstream.replies[PREDICTIONS] = lambda _request: Response(
        json.dumps({"translation": "x", "translations": [{"text": "x"}]}),
        mimetype="application/json",
    )
    with _app(upstream, tmp_path, keys) as client:
        made = _new(client).json()
        body = {"text": "Hunyuan", "source_lang": "en", "target_lang": "zh", "stream": False}
        answer = client.post("/api/translate", json={**body, "glossary_id": made["glossary_id"]})
        assert answer.status_code == 200
        [sent] = [seen.json() for seen in upstream.forwarded()]
        assert sent == {**body, "glossary": [{"source": "Hunyuan", "target": "混元"}]}
        other = client.post(
            "/api/translate",
            json={**body, "glossary_id": made["glossary_id"]},
            headers=_bearer(keys, 0),
        )
        assert other.status_code == 404 and other.json()["error_type"] == "not_found"
