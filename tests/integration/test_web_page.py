"""The translation page in headless Chromium against the real stack (TorchServe + front end).

Needs Debian's chromium at /usr/bin/chromium (.ci/run installs it) and the playwright package
(driving that browser; no browser download). A screenshot lands in loadtest/reports/.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import REPO
from web_stub import serving

from hymt_serve.ops.launcher import Server
from hymt_serve.web.app import create_app

pytestmark = [pytest.mark.integration, pytest.mark.browser]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PHONE = {"width": 375, "height": 740}
# The codes whose label the picker cuts off: a hidden select sized to one label (max-content)
# against the real one.
CUT_LABELS = """(id) => {
  const select = document.getElementById(id);
  const probe = document.createElement("select");
  probe.style.cssText = "position: absolute; visibility: hidden";
  Object.assign(probe.style, { width: "max-content", minWidth: "0", maxWidth: "none" });
  select.parentElement.append(probe);
  const shown = select.getBoundingClientRect().width;
  const cut = [];
  for (const option of select.options) {
    probe.replaceChildren(new Option(option.text));
    if (probe.getBoundingClientRect().width > shown + 0.5) cut.push(option.value);
  }
  probe.remove();
  return cut;
}"""
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def page_url(server: Server) -> Iterator[str]:
    with serving(create_app(server)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, page_url: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    page.goto(page_url)
    page.wait_for_function("window.hymt && window.hymt.ready === true")
    yield page
    context.close()


def test_translate_streams_into_the_page(page: Any) -> None:
    assert page.locator("#source option").count() == 39  # "Detect language", then the 38
    assert page.locator("#target option").count() == 38
    page.select_option("#source", "en")
    page.select_option("#target", "fr")
    page.fill("#input", "The weather is nice today. Let us go for a walk in the park.")
    assert page.inner_text("#count").startswith("60 / 4000")
    page.click("#translate")
    page.wait_for_function("document.getElementById('stats').textContent.includes('tokens/s')")
    assert page.inner_text("#output").strip()
    assert page.evaluate("window.hymt.streamEvents") >= 2  # text arrived in pieces
    assert page.get_attribute("#output", "dir") == "auto"
    assert page.is_hidden("#error")
    page.screenshot(path=str(REPO / "loadtest/reports/web-page.png"))


def test_glossary_and_context_go_with_the_request(page: Any) -> None:
    """The demo runs the HY-MT1.5 family: the page offers its glossary and context and sends
    them; a glossary line that is not "term = translation" is refused before any request."""
    assert page.is_visible("#options")
    assert page.inner_text("#model") == "hunyuan-mt · HY-MT1.5"
    page.click("#options summary")
    page.fill("#input", "Hunyuan runs on a GPU.")
    page.fill("#glossary", "Hunyuan = 混元\n\n GPU=图形处理器 ")
    with page.expect_request("**/api/translate") as sent:
        page.click("#translate")
    assert json.loads(sent.value.post_data)["glossary"] == [
        {"source": "Hunyuan", "target": "混元"},
        {"source": "GPU", "target": "图形处理器"},
    ]
    page.wait_for_function("document.getElementById('stats').textContent.includes('tokens/s')")
    assert page.inner_text("#output").strip() and page.is_hidden("#error")
    page.fill("#glossary", "no equals sign")
    requests_sent: list[str] = []
    page.on("request", lambda request: requests_sent.append(request.url))
    page.click("#translate")
    assert "term = translation" in page.inner_text("#error")
    assert not [url for url in requests_sent if url.endswith("/api/translate")]
    page.fill("#glossary", "")
    page.fill("#context", "Tom is the cat of the house.")
    with page.expect_request("**/api/translate") as sent:
        page.click("#translate")
    body = json.loads(sent.value.post_data)
    assert body["context"] == "Tom is the cat of the house." and "glossary" not in body


def test_formatted_text_is_sent_whole_and_comes_back_without_tags(page: Any) -> None:
    """HY-MT1.5 keeps formatting: the page offers it (and not Hy-MT2's options), sends it
    without streaming, and shows the answer with its markup restored."""
    page.click("#options summary")
    assert page.is_visible("#preserve_format-field") and page.is_hidden("#style-field")
    assert page.is_hidden("#refine-field")  # no Chimera model named
    page.select_option("#source", "en")
    page.select_option("#target", "zh")
    page.fill("#input", "Press **Save** to keep [the file](f.txt).")
    page.select_option("#preserve_format", "markdown")
    with page.expect_request("**/api/translate") as sent:
        page.click("#translate")
    body = json.loads(sent.value.post_data)
    assert body["preserve_format"] == "markdown" and body["stream"] is False
    page.wait_for_function("document.getElementById('stats').textContent.includes(' s')")
    assert "<s1>" not in page.inner_text("#output") and page.is_hidden("#error")


def test_hy_mt2_options_fill_the_request(browser: Any, page_url: str) -> None:
    """A Hy-MT2 model (its features given by /api/config, answered here by the test): the page
    shows its options and puts each one the user sets into the request."""
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    config = requests.get(f"{page_url}api/config", timeout=10).json()
    config["features"] = [
        "glossary",
        "context",
        "style",
        "preferences",
        "delimiters",
        "data_format",
    ]
    page.route("**/api/config", lambda route: route.fulfill(json=config))
    sent: list[dict[str, Any]] = []

    def answer(route: Any) -> None:
        sent.append(json.loads(route.request.post_data))
        route.fulfill(json={"translation": "ok", "translations": [{"text": "ok"}]})

    page.route("**/api/translate", answer)
    page.goto(page_url)
    page.wait_for_function("window.hymt && window.hymt.ready === true")
    page.click("#options summary")
    for name in ("style", "preferences", "delimiters", "data_format"):
        assert page.is_visible(f"#{name}-field"), name
    assert page.is_hidden("#preserve_format-field")
    page.fill("#input", "See you at the meeting.")
    page.fill("#style", " formal ")
    page.fill("#preferences", "Keep names in English\n\n Use metric units ")
    page.check("#delimiters")
    page.select_option("#data_format", "json")
    page.click("#translate")
    page.wait_for_function("document.getElementById('output').textContent === 'ok'")
    [body] = sent
    assert body["style"] == "formal" and body["delimiters"] is True
    assert body["preferences"] == ["Keep names in English", "Use metric units"]
    assert body["data_format"] == "json" and "preserve_format" not in body
    context.close()


def test_ctrl_enter_translates_and_swap_exchanges_the_languages(page: Any) -> None:
    page.select_option("#source", "zh")
    page.select_option("#target", "ja")
    page.fill("#input", "你好，世界。")
    page.press("#input", "Control+Enter")
    page.wait_for_function("document.getElementById('stats').textContent.includes('tokens/s')")
    output = page.inner_text("#output")
    page.click("#swap")
    assert (page.input_value("#source"), page.input_value("#target")) == ("ja", "zh")
    assert page.input_value("#input") == output


FRENCH = "Le train part à sept heures et demie, et nous arriverons à Lyon vers midi."


def test_detect_language_is_the_default_and_the_stream_says_what_it_found(page: Any) -> None:
    """The source picker starts on "Detect language"; a streamed translation sends source_lang
    auto, and its last line's detection is shown; swap waits for it, then takes it."""
    assert page.input_value("#source") == "auto"
    assert page.evaluate("document.querySelector('#source option').textContent").startswith(
        "Detect language"
    )
    assert page.is_disabled("#swap") and page.is_hidden("#detected")
    page.select_option("#target", "de")
    page.fill("#input", FRENCH)
    with page.expect_request("**/api/translate") as sent:
        page.click("#translate")
    assert json.loads(sent.value.post_data)["source_lang"] == "auto"
    page.wait_for_selector("#detected:not([hidden])")
    assert page.evaluate("window.hymt.streamEvents") >= 2  # it was a stream
    assert page.inner_text("#detected") == "Detected: French · 法语 (fr)"
    assert page.is_enabled("#swap") and page.is_hidden("#error")
    output = page.inner_text("#output")
    page.click("#swap")
    assert (page.input_value("#source"), page.input_value("#target")) == ("de", "fr")
    assert page.input_value("#input") == output and page.is_hidden("#detected")
    page.select_option("#source", "auto")
    assert page.is_disabled("#swap")  # a new choice of "Detect language": nothing detected yet


def test_a_whole_answer_that_could_not_detect_says_so(page: Any) -> None:
    """A whole (not streamed) answer with ``detected: null``: the page says the language was not
    detected, and swap stays off; with a detection, the whole answer's is shown too."""
    replies = iter([None, {"language": "ja", "confidence": 0.99}])

    def answer(route: Any) -> None:
        whole = {"translation": "ok", "translations": [{"text": "ok"}], "usage": {}}
        route.fulfill(json={**whole, "detected": next(replies)})

    page.route("**/api/translate", answer)
    page.fill("#input", "OK")
    page.click("#translate")
    page.wait_for_selector("#detected:not([hidden])")
    assert "Could not detect" in page.inner_text("#detected") and page.is_disabled("#swap")
    page.click("#translate")
    page.wait_for_function("document.getElementById('detected').textContent.includes('ja')")
    assert page.is_enabled("#swap")
    page.click("#swap")
    assert (page.input_value("#source"), page.input_value("#target")) == ("en", "ja")


def test_errors_are_readable(page: Any) -> None:
    page.select_option("#source", "de")
    page.select_option("#target", "de")
    page.fill("#input", "Hallo")
    page.click("#translate")
    page.wait_for_selector("#error:not([hidden])")
    assert "same language" in page.inner_text("#error")
    page.select_option("#target", "en")
    page.fill("#input", "x" * 4001)
    assert "over" in (page.get_attribute("#count", "class") or "")
    page.click("#translate")
    page.wait_for_function("document.getElementById('error').textContent.includes('too long')")
    assert "at most 4000" in page.inner_text("#error")


def test_phone_width_has_no_sideways_scrolling(browser: Any, page_url: str) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    page.goto(page_url)
    page.wait_for_function("window.hymt && window.hymt.ready === true")
    page.select_option("#source", "ar")
    page.fill("#input", "مرحبا بالعالم")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.screenshot(path=str(REPO / "loadtest/reports/web-page-phone.png"))
    context.close()


def test_the_tiny_model_shows_the_demo_notice(page: Any, page_url: str) -> None:
    config = requests.get(f"{page_url}api/config", timeout=30).json()
    assert config["demo_model"] is True  # the server fixture serves the random-weight model
    assert page.is_visible("#demo-notice")
    assert "random weights" in page.inner_text("#demo-notice")


def test_pickers_fit_a_phone(browser: Any, page_url: str) -> None:
    context = browser.new_context(viewport=PHONE, is_mobile=True)
    page = context.new_page()
    page.goto(page_url)
    page.wait_for_function("window.hymt && window.hymt.ready === true")
    for selector in ("#source", "#swap", "#target", "#demo-notice"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["x"] >= 0, selector
        assert box["x"] + box["width"] <= PHONE["width"], selector
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.evaluate(CUT_LABELS, "source") == []
    assert page.evaluate(CUT_LABELS, "target") == []
    context.close()


def test_favicon(page: Any, page_url: str) -> None:
    linked = page.evaluate(
        """async () => {
             const response = await fetch(document.querySelector("link[rel=icon]").href);
             return [response.status, response.headers.get("content-type")];
           }"""
    )
    assert linked[0] == 200 and linked[1].startswith("image/svg+xml")
    response = page.goto(f"{page_url}favicon.ico")
    assert response.status == 200
    assert response.headers["content-type"].startswith("image/")


def test_the_proxy_answers_like_the_request_api(page_url: str) -> None:
    url = f"{page_url}api/translate"
    batch = requests.post(
        url, json={"text": ["Hello", "Good night"], "target_lang": "fr"}, timeout=120
    )
    assert batch.status_code == 200, batch.text
    assert len(batch.json()["translations"]) == 2
    plain = requests.post(
        url,
        json={"text": "Hello", "target_lang": "fr", "stream": False, "max_new_tokens": 4},
        timeout=120,
    )
    assert plain.headers["Content-Type"].startswith("application/json")
    assert plain.json()["translations"][0]["output_tokens"] <= 4
    typo = requests.post(url, json={"text": "Hello", "target_language": "fr"}, timeout=120)
    assert typo.status_code == 400
    assert typo.json()["error_type"] == "invalid_request"


MARKDOWN_FILE = (
    "# Notes\n\nFirst paragraph here. It has two sentences.\n\n```\ncode stays\n```\n\n"
    "- item one\n- item two with `code`\n"
)
SRT_FILE = (
    "\ufeff1\r\n00:00:01,000 --> 00:00:02,000\r\nHello.\r\n\r\n"
    "2\r\n00:00:03,000 --> 00:00:04,500\r\n<i>Bye.</i>\r\n"
)
DROP = """([name, text]) => {
  const data = new DataTransfer();
  data.items.add(new File([text], name, { type: "application/octet-stream" }));
  const zone = document.getElementById("document");
  for (const type of ["dragover", "drop"]) {
    const options = { dataTransfer: data, bubbles: true, cancelable: true };
    zone.dispatchEvent(new DragEvent(type, options));
  }
}"""


def download(page: Any) -> tuple[str, str]:
    """Click the download link: (suggested file name, content as UTF-8, a BOM kept)."""
    page.wait_for_selector("#download:not([hidden])")
    with page.expect_download() as info:
        page.click("#download")
    saved = info.value
    return saved.suggested_filename, Path(saved.path()).read_bytes().decode("utf-8")


def test_a_chosen_file_shows_progress_and_downloads_translated(page: Any) -> None:
    page.select_option("#source", "en")
    page.select_option("#target", "fr")
    with page.expect_request("**/api/translate") as sent:
        page.set_input_files(
            "#file",
            files=[{"name": "notes.md", "mimeType": "text/markdown",
                    "buffer": MARKDOWN_FILE.encode()}],
        )  # fmt: skip
    body = json.loads(sent.value.post_data)
    assert body["document"] == MARKDOWN_FILE and body["format"] == "markdown"
    assert body["stream"] is True and "text" not in body
    name, text = download(page)
    assert name == "notes.fr.md"
    assert text.startswith("# ") and "\n\n```\ncode stays\n```\n\n- " in text
    assert page.evaluate("window.hymt.progress")[-1] == 4  # heading, paragraph, two items
    assert "4 segments in" in page.inner_text("#doc-status")
    assert page.evaluate("document.getElementById('doc-progress').value") == 1
    assert page.is_hidden("#error")
    page.screenshot(path=str(REPO / "loadtest/reports/web-page-document.png"), full_page=True)


def test_a_dropped_subtitle_file_keeps_its_numbers_and_timings(page: Any) -> None:
    page.select_option("#source", "en")
    page.select_option("#target", "de")
    page.evaluate(DROP, ["subs.srt", SRT_FILE])
    name, text = download(page)
    assert name == "subs.de.srt"
    assert text.startswith("\ufeff1\r\n00:00:01,000 --> 00:00:02,000\r\n")
    assert "\r\n\r\n2\r\n00:00:03,000 --> 00:00:04,500\r\n" in text


def test_files_that_cannot_be_translated_get_readable_errors(page: Any) -> None:
    cases = [
        ("report.pdf", b"%PDF-1.7", "Choose a .txt, .md, .html, .srt, .xlf, .po, .docx"),
        ("latin1.txt", "caf\u00e9".encode("latin-1"), "not UTF-8"),
        ("broken.srt", b"1\nnot a timing line\nHi\n", "cue 1 (line 2)"),
    ]
    for name, content, message in cases:
        page.set_input_files(
            "#file", files=[{"name": name, "mimeType": "text/plain", "buffer": content}]
        )
        page.wait_for_function(
            "(m) => document.getElementById('error').textContent.includes(m)", arg=message
        )
        assert page.is_hidden("#download")
        if name == "broken.srt":  # refused by the server: no progress bar left running
            assert page.is_hidden("#doc-progress")


def test_the_proxy_streams_a_document_progress_then_the_result(page_url: str) -> None:
    document = "\n\n".join(f"Paragraph number {n}." for n in range(12)) + "\n"
    with requests.post(
        f"{page_url}api/translate",
        json={"document": document, "target_lang": "ja", "stream": True},
        stream=True,
        timeout=300,
    ) as reply:
        assert reply.status_code == 200
        assert reply.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    progress = [line["progress"] for line in lines[:-1]]
    assert progress and progress[-1] == {"done": 12, "total": 12}
    assert [p["done"] for p in progress] == sorted(p["done"] for p in progress)
    final = lines[-1]
    assert final["segments"] == 12 and final["document"].count("\n\n") >= 11
    assert final["document"].endswith("\n")


def test_a_server_that_needs_keys_asks_for_one_and_counts_it(
    server: Server, browser: Any, tmp_path: Path
) -> None:
    """Off loopback (``require_keys``) the page asks for a client key, keeps it for the tab and
    sends it with every call; the characters count against that key."""
    from hymt_serve.web.keys import ClientKeys

    keys = ClientKeys.open(tmp_path / "web_keys.json")
    app = create_app(server, client_keys=keys, require_keys=True)
    with serving(app) as url:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#key-form", state="visible")
            assert page.evaluate("window.hymt.ready") is not True
            page.fill("#key", keys.keys[0].key)
            page.click("#key-form button")
            page.wait_for_function("window.hymt && window.hymt.ready === true")
            assert page.is_hidden("#key-form")
            page.fill("#input", "Good morning.")
            page.click("#translate")
            page.wait_for_function("document.getElementById('stats').textContent.includes(' s')")
            assert page.is_hidden("#error")
            assert keys.used(keys.keys[0]) == len("Good morning.")
        finally:
            context.close()
