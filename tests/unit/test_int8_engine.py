"""int8 weight-only projections in the fast engine (``quantization: int8``, for GPUs without
FP8 tensor cores): per-row scales, the product against a float64 reference, and the model
against its unquantized self (the measure and bounds of test_fp8_engine)."""

from __future__ import annotations

import torch
from runner_helpers import FORCED, against_unquantized
from test_fast_engine import PROMPTS, tiny_model

from hymt_serve.engine.kernels.quantized import linear, quantize_int8_rows


def test_rows_quantize_to_int8_within_half_a_step() -> None:
    torch.manual_seed(0)
    weight = torch.randn(40, 64) * torch.logspace(-3, 1, 40)[:, None]
    q, scale = quantize_int8_rows(weight)
    assert q.dtype == torch.int8 and scale.shape == (40,)
    assert (q.abs().amax(dim=1) == 127).all()
    back = q.float() * scale[:, None]
    assert ((back - weight).abs() <= scale[:, None] / 2 + 1e-7).all()


def test_the_int8_product_is_the_dequantized_reference() -> None:
    torch.manual_seed(1)
    x, weight = torch.randn(6, 64), torch.randn(32, 64)
    q, scale = quantize_int8_rows(weight)
    ours = linear(x, q, scale, torch.empty(0))
    expected = x.double() @ (q.double() * scale.double()[:, None]).T
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-5)


def test_an_int8_model_stays_close_to_the_unquantized_one() -> None:
    dense, int8, cosine = against_unquantized(tiny_model(), PROMPTS, FORCED, "int8")
    assert int8.weights.layers[0].gate_up.dtype == torch.int8
    described = int8.describe()
    assert described["projections"] == "int8 weight-only, a scale per output row"
    assert described["weight_bytes"] < dense.describe()["weight_bytes"]
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.98, cosine  # int8 rounds finer than e4m3
