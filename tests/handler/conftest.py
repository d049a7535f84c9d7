"""Handler-tier fixtures."""

from __future__ import annotations

import pytest
from fakes import FakeEngine, SentParts

from hymt_serve.request import door


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    import hymt_serve.engine.engine

    engine = FakeEngine()
    monkeypatch.setattr(hymt_serve.engine.engine, "load_engine", lambda *args, **kw: engine)
    return engine


@pytest.fixture(autouse=True)
def sent_parts(monkeypatch: pytest.MonkeyPatch) -> SentParts:
    """The handler's stream events and replies sent ahead, instead of a TorchServe socket."""
    parts = SentParts()
    monkeypatch.setattr(door, "send_intermediate_predict_response", parts)
    return parts
