"""Engine choice: auto/hf/fast, fallbacks with a reason, and the same tokens either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hymt_serve.engine.engine import HFEngine, load_engine
from hymt_serve.engine.types import GenerationRow, SamplingParams
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import build_prompt
from hymt_serve.request.settings import Settings


def load(model_dir: Path, **settings: Any) -> HFEngine:
    raw = {"model_path": str(model_dir), "max_new_tokens": 10, "max_input_tokens": 128, **settings}
    return load_engine(Settings.from_mapping(raw, environ={}))


def rows_for(engine: HFEngine) -> list[GenerationRow]:
    texts = ["Hello", "A longer sentence, to give the batch different prompt lengths.", "你好"]
    return [
        GenerationRow(tuple(engine.encode_prompt(build_prompt(t, None, LANGUAGES["de"])[0])), n)
        for t, n in zip(texts, (10, 4, 7), strict=True)
    ]


def test_auto_on_cpu_uses_hf_and_says_why(tiny_model_dir: Path) -> None:
    engine = load(tiny_model_dir)
    described = engine.describe()
    assert engine.fast is None
    assert (described["engine"], described["fallback_reason"]) == ("hf", "auto: no CUDA device")


def test_fast_engine_on_cpu_gives_the_same_greedy_tokens_as_hf(tiny_model_dir: Path) -> None:
    hf = load(tiny_model_dir, engine="hf")
    fast = load(tiny_model_dir, engine="fast")
    assert fast.fast is not None and fast.describe()["engine"] == "fast"
    assert fast.describe()["fast"]["cuda_graphs"] is False
    expected = hf.generate(rows_for(hf))
    got = fast.generate(rows_for(fast))
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.text for r in got] == [r.text for r in expected]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in expected]


def test_fast_engine_samples(tiny_model_dir: Path) -> None:
    fast = load(tiny_model_dir, engine="fast")
    rows = [GenerationRow(r.prompt_ids, r.max_new_tokens, SamplingParams()) for r in rows_for(fast)]
    assert [r.output_tokens for r in fast.generate(rows)] == [10, 4, 7]


def test_unsupported_model_falls_back_with_the_reason(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hymt_serve.engine import fast as fast_engine

    def refuse(*args: object, **kwargs: object) -> None:
        raise fast_engine.UnsupportedModelError("test: not this model")

    monkeypatch.setattr(fast_engine.FastGenerator, "from_model", refuse)
    engine = load(tiny_model_dir, engine="fast")
    assert engine.fast is None
    assert engine.describe()["fallback_reason"] == "test: not this model"
    assert engine.generate(rows_for(engine))[1].output_tokens == 4


def test_injected_out_of_memory_is_a_507_error_and_the_engine_keeps_serving(
    tiny_model_dir: Path,
) -> None:
    from hymt_serve.request.errors import OutOfMemory

    engine = load(tiny_model_dir, engine="hf", test_oom_max_new_tokens=3)
    rows = rows_for(engine)
    with pytest.raises(OutOfMemory) as info:
        engine.generate([*rows, GenerationRow(rows[0].prompt_ids, 3)])
    assert info.value.status == 507
    assert [r.output_tokens for r in engine.generate(rows)] == [10, 4, 7]
