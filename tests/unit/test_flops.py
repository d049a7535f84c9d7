"""The serving benchmarks' FLOP accounting (loadtest/serving/flops.py): the 7B's FLOPs per token
counted by hand, and utilisation from a result row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest/serving"))
from flops import bf16_matmul_rate, flops_per_token, utilisation

SEVEN_B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "vocab_size": 128167,
}


def test_the_7b_multiplies_its_projections_and_lm_head_once_per_token() -> None:
    q, kv, o = 4096 * 4096, 2 * 4096 * 1024, 4096 * 4096
    mlp = 3 * 4096 * 14336
    weights = 32 * (q + kv + o + mlp) + 128167 * 4096  # 7.50e9
    assert flops_per_token(SEVEN_B) == 2 * weights
    assert flops_per_token(SEVEN_B) == pytest.approx(15.0e9, rel=1e-3)


def test_head_dim_and_kv_heads_default_as_transformers_does() -> None:
    config = {**SEVEN_B, "head_dim": None, "num_key_value_heads": None}
    mha = 2 * (32 * (4 * 4096 * 4096 + 3 * 4096 * 14336) + 128167 * 4096)
    assert flops_per_token(config) == mha


def test_utilisation_counts_prompt_and_output_tokens() -> None:
    row = {"prompt_tokens_per_s": 7000.0, "output_tokens_per_s": 3000.0}
    assert utilisation(row, 15e9, 750e12) == {"model_tflops": 150.0, "mfu_pct": 20.0}
    assert utilisation(row, 15e9, None) == {"model_tflops": 150.0, "mfu_pct": None}
    unknown = {"prompt_tokens_per_s": None, "output_tokens_per_s": 3000.0}
    assert utilisation(unknown, 15e9, 750e12) == {"model_tflops": None, "mfu_pct": None}


def test_no_matrix_rate_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the rate is measured")
    assert bf16_matmul_rate() is None
