"""How much faster the engine's one-row weight kernels run when their weight already sits in
L2: the ceiling of any L2 prefetch of the next projection's weight.

For each form (bf16 through the plain-row kernel, int8, int4) and projection shape of a 7B,
32 calls in one CUDA graph, median of 5: ``cold`` cycles through 8 distinct weights (nothing
left in L2 from the call before), ``hot`` repeats one weight (a weight under L2's 50 MB stays
there between calls). The engine's own configs and splits (``weight_only.linear``).

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/l2_hot.py --out DIR
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
from bf16_row import COPIES, median_ms
from fp8_gemm import LAYERS

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels.quantized import QUANTIZERS

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "down": (4096, 14336), "gate_up": (28672, 4096)}


def product(form: str, x: torch.Tensor, weight: tuple[torch.Tensor, ...]) -> torch.Tensor:
    if form == "bf16":
        return wo.plain_row(x, weight[0])
    return wo.linear(x, *weight)


def calls(form: str, x: torch.Tensor, weights: list[tuple[torch.Tensor, ...]]) -> None:
    """One pass: ``LAYERS`` products, cycling through ``weights``."""
    for layer in range(LAYERS):
        product(form, x, weights[layer % len(weights)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for form in ("bf16", "int8", "int4"):
        for name, (n, k) in SHAPES.items():
            weights = []
            for _ in range(COPIES):
                w = torch.randn(n, k, device="cuda") * 0.02
                weights.append((w.bfloat16(),) if form == "bf16" else QUANTIZERS[form](w))
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            nbytes = sum(t.numel() * t.element_size() for t in weights[0])

            cold_us = median_ms(partial(calls, form, x, weights)) / LAYERS * 1e3
            hot_us = median_ms(partial(calls, form, x, weights[:1])) / LAYERS * 1e3
            rows.append(
                {"form": form, "shape": name, "mb": round(nbytes / 2**20, 1),
                 "cold_us": round(cold_us, 2), "hot_us": round(hot_us, 2),
                 "cold_over_hot": round(cold_us / hot_us, 3),
                 "cold_tb_s": round(nbytes / cold_us / 1e6, 2)}
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            del weights
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "l2_hot.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "| form | shape | MB | cold us (TB/s) | hot us | cold / hot |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['form']} | {r['shape']} | {r['mb']} | {r['cold_us']} ({r['cold_tb_s']}) | "
        f"{r['hot_us']} | {r['cold_over_hot']} |"
        for r in rows
    ]
    (args.out / "l2_hot.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
