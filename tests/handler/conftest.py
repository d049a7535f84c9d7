"""Handler-tier fixtures."""

from __future__ import annotations

import pytest
from fakes import FakeEngine


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    import hymt_serve.engine.engine

    engine = FakeEngine()
    monkeypatch.setattr(hymt_serve.engine.engine, "load_engine", lambda *args, **kw: engine)
    return engine
