"""FP8 projections in the fast engine (``quantization: fp8``), checked on the CPU against a
dequantized reference written here, and against the unquantized model.

The kernel's numbers are held to a float64 reference of the same quantization (tight bounds).
The whole model is held to the unquantized one by the cosine similarity of their logits,
teacher-forced so that both see the same tokens: e4m3 keeps 3 mantissa bits, each weight and
activation moves by at most 1/16 of its size, and over a product's terms those errors mostly
cancel. On this 2-layer, 64-wide random model the cosine measured 0.989 on average and 0.962
at worst over 21 positions; the bounds (mean >= 0.98, each >= 0.95) sit just under that. Top-1
agreement is not a bound here: a random model's logits are nearly flat, so quantization noise
flips its argmax where a trained model's would not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from runner_helpers import FORCED, against_unquantized
from test_fast_engine import PROMPTS, tiny_model

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.checkpoints import loading
from hymt_serve.engine.kernels.quantized import FP8, FP8_MAX, linear, quantize_tensor


def reference_fp8_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the FP8 path must compute, in float64: the weight scaled by its absolute maximum
    over 448, each input row by its own (dynamic, per token), each rounded to e4m3,
    multiplied, scaled back."""
    w, a = weight.double(), x.double()
    w_scale, a_scale = w.abs().max() / FP8_MAX, a.abs().amax(dim=1, keepdim=True) / FP8_MAX
    wq = (w / w_scale).to(FP8).double() * w_scale
    aq = (a / a_scale).to(FP8).double() * a_scale
    return aq @ wq.T


def test_a_tensor_quantizes_to_e4m3_within_its_rounding() -> None:
    torch.manual_seed(0)
    weight = torch.randn(96, 64)
    q, scale = quantize_tensor(weight)
    assert q.dtype == FP8 and scale.shape == (1,) and scale.dtype == torch.float32
    assert q.float().abs().max() == FP8_MAX
    back = q.float() * scale
    normal = weight.abs() > weight.abs().max() / 64  # not subnormal in e4m3
    assert ((back - weight).abs() <= weight.abs() / 16 + 1e-12)[normal].all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fp8_product_is_the_dequantized_reference(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 64).to(dtype)
    x[3] *= 1e5  # a row far larger than the others: per-token scales keep the rest in range
    weight = torch.randn(48, 64)
    q, scale = quantize_tensor(weight)
    ours = linear(x, q, scale, torch.empty(0))
    assert ours.dtype == dtype and ours.shape == (5, 48)
    expected = reference_fp8_product(x.float(), weight)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    # each row to its own size
    bound = tolerance * expected.abs() + tolerance * 10 * expected.abs().amax(1, keepdim=True)
    assert ((ours.double() - expected).abs() <= bound).all()
    # and each row is close to the exact product (the quantization's own error, a few percent;
    # one scale over all rows would flush the small rows under e4m3's range: error 1)
    exact = x.double() @ weight.double().T
    assert ((ours.double() - exact).norm(dim=1) / exact.norm(dim=1) < 0.06).all()


def test_a_static_input_scale_is_used_as_given() -> None:
    torch.manual_seed(2)
    x, weight = torch.randn(3, 32), torch.randn(16, 32)
    q, scale = quantize_tensor(weight)
    given = torch.tensor([0.02])  # x / 0.02 clamps at 448: values over 8.96 saturate
    ours = linear(x * 100, q, scale, given)
    xq = (x * 100 / 0.02).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * 0.02
    torch.testing.assert_close(ours, F.linear(xq, q.float() * scale))


def test_plain_weights_take_the_plain_product() -> None:
    x, weight = torch.randn(2, 8), torch.randn(4, 8)
    assert torch.equal(linear(x, weight, torch.empty(0), torch.empty(0)), F.linear(x, weight))


def test_an_fp8_model_stays_close_to_the_unquantized_one() -> None:
    model = tiny_model()
    dense, fp8, cosine = against_unquantized(model, PROMPTS, FORCED, "fp8")
    assert fp8.weights.layers[0].qkv.dtype == FP8
    assert model.model.layers[0].self_attn.q_proj.weight.numel() == 0  # the dense copy is gone
    described = fp8.describe()
    assert described["projections"].startswith("fp8 e4m3")
    assert described["projection_kernel"] == "dequantized reference"
    assert described["weight_bytes"] < dense.describe()["weight_bytes"]
    assert cosine.mean() >= 0.98 and cosine.min() >= 0.95, cosine


def test_gpus_without_fp8_tensor_cores_are_refused_with_what_to_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10")
    with pytest.raises(ConfigurationError, match=r"NVIDIA A10 has 8\.6: use .*'int8'"):
        loading._fp8(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert loading._fp8(torch.device("cuda", 0)) == "fp8"
