"""FP8 projections on FP8 tensor cores (compute capability 8.9+): ``torch._scaled_mm`` against
the dequantized reference, and a 7B-shaped model quantized at load against its bf16 self."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import against_unquantized
from test_fast_engine_gpu import PROMPTS

from hymt_serve.engine.kernels.quantized import linear, quantize_tensor
from hymt_serve.ops.tiny_model import random_7b_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
        reason="needs a GPU with FP8 tensor cores",
    ),
]


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("static", [False, True])
def test_scaled_mm_matches_the_dequantized_reference(rows: int, static: bool) -> None:
    """Static input scales, and dynamic ones per token (rows of sizes 100 x apart)."""
    torch.manual_seed(rows)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    x *= torch.logspace(-1, 1, rows, device="cuda", dtype=torch.bfloat16)[:, None]
    weight = torch.randn(6144, 4096, device="cuda") * 0.02
    q, scale = quantize_tensor(weight)
    input_scale = torch.tensor([0.01], device="cuda") if static else torch.empty(0, device="cuda")
    ours = linear(x, q, scale, input_scale)
    reference = linear(x.cpu(), q.cpu(), scale.cpu(), input_scale.cpu())  # the CPU path
    assert ours.dtype == torch.bfloat16
    error = (ours.float().cpu() - reference.float()).norm() / reference.float().norm()
    assert error < 1e-2  # bf16 output rounding and the accumulation order
    rows_error = (ours.float().cpu() - reference.float()).norm(dim=1) / reference.float().norm(
        dim=1
    )
    # Each row on its own: one scale for all rows would flush the small ones under e4m3's
    # range (error ~1); per-token scales keep each within its own rounding. On an H200 one
    # row of 64 measured 0.015 against 0.003 for the others (why that row is not known), so
    # the bound sits at a few per cent, far below a flushed row.
    assert (rows_error < 5e-2).all()


@pytest.mark.parametrize("head", [False, True])
def test_a_7b_model_in_fp8_stays_close_to_bf16(head: bool) -> None:
    """Random weights make a chaotic network: any change to one layer grows over 32 layers,
    so FP8's logits are 0.89 cosine-similar to bf16's here (measured 2026-12-01; row-wise
    per-token scaling gave the same). The products themselves are held to their reference
    above; this bound catches a projection gone wrong (a wrong scale or layout gives ~0).
    ``head``: the LM head (tied to the embedding) in e4m3 too (quantize_lm_head)."""
    forced = torch.tensor([[5, 77, 301, 9]] * len(PROMPTS), device="cuda")
    _, fp8, cosine = against_unquantized(
        random_7b_model("cuda"),
        PROMPTS,
        forced,
        "fp8",
        max_batch_size=8,
        max_seq_len=128,
        quantize_head=head,
    )
    info = fp8.describe()
    assert info["projection_kernel"] == "torch._scaled_mm (tensor-wise)"
    assert info["cuda_graphs"] is True
    assert info["weight_bytes"] < (7.6e9 if head else 8.5e9)  # bf16: 15.0 GB
    assert str(info["lm_head"]).startswith("fp8" if head else "bfloat16")
    print(f"fp8 (head {head}) vs bf16 logits cosine", cosine.tolist())
    assert cosine.mean() >= 0.85 and cosine.min() >= 0.8
