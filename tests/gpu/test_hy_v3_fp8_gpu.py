"""The fast engine's FP8 ``hy_v3`` on Hy-MT2-30B-A3B's full width (random weights, 8 of its 48
layers so that a bf16 copy fits beside the FP8 one; GPU with FP8 tensor cores and 30 GB free).
A module of its own: test_hy_v3_gpu holds the whole 60 GB bf16 model for its module's life.

What is held, and why these bounds:
- the pair kernels (decode of a few tokens, e4m3 weights read weight-only) against the same
  e4m3 weights dequantized and summed in fp32: the kernels round SiLU(gate) * up to bf16, as
  the bf16 path does, so their relative error is bf16's (bound 1e-2);
- ``torch._scaled_grouped_mm`` (many tokens: inputs quantized to e4m3 per token too) against
  that reference: e4m3 inputs move each product by a few percent (bound 0.06, the dense
  family's for the same rounding, test_fp8_engine);
- the model's teacher-forced logits against the bf16 engine on the same weights: e4m3
  weights with a scale per row (experts) or per tensor (attention, with inputs quantized per
  token) keep logits to a cosine near 1 (bounds: median 0.99, worst 0.9, as a router's near
  ties may choose another expert for a token, see test_hy_v3_gpu).
"""

from __future__ import annotations

import copy
import statistics

import pytest
import torch
from runner_helpers import teacher_forced_logits
from test_hy_v3_gpu import FORCED, PROMPTS

from hymt_serve.engine.kernels.experts import route, with_shared
from hymt_serve.engine.kernels.experts_fp8 import FP8, grouped_fp8_experts
from hymt_serve.engine.kernels.experts_triton import pair_experts, reference
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.ops.tiny_moe import random_30b_a3b_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available()
        or torch.cuda.get_device_capability() < (8, 9)
        or torch.cuda.mem_get_info()[0] < 30e9,
        reason="needs a CUDA GPU with FP8 tensor cores and 30 GB free",
    ),
]


@pytest.fixture(scope="module")
def runners() -> tuple[FastRunner, FastRunner]:
    model = random_30b_a3b_model("cuda", layers=8)
    dense = build_fast_runner(copy.deepcopy(model), max_batch_size=8, max_seq_len=256)
    fp8 = build_fast_runner(model, max_batch_size=8, max_seq_len=256, quantize="fp8")
    return dense, fp8


def test_the_experts_are_e4m3_and_the_graphs_captured(runners: tuple[FastRunner, ...]) -> None:
    dense, fp8 = runners
    layer = fp8.weights.layers[1]
    assert layer.experts_gate_up.dtype == FP8 and layer.experts_gate_up.shape == (129, 1536, 2048)
    assert fp8.describe()["cuda_graphs"] is True and fp8.graphs
    assert fp8.describe()["weight_bytes"] < 0.55 * dense.describe()["weight_bytes"]


@pytest.mark.parametrize("tokens", [1, 14, 200])
def test_both_expert_paths_against_the_dequantized_sum(
    runners: tuple[FastRunner, ...], tokens: int
) -> None:
    _, fp8 = runners
    layer = fp8.weights.layers[3]
    torch.manual_seed(tokens)
    x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
    chosen, weights = route(x, layer.router, layer.expert_bias, 8, 2.826)
    chosen, weights = with_shared(chosen, weights, 128)
    stacks = (layer.experts_gate_up, layer.experts_down)
    scales = (layer.experts_gate_up_scale, layer.experts_down_scale)
    expected = reference(x, chosen, weights, *stacks, scales).double()

    def rel(got: torch.Tensor) -> float:
        return float((got.double() - expected).norm() / expected.norm())

    assert rel(pair_experts(x, chosen, weights, *stacks, scales)) < 1e-2
    grouped = rel(grouped_fp8_experts(x, chosen, weights, stacks, scales))
    print(f"{tokens} tokens: grouped (scaled_grouped_mm) relative error {grouped:.4f}")
    assert grouped < 0.06


def test_fp8_logits_stay_close_to_bf16(runners: tuple[FastRunner, ...]) -> None:
    dense, fp8 = runners
    ours = teacher_forced_logits(fp8, PROMPTS, FORCED.cuda())
    theirs = teacher_forced_logits(dense, PROMPTS, FORCED.cuda())
    cosines = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).flatten().tolist()
    print("cosines", [round(c, 5) for c in cosines])
    assert statistics.median(cosines) > 0.99
    assert min(cosines) > 0.9
