"""One pass over a 7B-shaped model's decoder projections (32 layers of fused qkv, o, gate_up,
down; CUDA graph), bf16 against FP8 with row-wise and with tensor-wise scales, per token count.

A program, not a test: it tells which ``torch._scaled_mm`` scaling the fast engine should use
for decode-sized products. Writes ``fp8_gemm.json`` to ``--out``.

    PYTHONPATH=handler python benchmarks/decode/fp8_gemm.py --out DIR
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from hymt_serve.engine.kernels.quantized import FP8, FP8_MAX

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o, gate_up, down
LAYERS = 32


def timed_graph(run: object, repeats: int = 20) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()  # type: ignore[operator]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()  # type: ignore[operator]
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def bf16(xs: list[torch.Tensor], weights: list[torch.Tensor]) -> None:
    for _ in range(LAYERS):
        for x, w in zip(xs, weights, strict=True):
            F.linear(x, w)


def fp8(xs: list[torch.Tensor], weights: list[tuple[torch.Tensor, ...]]) -> None:
    for _ in range(LAYERS):
        for x, (scale_a, scale_b, q) in zip(xs, weights, strict=True):
            torch._scaled_mm(x, q.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 128, 512])
    args = parser.parse_args()
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in SHAPES]
    rowwise = [
        (w.float() / (w.float().abs().amax(1, keepdim=True) / FP8_MAX)).to(FP8) for w in dense
    ]
    rowwise = [(q, torch.full((q.shape[0],), 1e-3, device="cuda")) for q in rowwise]
    tensorwise = [(q, torch.tensor(1e-3, device="cuda")) for q, _ in rowwise]  # only shapes matter
    rows = []
    for m in args.tokens:
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES]
        one = torch.ones((), device="cuda")
        ones_m = torch.ones(m, 1, device="cuda")
        xq = [x.to(FP8) for x in xs]

        runs = {
            "bf16": partial(bf16, xs, dense),
            "fp8_rowwise": partial(fp8, xq, [(ones_m, s.view(1, -1), q) for q, s in rowwise]),
            "fp8_tensorwise": partial(fp8, xq, [(one, s, q) for q, s in tensorwise]),
        }
        result = {"tokens": m}
        for name, run in runs.items():
            result[f"{name}_ms"] = round(timed_graph(run), 3)
        print(json.dumps(result), flush=True)
        rows.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_gemm.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=2
    ) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
