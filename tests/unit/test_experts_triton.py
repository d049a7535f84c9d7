"""The pair kernels of a mixture's experts (:mod:`hymt_serve.engine.kernels.experts_triton`),
run on the CPU by Triton's interpreter, against a plain fp32 computation of
``grouped_experts``' contract: odd sizes (blocks past the width and the hidden size, inputs
not a whole number of blocks), k = 3, one token and five, experts repeated across tokens and
within a token, fp32 and fp16.

Each case runs in a fresh process (:mod:`interpreter`, which also says how it patches
Triton 3.5.1's interpreter for numpy 2).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from interpreter import run_interpreted

from hymt_serve.engine.kernels.experts_triton import pair_experts_applies

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed"
)

PAIRS = """
from hymt_serve.engine.kernels.experts import grouped_experts
from hymt_serve.engine.kernels.experts_triton import Tiles, launch, pair_experts

case = json.loads(sys.argv[1])
dtype = getattr(torch, case["dtype"])
experts, hidden, width = 6, case["hidden"], case["width"]
chosen = torch.tensor(case["chosen"])
tokens, k = chosen.shape
torch.manual_seed(0)
x = torch.randn(tokens, hidden).to(dtype)
weights = torch.rand(tokens, k) + 0.1
gate_up = (torch.randn(experts, 2 * width, hidden) * hidden**-0.5).to(dtype)
down = (torch.randn(experts, hidden, width) * width**-0.5).to(dtype)

# the contract, spelt out in fp64: per pair SiLU(x gate^T) * (x up^T) down^T, weighted, summed
expected = torch.zeros(tokens, hidden, dtype=torch.float64)
for t in range(tokens):
    for j in range(k):
        e = int(chosen[t, j])
        w = gate_up[e].double()
        gate, up = w[:width] @ x[t].double(), w[width:] @ x[t].double()
        h = torch.nn.functional.silu(gate) * up
        expected[t] += weights[t, j].double() * (down[e].double() @ h)

def run(rows):
    args = (x[rows], chosen[rows], weights[rows], gate_up, down)
    return launch(*args, Tiles(*case["tiles"])) if case["tiles"] else pair_experts(*args)

got = run(slice(None))
alone = [bool(torch.equal(run(slice(t, t + 1))[0], got[t])) for t in range(tokens)]
rel = lambda a: ((a.double() - expected).norm() / expected.norm()).item()
result = {
    "dtype": str(got.dtype), "shape": list(got.shape), "rel": rel(got),
    "finite": bool(torch.isfinite(got).all()), "alone": alone,
}
if dtype == torch.float32:
    result["grouped_rel"] = rel(grouped_experts(x, chosen, weights, gate_up, down))
print(json.dumps(result))
"""

# Five tokens, k = 3: expert 5 (a shared expert's place) in every token, expert 2 chosen by
# three tokens, and token 3 choosing expert 1 twice.
FIVE = [[0, 2, 5], [2, 4, 5], [1, 2, 5], [1, 1, 5], [3, 0, 5]]
# Tiles: gate rows, gate inputs, warps, down rows, down inputs, warps.
ODD = [16, 32, 4, 16, 16, 4]  # width 40: 2.5 blocks of rows; hidden 56: 3.5 of rows and inputs
EVEN = [8, 32, 2, 16, 16, 1]  # every block whole (the kernels' unmasked loads)


def make_case(dtype: str, hidden: int, width: int, chosen: list[list[int]], tiles: object) -> dict:
    return dict(dtype=dtype, hidden=hidden, width=width, chosen=chosen, tiles=tiles)


CASES = {
    "fp32, five tokens, odd sizes": make_case("float32", 56, 40, FIVE, ODD),
    "fp32, one token, odd sizes": make_case("float32", 56, 40, FIVE[:1], ODD),
    "fp32, five tokens, whole blocks": make_case("float32", 64, 48, FIVE, EVEN),
    "fp16, five tokens, odd sizes": make_case("float16", 56, 40, FIVE, ODD),
    "fp16, one token, whole blocks": make_case("float16", 64, 48, FIVE[3:4], EVEN),
    # the module's own tiles, larger than these sizes (one partial block each)
    "fp16, five tokens, the module's tiles": make_case("float16", 56, 40, FIVE, None),
}


@needs_triton
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_pair_kernels_equal_the_contract(case: dict[str, object]) -> None:
    result = run_interpreted(PAIRS, case)
    chosen = case["chosen"]
    assert isinstance(chosen, list)
    assert result["dtype"] == "torch.float32"
    assert result["shape"] == [len(chosen), case["hidden"]]
    assert result["finite"]
    if case["dtype"] == "float32":
        assert result["rel"] < 1e-5  # fp32 throughout: the order of the sums differs only
        assert result["grouped_rel"] < 1e-5  # and grouped_experts computes the same function
    else:
        # fp16 weights and inputs, fp32 sums; SiLU(gate) * up rounded to fp16 once
        assert result["rel"] < 1e-3
    # a token's output is the same alone as in its batch, to the bit
    assert all(result["alone"])


def test_applies_off_cuda_is_false() -> None:
    chosen = torch.zeros(1, 9, dtype=torch.int64)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert not pair_experts_applies(torch.zeros(1, 64, dtype=dtype), chosen)
