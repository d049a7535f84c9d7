"""The fast engine on Hy-MT2-30B-A3B's full shape (``hy_v3``, random bf16 weights, 60 GB)
against transformers' ``HYV3ForCausalLM`` on the same weights (GPU with at least 70 GB free).

Why a cosine bound and not tokens: in bf16 the two forwards round differently (transformers
sums the routed experts in bf16 in expert order, then adds the shared expert in fp32; the fast
engine sums all of them in fp32; cuBLAS and the grouped GEMM split their sums differently), and
a router whose 128 sigmoid scores of random weights lie within bf16 steps of each other can
then choose another expert for a token, which moves that token's hidden state by a whole
expert's contribution. So the logits of a position agree to a cosine near 1, not bit for bit,
and a few positions may agree less: the test bounds the median and the worst position.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from runner_helpers import teacher_forced_logits
from transformers import PreTrainedModel

from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.ops.tiny_moe import random_30b_a3b_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.mem_get_info()[0] < 70e9,
        reason="needs a CUDA GPU with 70 GB free",
    ),
]

PROMPTS = (
    (120000, 3, 8821, 302, 77, 4510, 9, 1200, 56, 78, 4312, 29, 11),
    (120000, 3, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200, 1300),
    (120000, 3, 64000, 12, 5),
)
FORCED = torch.tensor([[5, 77, 301, 9, 14, 200], [400, 2, 18, 18, 7, 7], [3, 4, 5, 6, 7, 8]])


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    # (its routers' weights are spread as a trained router's: see random_30b_a3b_model)
    built: PreTrainedModel = random_30b_a3b_model("cuda")
    return built


@pytest.fixture(scope="module")
def hf_logits(model: PreTrainedModel) -> list[torch.Tensor]:
    """transformers' logits after each prompt and each forced token, before the fast engine
    restacks the experts (it rebinds the same memory; the values stay)."""
    out = []
    with torch.no_grad():
        for prompt, forced in zip(PROMPTS, FORCED, strict=True):
            ids = torch.tensor([list(prompt) + forced.tolist()], device="cuda")
            out.append(model(ids).logits[0, len(prompt) - 1 :].float())
    return out


@pytest.fixture(scope="module")
def fast(model: PreTrainedModel, hf_logits: list[torch.Tensor]) -> FastRunner:
    return build_fast_runner(model, max_batch_size=8, max_seq_len=256)


def test_graphs_are_captured(fast: FastRunner) -> None:
    info = fast.describe()
    assert info["cuda_graphs"] is True
    assert fast.graphs and fast.prefill_graphs


def test_logits_match_transformers(fast: FastRunner, hf_logits: list[torch.Tensor]) -> None:
    ours = teacher_forced_logits(fast, PROMPTS, FORCED.cuda())
    cosines = [
        float(torch.nn.functional.cosine_similarity(ours[i, j], theirs[j], dim=0))
        for i, theirs in enumerate(hf_logits)
        for j in range(theirs.shape[0])
    ]
    print("cosines", [round(c, 5) for c in cosines])
    assert statistics.median(cosines) > 0.999
    assert min(cosines) > 0.98
