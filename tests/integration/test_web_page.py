"""The translation page in headless Chromium against the real stack (TorchServe + front end).

Needs Debian's chromium at /usr/bin/chromium (.ci/run installs it) and the playwright package
(driving that browser; no browser download). A screenshot lands in loadtest/reports/.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, free_ports
from werkzeug.serving import make_server

from hymt_serve.launcher import Server
from hymt_serve.web.app import create_app

pytestmark = [pytest.mark.integration, pytest.mark.browser]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
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
    [port] = free_ports(1)
    web = make_server("127.0.0.1", port, create_app(server), threaded=True)
    thread = threading.Thread(target=web.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/"
    web.shutdown()


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
    assert page.locator("#source option").count() == 38
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
