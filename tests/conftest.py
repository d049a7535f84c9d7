"""Fixtures shared by every tier: tiny model folders built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from hymt_serve.ops.tiny_model import default_tokenizer_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_tokenizer_dir() -> Path:
    """The real Hunyuan 7B-family tokenizer (../shared/hunyuan-tokenizer); skip when absent."""
    found = default_tokenizer_dir()
    if found is None:
        pytest.skip("../shared/hunyuan-tokenizer (the real Hunyuan tokenizer) is not present")
    return found


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight model: the real tokenizer when present, else the fallback one."""
    from hymt_serve.ops.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), default_tokenizer_dir())


@pytest.fixture(scope="session")
def real_tokenizer_model_dir(shared_tokenizer_dir: Path, tiny_model_dir: Path) -> Path:
    """The tiny model built with the real tokenizer (skips when that tokenizer is absent)."""
    return tiny_model_dir


@pytest.fixture(scope="session")
def fallback_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with the project's own small tokenizer (works anywhere)."""
    from hymt_serve.ops.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-fallback"), None)
