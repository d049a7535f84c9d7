"""Fixtures of the unit tests: the stub TorchServe of the web front end's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from web_stub import Upstream, serve_stub


@pytest.fixture(scope="module")
def stub_server() -> Iterator[Upstream]:
    yield from serve_stub()


@pytest.fixture
def upstream(stub_server: Upstream) -> Upstream:
    """The module's stub, with no replies and nothing received yet."""
    stub_server.replies.clear()
    stub_server.received.clear()
    return stub_server
