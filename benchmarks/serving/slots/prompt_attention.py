"""Prompt tokens' attention in a mixed step, three ways, one layer of the 7B's shape (GPU).

A program, not a test. For a packed layout of prompt chunks (``packed_layout``, as the mixed
step builds it) it times, in CUDA graphs, after the chunks' K/V are written into their slots:

- ``gathered``: what ``forward_pass`` did before the prompt kernel (and does on the CPU):
  gather every prompt's keys and values into one padded buffer and run SDPA with the packed
  mask (``packed_attention``);
- ``per_token``: the decode kernel with every prompt token as a row of its own (its slot, its
  position);
- ``slots``: the prompt kernel (``prompt_attention``), blocks of up to 16 tokens of one prompt
  reading their slot in place.

It prints the largest difference of the last two from ``gathered`` on the real tokens. Shapes:
the sentence mix at 256 and 64 users (12 or 4 new prompts of 26 tokens, 12 of them a kept
prefix), one 256-token chunk of a long prompt at positions 512-767 (the (256, 2,048) bucket)
and a 1,000-token prompt alone (a prefill bucket of 1,024). Writes ``prompt_attention.json``.

    PYTHONPATH=handler python benchmarks/serving/slots/prompt_attention.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from hymt_serve.engine.kernels.attention import decode_attention, prompt_attention
from hymt_serve.engine.models.hunyuan_v1_dense import packed_attention
from hymt_serve.engine.runners.inputs import PackedPrompts, packed_layout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "decode"))
from fp8_gemm import timed_graph

KV_HEADS, HEADS, DIM, SLOTS, MAX_LEN = 8, 32, 128, 257, 1536


def layout(prompts: list[int], starts: list[int], tokens: int, keys: int) -> PackedPrompts:
    """The packed layout's device tensors for prompts of these lengths and kept starts."""
    flat = packed_layout(
        [list(range(n)) for n in prompts],
        list(range(len(prompts))),
        tokens=tokens,
        rows=32,
        scratch_slot=SLOTS - 1,
        starts=starts,
        keys=keys,
    )
    return PackedPrompts.view(torch.tensor(flat, device="cuda"), tokens, keys, 32)


def compare(name: str, prompts: list[int], starts: list[int], tokens: int, keys: int) -> dict:
    torch.manual_seed(0)
    k_cache = torch.randn(SLOTS, KV_HEADS, MAX_LEN, DIM, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    p = layout(prompts, starts, tokens, keys)
    q = torch.randn(tokens, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tokens, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    same = p.sequence[:, None] == p.key_sequence[None, :]
    mask = same & (p.key_positions[None, :] <= p.positions[:, None])
    scale = DIM**-0.5

    def write() -> None:
        k_cache[p.token_slots, :, p.positions] = k
        v_cache[p.token_slots, :, p.positions] = v

    def gathered() -> torch.Tensor:
        write()
        keys_ = k_cache[p.key_slots, :, p.key_positions]
        values = v_cache[p.key_slots, :, p.key_positions]
        return packed_attention(q, keys_, values, mask)

    def per_token() -> torch.Tensor:
        write()
        return decode_attention(q, k, v, k_cache, v_cache, p.token_slots, p.positions, scale)

    def slots() -> torch.Tensor:
        write()
        return prompt_attention(q, k_cache, v_cache, p.positions, p.blocks, scale)

    real = sum(n - s for n, s in zip(prompts, starts, strict=True))
    row: dict = {"shape": name, "prompts": len(prompts), "packed_tokens": real}
    row["bucket"] = [tokens, keys]
    base_us, base = 1000 * timed_graph(gathered, 200), gathered()
    row["gathered_us"] = round(base_us, 2)
    for way, fn in (("per_token", per_token), ("slots", slots)):
        us, out = 1000 * timed_graph(fn, 200), fn()
        row[f"{way}_us"] = round(us, 2)
        row[f"{way}_over_gathered"] = round(us / base_us, 3)
        row[f"{way}_max_abs_diff"] = (out[:real].float() - base[:real].float()).abs().max().item()
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = [
        compare("sentence mix, 256 users", [26] * 12, [12] * 12, 192, 768),
        compare("sentence mix, 64 users", [26] * 4, [12] * 4, 64, 256),
        compare("one chunk of a long prompt", [768], [512], 256, 2048),
        compare("a 1,000-token prompt alone", [1000], [0], 1024, 2048),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0), "rows": rows}
    (args.out / "prompt_attention.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
