"""``quantize_lm_head``: the LM head quantized like the projections (fp8 e4m3 tensor-wise, or
int8 with a scale per row, also beside int4 projections), the embedding reading the same
quantized table when the two are tied, and the settings that refuse it where it cannot apply.
The measure is the one of test_fp8_engine: cosine similarity of teacher-forced logits against
the unquantized model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runner_helpers import FORCED, against_unquantized
from test_fast_engine import PROMPTS, tiny_model

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationRow
from hymt_serve.engine.engine import Engine, load_engine
from hymt_serve.engine.kernels.quantized import FP8, QUANTIZERS
from hymt_serve.engine.models.weights import embed_tokens
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.ops.quantize import write_fp8_checkpoint


@pytest.mark.parametrize(
    ("form", "head", "mean", "low"),
    [("fp8", "fp8", 0.98, 0.95), ("int8", "int8", 0.99, 0.98), ("int4", "int8", 0.9, 0.85)],
)
def test_a_tied_head_is_quantized_once_and_feeds_the_embedding(
    form: str, head: str, mean: float, low: float
) -> None:
    """int4 projections take an int8 head; the bounds are the projections' own (int4's from
    test_weight_only)."""
    dtype = FP8 if head == "fp8" else torch.int8
    model = tiny_model()
    dense = model.model.embed_tokens.weight.detach().clone()
    _, runner, cosine = against_unquantized(model, PROMPTS, FORCED, form, quantize_head=True)
    weights = runner.weights
    assert weights.lm_head.dtype == dtype and weights.embed.dtype == dtype
    assert weights.embed.data_ptr() == weights.lm_head.data_ptr()  # one table
    assert model.lm_head.weight.numel() == 0  # the dense copy is gone
    assert "its table shared with the embedding" in str(runner.describe()["lm_head"])
    # the embedding rows are the quantized table's, dequantized
    ids = torch.tensor([0, 5, 300, dense.shape[0] - 1])
    q, scale = QUANTIZERS[head](dense)
    expected = q[ids].float() * (scale if head == "fp8" else scale[ids, None])
    assert torch.equal(embed_tokens(ids, weights), expected.to(dense.dtype))
    # the bounds of the projections alone (test_fp8_engine, test_int8_engine) still hold
    assert cosine.mean() >= mean and cosine.min() >= low, cosine


def test_an_untied_head_is_quantized_and_the_embedding_stays_plain() -> None:
    model = tiny_model(tie_word_embeddings=False)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    _, runner, cosine = against_unquantized(model, PROMPTS, FORCED, "int8", quantize_head=True)
    weights = runner.weights
    assert weights.lm_head.dtype == torch.int8 and weights.embed.dtype == torch.float32
    assert weights.embed_scale.numel() == 0
    assert runner.describe()["lm_head"] == "int8, a scale per row"
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.98, cosine


def test_a_plain_model_keeps_its_head_and_refuses_to_quantize_it_alone() -> None:
    runner = build_fast_runner(tiny_model(), max_batch_size=2, max_seq_len=32)
    assert runner.describe()["lm_head"] == "float32"
    with pytest.raises(ValueError, match="fp8, int8 or int4 projections"):
        build_fast_runner(tiny_model(), max_batch_size=2, max_seq_len=32, quantize_head=True)


@pytest.mark.parametrize("quantization", ["nf4", "bnb-int8"])
def test_the_setting_is_refused_where_the_head_cannot_follow(quantization: str) -> None:
    raw = {"model_path": "/m", "quantization": quantization, "quantize_lm_head": True}
    with pytest.raises(ConfigurationError, match="quantize_lm_head needs quantization"):
        Settings.from_mapping(raw)


def test_the_setting_is_a_boolean() -> None:
    with pytest.raises(ConfigurationError, match="quantize_lm_head must be true or false"):
        Settings.from_mapping({"model_path": "/m", "quantize_lm_head": "yes"})
    settings = Settings.from_mapping({"model_path": "/m", "quantization": "fp8"})
    assert settings.loading.quantize_lm_head is False


def load(path: Path, **settings: object) -> Engine:
    raw = {"model_path": str(path), "max_new_tokens": 8, "max_input_tokens": 128, **settings}
    return load_engine(Settings.from_mapping(raw, environ={}))


def test_an_fp8_checkpoint_serves_with_its_head_in_fp8(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    checkpoint = write_fp8_checkpoint(tiny_model_dir, tmp_path / "tiny-fp8")
    engine = load(checkpoint, quantize_lm_head=True)
    described = engine.describe()
    assert described["fast"]["lm_head"] == (
        "fp8 e4m3, tensor-wise scale, its table shared with the embedding"
    )
    assert engine.runner.weights.lm_head.dtype == FP8  # type: ignore[attr-defined]
    (result,) = engine.generate([GenerationRow((1, 5, 6, 7), 4)])
    assert result.finish_reason == "stop" or len(result.token_ids) == 4


def test_a_bf16_model_refuses_a_quantized_head_at_load(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="this model's are none: set quantization"):
        load(tiny_model_dir, quantize_lm_head=True)
