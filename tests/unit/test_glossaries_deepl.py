"""DeepL's glossary API on the web front end, driven by the official ``deepl`` client: every
glossary method, translate_text with a glossary reaching TorchServe as the handler's inline
glossary, one key's glossaries invisible to another, and the errors.

The front end runs under uvicorn (as ``hymt web``) with a database of its own; the stub
TorchServe answers with the handler's own request parser (request.protocol.parse_request, the
family's profile), so a family without terminology prompts refuses a glossary as the handler
does, and a translation shows the terms its prompt got."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import deepl
import pytest
import requests
from web_stub import PREDICTIONS, Upstream, client_keys, serving, workdir
from werkzeug.wrappers import Request, Response

from hymt_serve.core.settings import Settings
from hymt_serve.request.errors import ServiceError
from hymt_serve.request.families import HUNYUAN_MT_7B, HY_MT15, Profile
from hymt_serve.request.prompts import relevant_terms
from hymt_serve.request.protocol import parse_request
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys

SETTINGS = Settings.from_mapping({"model_path": "/m"}, environ={})
ENTRIES = {"Hunyuan": "Hunyuan-MT", "engine": "Motor", "GPU": "Grafikkarte"}


def handler(profile: Profile) -> Callable[[Request], Response]:
    """TorchServe's answer for a handler of ``profile``: the parser's refusal, or each text
    followed by the glossary terms its prompt would list."""

    def answer(request: Request) -> Response:
        try:
            parsed = parse_request(json.loads(request.get_data()), SETTINGS, profile)
        except ServiceError as error:
            return Response(json.dumps(error.body(None)), error.status, mimetype="application/json")
        glossary = parsed.features.options.glossary
        texts = [
            text + "".join(f" [{s}={t}]" for s, t in relevant_terms(text, glossary))
            for text in parsed.texts
        ]
        body = {"translations": [{"text": text} for text in texts]}
        return Response(json.dumps(body), mimetype="application/json")

    return answer


@pytest.fixture(scope="module")
def front(
    stub_server: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ClientKeys]]:
    """The front end (its URL) and its keys: alice's and bob's."""
    folder = tmp_path_factory.mktemp("front")
    keys = client_keys(folder / "web_keys.json", ("alice", "bob"))
    with serving(create_app(workdir(folder, stub_server.url), client_keys=keys)) as url:
        yield url, keys


@pytest.fixture
def upstream(stub_server: Upstream) -> Upstream:
    stub_server.received.clear()
    stub_server.replies[PREDICTIONS] = handler(HY_MT15)
    return stub_server


def _translator(front: tuple[str, ClientKeys], index: int = 0) -> deepl.Translator:
    url, keys = front
    return deepl.Translator(keys.keys[index].key, server_url=url)


def test_every_glossary_method_of_the_client(
    front: tuple[str, ClientKeys], upstream: Upstream
) -> None:
    translator = _translator(front)
    pairs = {(p.source_lang, p.target_lang) for p in translator.get_glossary_languages()}
    assert {("en", "de"), ("de", "en"), ("zh", "en"), ("en", "zh")} <= pairs
    made = translator.create_glossary("Produkt ü", "EN", "DE", ENTRIES)
    assert (made.name, made.source_lang, made.target_lang) == ("Produkt ü", "EN", "DE")
    assert made.ready and made.entry_count == 3 and made.creation_time.tzinfo is not None
    from_csv = translator.create_glossary_from_csv(
        "CSV", "EN", "DE", '"engine, large",Großmotor\nHello,Hallo,en,de\nx,y,en,fr\n'
    )
    assert from_csv.entry_count == 2  # the row of another pair is not this glossary's
    listed = [g.glossary_id for g in translator.list_glossaries()]
    assert made.glossary_id in listed and from_csv.glossary_id in listed
    assert str(translator.get_glossary(made.glossary_id)) == str(made)
    assert translator.get_glossary_entries(made) == ENTRIES
    assert translator.get_glossary_entries(from_csv.glossary_id) == {
        "engine, large": "Großmotor", "Hello": "Hallo",
    }  # fmt: skip

    texts = ["The engine of Hunyuan", "Hello", "A GPU"]
    result = translator.translate_text(texts, source_lang="EN", target_lang="DE", glossary=made)
    assert [r.text for r in result] == [
        "The engine of Hunyuan [Hunyuan=Hunyuan-MT] [engine=Motor]",
        "Hello",
        "A GPU [GPU=Grafikkarte]",
    ]
    [sent] = [seen.json() for seen in upstream.forwarded()]
    assert "glossary_id" not in sent and len(sent["glossary"]) == 3
    assert [r.billed_characters for r in result] == [len(t) for t in texts]
    again = translator.translate_text_with_glossary("engine", made)
    assert isinstance(again, deepl.TextResult) and again.text == "engine [engine=Motor]"

    translator.delete_glossary(made)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.get_glossary(made.glossary_id)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.delete_glossary(made.glossary_id)
    assert made.glossary_id not in [g.glossary_id for g in translator.list_glossaries()]
    translator.delete_glossary(from_csv)


def test_a_chinese_glossary_serves_either_script_and_each_chunk_gets_its_terms(
    front: tuple[str, ClientKeys], upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    translator = _translator(front)
    made = translator.create_glossary("zh", "EN", "ZH", {"engine": "引擎", "GPU": "显卡"})
    assert made.target_lang == "ZH"
    for target, ours in (("ZH-HANT", "zh-Hant"), ("ZH-HANS", "zh"), ("ZH", "zh")):
        upstream.received.clear()
        one = translator.translate_text(
            "engine", source_lang="EN", target_lang=target, glossary=made
        )
        assert one.text == "engine [engine=引擎]"
        [sent] = [seen.json() for seen in upstream.forwarded()]
        assert sent["target_lang"] == ours
    upstream.received.clear()
    texts = ["engine"] * 16 + ["GPU"] * 16 + ["nothing"] * 16  # three requests of 16
    translator.translate_text(texts, source_lang="EN", target_lang="ZH", glossary=made)
    # The chunks go at once (in any order): each with the terms of its own texts.
    sent = [seen.json() for seen in upstream.forwarded()]
    terms = {body["text"][0]: [g["source"] for g in body["glossary"]] for body in sent}
    assert terms == {"engine": ["engine"], "GPU": ["GPU"], "nothing": ["engine"]}  # none: the first
    translator.delete_glossary(made)


def test_one_keys_glossaries_are_invisible_to_another(
    front: tuple[str, ClientKeys], upstream: Upstream
) -> None:
    alice, bob = _translator(front), _translator(front, 1)
    made = alice.create_glossary("mine", "EN", "DE", ENTRIES)
    assert made.glossary_id not in [g.glossary_id for g in bob.list_glossaries()]
    for call in (bob.get_glossary, bob.get_glossary_entries, bob.delete_glossary):
        with pytest.raises(deepl.GlossaryNotFoundException):
            call(made.glossary_id)
    with pytest.raises(deepl.DeepLException, match="Not found, message: Glossary not found"):
        bob.translate_text("engine", source_lang="EN", target_lang="DE", glossary=made.glossary_id)
    assert not upstream.forwarded()
    assert alice.get_glossary_entries(made) == ENTRIES  # still there
    alice.delete_glossary(made)


@pytest.mark.parametrize(
    ("make", "message"),
    [(lambda t: t.create_glossary_from_csv("d", "EN", "DE", "a,b\na,c"),
      "Invalid glossary entries provided, detail: entry 2 duplicates the source term of entry 1"),
     (lambda t: t.create_glossary_from_csv("d", "EN", "DE", "a,"), "its target is empty"),
     (lambda t: t.create_glossary("d", "EN", "EN", {"a": "b"}),
      "Unsupported glossary source and target language pair"),
     (lambda t: t.create_glossary("d", "XX", "DE", {"a": "b"}), "Value for 'source_lang' not"),
     (lambda t: t.create_glossary("x" * 1025, "EN", "DE", {"a": "b"}), "the name has more")],
)  # fmt: skip
def test_glossaries_refused_with_deepls_message(
    front: tuple[str, ClientKeys], make: Callable[[deepl.Translator], Any], message: str
) -> None:
    translator = _translator(front)
    with pytest.raises(deepl.DeepLException, match=message) as refused:
        make(translator)
    assert refused.value.http_status_code == 400


def test_translations_with_a_glossary_refused(
    front: tuple[str, ClientKeys], upstream: Upstream
) -> None:
    url, keys = front
    translator = _translator(front)
    made = translator.create_glossary("g", "EN", "DE", ENTRIES)
    before = translator.get_usage().character.count
    with pytest.raises(deepl.DeepLException, match="language pair does not match") as refused:
        translator.translate_text(
            "a", source_lang="EN", target_lang="FR", glossary=made.glossary_id
        )
    assert refused.value.http_status_code == 400
    headers = {"Authorization": f"DeepL-Auth-Key {keys.keys[0].key}"}
    raw = requests.post(
        f"{url}v2/translate",
        json={"text": ["a"], "target_lang": "DE", "glossary_id": made.glossary_id},
        headers=headers,
    )
    assert raw.status_code == 400 and "requires the source_lang" in raw.json()["message"]
    entries = requests.get(
        f"{url}v2/glossaries/{made.glossary_id}/entries",
        headers={**headers, "Accept": "application/json"},
    )
    assert entries.status_code == 415 and "Accept" in entries.json()["message"]
    # A family without terminology prompts: the handler's own 400 names the model.
    upstream.replies[PREDICTIONS] = handler(HUNYUAN_MT_7B)
    with pytest.raises(deepl.DeepLException, match="does not support 'glossary'") as refused:
        translator.translate_text("engine", source_lang="EN", target_lang="DE", glossary=made)
    assert refused.value.http_status_code == 400
    assert translator.get_usage().character.count == before  # nothing billed for the refusals
    translator.delete_glossary(made)


def test_a_document_with_a_glossary(
    front: tuple[str, ClientKeys], upstream: Upstream, tmp_path: Path
) -> None:
    translator = _translator(front)
    made = translator.create_glossary("g", "EN", "DE", ENTRIES)
    upstream.replies[PREDICTIONS] = lambda _request: Response(
        json.dumps({"document": "Der Motor\n"}), mimetype="application/json"
    )
    source, target = tmp_path / "a.txt", tmp_path / "a.de.txt"
    source.write_text("The engine\n")
    translator.translate_document_from_filepath(
        source, target, source_lang="EN", target_lang="DE", glossary=made
    )
    [sent] = [seen.json() for seen in upstream.forwarded()]
    assert sent["glossary"] == [{"source": "engine", "target": "Motor"}]
    assert "glossary_id" not in sent
