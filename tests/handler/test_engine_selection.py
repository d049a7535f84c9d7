"""Engine choice: auto/hf/fast, fallbacks with a reason, and the same tokens either way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fakes import make_context, set_batch
from faulty_handler import with_faults

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.errors import ConfigurationError, DeviceOutOfMemory
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationRow, SamplingParams
from hymt_serve.engine.codec import TokenCodec
from hymt_serve.engine.engine import Engine, load_engine
from hymt_serve.request.errors import as_service_error
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import build_prompt


def load(model_dir: Path, **settings: Any) -> Engine:
    raw = {"model_path": str(model_dir), "max_new_tokens": 10, "max_input_tokens": 128, **settings}
    return load_engine(Settings.from_mapping(raw, environ={}))


def rows_for(engine: Engine) -> list[GenerationRow]:
    texts = ["Hello", "A longer sentence, to give the batch different prompt lengths.", "你好"]
    return [
        GenerationRow(tuple(engine.encode_prompt(build_prompt(t, None, LANGUAGES["de"])[0])), n)
        for t, n in zip(texts, (10, 4, 7), strict=True)
    ]


def test_auto_on_cpu_uses_hf_and_says_why(tiny_model_dir: Path) -> None:
    engine = load(tiny_model_dir)
    described = engine.describe()
    assert not engine.fast
    assert (described["engine"], described["fallback_reason"]) == ("hf", "auto: no CUDA device")


def test_fast_engine_on_cpu_gives_the_same_greedy_tokens_as_hf(tiny_model_dir: Path) -> None:
    hf = load(tiny_model_dir, engine="hf")
    fast = load(tiny_model_dir, engine="fast")
    assert fast.fast and fast.describe()["engine"] == "fast"
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
    from hymt_serve.engine.runners import build as fast_engine

    def refuse(*args: object, **kwargs: object) -> None:
        raise fast_engine.UnsupportedModelError("test: not this model")

    monkeypatch.setattr(fast_engine, "build_fast_runner", refuse)
    engine = load(tiny_model_dir, engine="fast")
    assert not engine.fast
    assert engine.describe()["fallback_reason"] == "test: not this model"
    assert engine.generate(rows_for(engine))[1].output_tokens == 4


def test_injected_out_of_memory_is_a_507_error_and_the_engine_keeps_serving(
    tiny_model_dir: Path,
) -> None:
    raw = {"model_path": str(tiny_model_dir), "max_new_tokens": 10, "max_input_tokens": 128}
    settings = Settings.from_mapping({**raw, "engine": "hf"}, environ={})
    engine = load_engine(with_faults(settings, oom=3))
    rows = rows_for(engine)
    with pytest.raises(DeviceOutOfMemory) as info:
        engine.generate([*rows, GenerationRow(rows[0].prompt_ids, 3)])
    assert as_service_error(info.value).status == 507
    assert [r.output_tokens for r in engine.generate(rows)] == [10, 4, 7]
    # The rows of the failed prefill were tried alone: the others of that batch succeeded.
    futures = [engine.submit(row) for row in [*rows, GenerationRow(rows[0].prompt_ids, 3)]]
    engine.run(futures)
    assert [f.result().output_tokens for f in futures[:3]] == [10, 4, 7]
    assert isinstance(futures[3].exception(), DeviceOutOfMemory)


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_a_prompt_filling_the_model_context_is_served_beside_others(
    tiny_model_dir: Path, tmp_path: Path, engine: str
) -> None:
    """prompt + max_new_tokens == max_position_embeddings: the first request uses the whole
    context and is served, and so is the other request of its batch (batch mode). It used to
    pass the load-time check and fail the fast engine's, a 500 for the whole batch."""
    positions = 64
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(
        json.dumps({**config, "max_position_embeddings": positions})
    )
    body = {"text": "The whole context, please.", "target_lang": "de"}
    codec = TokenCodec.load(Settings.from_mapping({"model_path": str(model_dir)}, environ={}))
    prompt = len(codec.encode(build_prompt(body["text"], None, LANGUAGES["de"])[0]))
    handler = HunyuanMTHandler()
    context = make_context(
        {
            "model_path": str(model_dir),
            "engine": engine,
            "max_input_tokens": prompt,
            "max_new_tokens": positions - prompt,
        },
        model_dir,
    )
    handler.initialize(context)
    bodies = [{**body, "max_new_tokens": positions - prompt}, {"text": "Hi", "target_lang": "fr"}]
    set_batch(context, len(bodies))
    replies = handler.handle([{"body": b} for b in bodies], context)
    assert [context.get_response_status(i)[0] for i in range(2)] == [200, 200]
    usage = json.loads(replies[0])["usage"]  # type: ignore[index]
    assert usage == {"input_tokens": prompt, "output_tokens": positions - prompt}


def test_fp8_runs_on_the_fast_engine_and_says_so(tiny_model_dir: Path) -> None:
    """quantization: fp8 (the CPU runs its dequantized reference): the fast engine whatever
    `engine: auto` would pick here, FP8 projections in the describe output, and text out."""
    engine = load(tiny_model_dir, quantization="fp8")
    described = engine.describe()
    assert engine.fast and described["quantization"] == "fp8"
    fast = described["fast"]
    assert fast["projections"].startswith("fp8 e4m3")
    assert fast["projection_kernel"] == "dequantized reference"
    dense = load(tiny_model_dir, engine="fast").describe()["fast"]
    assert fast["weight_bytes"] < dense["weight_bytes"]
    results = engine.generate(rows_for(engine))
    assert all(1 <= r.output_tokens <= n for r, n in zip(results, (10, 4, 7), strict=True))


def test_fp8_has_no_transformers_fallback(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"fp8.*fast engine"):
        load(tiny_model_dir, quantization="fp8", engine="hf")
