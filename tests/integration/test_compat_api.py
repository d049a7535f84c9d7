"""The LibreTranslate and DeepL compatible APIs of the web front end, driven by the official
client libraries (libretranslatepy, deepl) against the real stack (TorchServe + front end)."""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deepl
import pytest
import requests
from libretranslatepy import LibreTranslateAPI
from web_stub import serving

from hymt_serve.ops.launcher import Server
from hymt_serve.web.app import create_app
from hymt_serve.web.database import DATABASE_FILE
from hymt_serve.web.keys import SAVE_EVERY_S, ClientKeys

pytestmark = pytest.mark.integration
LIMIT = 400


@pytest.fixture(scope="module")
def front(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The front end with a fresh key file: (its URL, its key)."""
    key_file = tmp_path_factory.mktemp("keys") / "web_keys.json"
    keys = ClientKeys.open(key_file, character_limit=LIMIT)
    with serving(create_app(server, client_keys=keys)) as url:
        yield url, keys.keys[0].key


def test_the_key_file_is_private_and_not_torchserves(server: Server, tmp_path: Path) -> None:
    keys = ClientKeys.open(tmp_path / "web_keys.json")
    assert (tmp_path / "web_keys.json").stat().st_mode & 0o777 == 0o600
    assert keys.keys[0].key not in json.dumps(server.keys())
    assert ClientKeys.open(tmp_path / "web_keys.json").keys == keys.keys  # read, not replaced


def test_libretranslate_client(front: tuple[str, str]) -> None:
    url, key = front
    client = LibreTranslateAPI(url, api_key=key)
    assert isinstance(client.translate("Good morning.", "en", "fr"), str)
    assert isinstance(client.translate("早上好。", "auto", "zt"), str)  # zt: traditional Chinese
    [found] = client.detect("Guten Morgen, wie geht es Ihnen heute?")
    assert found["language"] == "de" and 50 <= found["confidence"] <= 100
    codes = {lang["code"] for lang in client.languages()}
    assert {"en", "zh", "zh-Hant", "yue"} <= codes and len(codes) == 38
    listed = requests.post(
        f"{url}translate", json={"q": ["a", "b"], "source": "en", "target": "de", "api_key": key}
    )
    assert listed.status_code == 200 and len(listed.json()["translatedText"]) == 2


@pytest.mark.parametrize(
    ("source", "target", "key", "status", "message"),
    [
        ("en", "fr", "wrong-key-of-some-length", 403, "Invalid API key"),
        ("en", "xx", None, 400, "xx is not supported"),
        ("en", "en", None, 400, "both 'en'"),
    ],
)
def test_libretranslate_errors(
    front: tuple[str, str], source: str, target: str, key: str | None, status: int, message: str
) -> None:
    url, good = front
    client = LibreTranslateAPI(url, api_key=key or good)
    with pytest.raises(urllib.error.HTTPError) as refused:
        client.translate("Hello", source, target)
    assert refused.value.code == status
    assert message in json.loads(refused.value.read())["error"]


def test_deepl_client(front: tuple[str, str]) -> None:
    url, key = front
    translator = deepl.Translator(key, server_url=url)
    one = translator.translate_text("Good morning.", source_lang="EN", target_lang="DE")
    assert isinstance(one.text, str) and one.detected_source_lang == "EN"
    assert one.billed_characters == len("Good morning.")
    several = translator.translate_text(["你好", "谢谢"], target_lang="EN-US")
    assert [one.detected_source_lang for one in several] == ["ZH", "ZH"]  # detected
    targets = {lang.code for lang in translator.get_target_languages()}
    assert {"EN-US", "EN-GB", "PT-BR", "ZH-HANT", "JA"} <= targets
    sources = {lang.code for lang in translator.get_source_languages()}
    assert {"EN", "ZH", "PT"} <= sources and "ZH-HANT" not in sources
    usage = translator.get_usage()
    assert usage.character.limit == LIMIT and usage.character.count >= len("Good morning.")


def test_deepl_errors_and_quota(front: tuple[str, str], server: Server) -> None:
    url, key = front
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("not-a-key-of-this-server", server_url=url).get_usage()
    translator = deepl.Translator(key, server_url=url)
    with pytest.raises(deepl.DeepLException, match="'target_lang' not supported"):
        translator.translate_text("Hello", target_lang="XX")
    with pytest.raises(deepl.DeepLException, match="requires the source_lang"):
        translator.translate_text(
            "Hello", target_lang="DE", extra_body_parameters={"glossary_id": "g"}
        )
    with pytest.raises(deepl.DeepLException, match="Glossary not found"):  # no such glossary
        translator.translate_text("Hello", source_lang="EN", target_lang="DE", glossary="g")
    before = translator.get_usage().character.count
    with pytest.raises(deepl.QuotaExceededException):
        translator.translate_text("x" * LIMIT, target_lang="DE")
    assert translator.get_usage().character.count == before  # refused whole, nothing counted


def test_html_keeps_its_tags(front: tuple[str, str]) -> None:
    url, key = front
    answer = requests.post(
        f"{url}translate",
        data={"q": "Press <b>Save</b> now.", "source": "en", "target": "zh", "format": "html",
              "api_key": key},
    )  # fmt: skip
    assert answer.status_code == 200 and "<s1>" not in answer.json()["translatedText"]


def test_usage_survives_a_restart(front: tuple[str, str], tmp_path: Path) -> None:
    keys = ClientKeys.open(tmp_path / "web_keys.json", character_limit=100)
    key = keys.keys[0]
    assert keys.reserve(key, 60) and not keys.reserve(key, 41)
    keys.close()  # (the front end's shutdown; the worker thread writes meanwhile)
    again = ClientKeys.open(tmp_path / "web_keys.json")
    assert again.used(key) == 60 and (tmp_path / DATABASE_FILE).is_file()
    again.refund(key, 60)
    deadline = time.monotonic() + 10 * SAVE_EVERY_S  # written behind, without close
    while ClientKeys.open(tmp_path / "web_keys.json").used(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ClientKeys.open(tmp_path / "web_keys.json").used(key) == 0


def test_bad_bodies(front: tuple[str, str]) -> None:
    url, key = front
    auth: dict[str, Any] = {"Authorization": f"DeepL-Auth-Key {key}"}
    missing = requests.post(f"{url}v2/translate", json={"target_lang": "DE"}, headers=auth)
    assert missing.status_code == 400 and "'text'" in missing.json()["message"]
    not_object = requests.post(f"{url}translate", json=["q"])
    assert not_object.status_code == 400 and "error" in not_object.json()


MARKDOWN = "# Notes\n\nFirst paragraph. Second sentence.\n\n```\nkeep = 1\n```\n\n- an item\n"
SUBTITLES = (
    "1\r\n00:00:01,000 --> 00:00:02,000\r\nHello.\r\n\r\n"
    "2\r\n00:00:03,000 --> 00:00:04,000\r\nBye.\r\n"
)


@pytest.mark.parametrize(("name", "content"), [("notes.md", MARKDOWN), ("film.srt", SUBTITLES)])
def test_deepl_client_translates_documents(
    front: tuple[str, str], tmp_path: Path, name: str, content: str
) -> None:
    """translate_document_from_filepath: upload, poll, download, unchanged client."""
    url, key = front
    source, target = tmp_path / name, tmp_path / f"out-{name}"
    source.write_bytes(content.encode())
    client = deepl.Translator(key, server_url=url)
    before = client.get_usage().character.count
    status = client.translate_document_from_filepath(source, target, target_lang="DE")
    assert status.done and status.billed_characters == len(content)
    translated = target.read_bytes().decode("utf-8")
    if name.endswith(".md"):
        assert translated.count("\n\n") >= 3 and "```\nkeep = 1\n```" in translated
    else:
        assert "00:00:01,000 --> 00:00:02,000\r\n" in translated
        assert "\r\n\r\n2\r\n00:00:03,000 --> 00:00:04,000\r\n" in translated
    assert client.get_usage().character.count == before + len(content)


def test_deepl_document_errors(front: tuple[str, str], tmp_path: Path) -> None:
    url, key = front
    client = deepl.Translator(key, server_url=url)
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.7\n")
    with pytest.raises(deepl.DeepLException, match="unsupported file type"):
        client.translate_document_from_filepath(pdf, tmp_path / "x.pdf", target_lang="DE")
    word = tmp_path / "report.docx"  # a supported type, but no Office package: its status says
    word.write_bytes(b"PK\x03\x04")
    with pytest.raises(deepl.DocumentTranslationException, match="not a ZIP package"):
        client.translate_document_from_filepath(word, tmp_path / "x.docx", target_lang="DE")
    broken = tmp_path / "broken.srt"
    broken.write_text("1\nnot a timing line\nHi\n")
    with pytest.raises(deepl.DocumentTranslationException, match="cue 1"):
        client.translate_document_from_filepath(broken, tmp_path / "x.srt", target_lang="DE")
    stranger = deepl.Translator("not-a-key-of-this-server", server_url=url)
    with pytest.raises(deepl.AuthorizationException):
        stranger.translate_document_upload(MARKDOWN.encode(), target_lang="DE", filename="a.md")
    handle = client.translate_document_upload(MARKDOWN.encode(), target_lang="DE", filename="a.md")
    forged = deepl.DocumentHandle(handle.document_id, "wrong-key")
    with pytest.raises(deepl.DeepLException, match="not found"):
        client.translate_document_get_status(forged)
    client.translate_document_wait_until_done(handle)
    first = client.translate_document_download(handle).content  # type: ignore[union-attr]
    # kept a while after its download: a download that broke off can be tried again
    assert client.translate_document_download(handle).content == first  # type: ignore[union-attr]
