"""The GPU's attention kernels, run on the CPU by Triton's interpreter, against the paths the
CPU engine runs: the prompt kernel against the gathered ``packed_attention``, the decode
kernel (one split, and several with the combine kernel) against ``reference_decode_attention``.

Each case runs in a fresh process (:mod:`interpreter`, which also says how it patches
Triton 3.5.1's interpreter for numpy 2).
"""

from __future__ import annotations

import importlib.util

import pytest
from interpreter import run_interpreted

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed"
)

PROMPT = """
from hymt_serve.engine.kernels.attention import prompt_attention
from hymt_serve.engine.runners.inputs import PackedPrompts, packed_layout
from hymt_serve.engine.models.decoder import packed_attention

case = json.loads(sys.argv[1])
heads, kv_heads, dim, slots, length = case["heads"], case["kv_heads"], 64, 6, 160
prompts, starts = case["prompts"], case["starts"]
tokens, keys, rows = case["tokens"], case["keys"], len(prompts) + 1
layout = packed_layout(
    [list(range(n)) for n in prompts], [1, 3, 4][: len(prompts)], tokens=tokens, rows=rows,
    scratch_slot=slots - 1, starts=starts, keys=keys,
)
p = PackedPrompts.view(torch.tensor(layout), tokens, keys, rows)
torch.manual_seed(0)
# q as the fused projection leaves it: the query heads of a wider row (a strided view)
q = torch.randn(tokens, heads + kv_heads, dim)[:, :heads]
k_cache = torch.randn(slots, kv_heads, length, dim)
v_cache = torch.randn_like(k_cache)
k_cache[p.token_slots, :, p.positions] = torch.randn(tokens, kv_heads, dim)
v_cache[p.token_slots, :, p.positions] = torch.randn(tokens, kv_heads, dim)
same = p.sequence[:, None] == p.key_sequence[None, :]
mask = same & (p.key_positions[None, :] <= p.positions[:, None])
keys_, values = k_cache[p.key_slots, :, p.key_positions], v_cache[p.key_slots, :, p.key_positions]
expected = packed_attention(q, keys_, values, mask)
got = prompt_attention(q, k_cache, v_cache, p.positions, p.blocks, dim**-0.5)
real = sum(n - s for n, s in zip(prompts, starts))
print(json.dumps({
    "diff": (got[:real] - expected[:real]).abs().max().item(),
    "padding_finite": bool(torch.isfinite(got[real:]).all()),
}))
"""

DECODE = """
from hymt_serve.engine.kernels.attention import (
    _triton_decode_attention, num_splits, reference_decode_attention,
)

case = json.loads(sys.argv[1])
batch, length, heads, kv_heads, dim = case["batch"], case["length"], 8, 2, 64
torch.manual_seed(0)
q = torch.randn(batch, heads, dim)
new = torch.randn(2, batch, kv_heads, dim)
cache = torch.randn(2, 5, kv_heads, length, dim)
slots, positions = torch.tensor(case["slots"]), torch.tensor(case["positions"])
expected_cache = cache.clone()
expected = reference_decode_attention(
    q, new[0], new[1], expected_cache[0], expected_cache[1], slots, positions, dim**-0.5
)
got = _triton_decode_attention(q, new[0], new[1], cache[0], cache[1], slots, positions, dim**-0.5)
print(json.dumps({
    "diff": (got - expected).abs().max().item(),
    "splits": num_splits(batch, kv_heads, length),
    "cache_equal": bool(torch.equal(cache, expected_cache)),
}))
"""

CASES = {
    # three prompts, one with a kept prefix, one longer than a block and than a key tile
    "group of 4, kept prefix, long prompt": dict(
        heads=8, kv_heads=2, prompts=[30, 5, 100], starts=[10, 0, 3], tokens=128, keys=160
    ),
    # one query head per key head; the chunk of a prompt whose first 70 positions are cached
    "group of 1, a later chunk": dict(
        heads=2, kv_heads=2, prompts=[90], starts=[70], tokens=32, keys=96
    ),
    # a group that is not a power of two (query rows of the tile left unused)
    "group of 3": dict(heads=6, kv_heads=2, prompts=[17, 17], starts=[0, 1], tokens=40, keys=40),
}


DECODE_CASES = {
    "one split": dict(batch=3, length=32, slots=[0, 2, 4], positions=[3, 31, 10]),
    # a short cache still splits (up to 4 splits of a tile or more); in the second, the row at
    # position 20 leaves all but its first split empty
    "a short cache, split": dict(batch=1, length=100, slots=[3], positions=[99]),
    "a short cache, some splits empty": dict(
        batch=2, length=160, slots=[0, 1], positions=[20, 159]
    ),
    "several splits, then the combine kernel": dict(
        batch=2, length=1100, slots=[4, 1], positions=[1099, 300]
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_prompt_kernel_equals_the_gathered_path(case: dict[str, object]) -> None:
    result = run_interpreted(PROMPT, case)
    assert result["diff"] < 1e-4  # fp32 on both sides: the order of the sums differs only
    assert result["padding_finite"]


@pytest.mark.parametrize("case", DECODE_CASES.values(), ids=DECODE_CASES.keys())
def test_decode_kernel_equals_the_reference(case: dict[str, object]) -> None:
    result = run_interpreted(DECODE, case)
    assert result["diff"] < 1e-4
    assert result["cache_equal"]  # the new keys and values written where the reference does
    assert (result["splits"] > 1) == (case["length"] > 32)  # the combine kernel ran, or not
