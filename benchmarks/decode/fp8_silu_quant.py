"""The down projection's input under fp8 with dynamic per-token scales: ``silu(gate) * up``,
each row's absolute maximum, the row quantized to e4m3. Three ways:

- ``engine``: the engine's own code (``quantized.quantize_input`` over the SiLU product),
  compiled by inductor with the step functions' options. At one row inductor runs the maximum
  over 14,336 values as a split reduction: three kernels a layer in the batch-1 step
  (benchmarks/decode/quantized/fp8-per-token/kernels/);
- ``fused``: one Triton kernel here, one program per row holding the whole row in registers:
  the product, its maximum and the quantized row in one launch;
- ``static``: the same product quantized with a given scale (what an FP8 checkpoint's static
  input scale costs: one pointwise kernel), the floor for the other two.

32 layers in one CUDA graph (8 distinct inputs in turn), median of 5, per row count; the
fused kernel's e4m3 rows and scales are checked against the engine's.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/fp8_silu_quant.py --out DIR

``--check`` runs the fused kernel in Triton's interpreter (no GPU: ``TRITON_INTERPRET=1``)
against the engine's code run eagerly, on small rows.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hymt_serve.engine.kernels.quantized import FP8, FP8_MAX, quantize_input
from hymt_serve.engine.models import hunyuan_v1_dense as model

INTERMEDIATE = 14336  # a 7B's MLP width: gate_up has twice as many outputs


@triton.jit  # type: ignore[untyped-decorator]
def silu_quant_kernel(  # type: ignore[no-untyped-def]
    gu_ptr, out_ptr, scale_ptr, N, stride, BLOCK: tl.constexpr, FP8_LIMIT: tl.constexpr
):
    # Row r of gate_up [rows, 2N] (gate, then up) -> out[r] = e4m3(h / s), scale[r] = s, where
    # h = silu(gate) * up rounded to the activations' dtype, s = max(|h|) / 448 (at least 1e-12).
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    gate = tl.load(gu_ptr + row * stride + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride + N + cols, mask=ok, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(gu_ptr.dtype.element_ty).to(tl.float32)
    h = (silu * up).to(gu_ptr.dtype.element_ty).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(h), axis=0) / FP8_LIMIT, 1e-12)
    q = tl.minimum(tl.maximum(h / scale, -FP8_LIMIT), FP8_LIMIT)
    tl.store(out_ptr + row * N + cols, q.to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(scale_ptr + row, scale)


def fused(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, n, device=gate_up.device, dtype=FP8)
    scale = torch.empty(rows, 1, device=gate_up.device, dtype=torch.float32)
    block = triton.next_power_of_2(n)
    silu_quant_kernel[(rows,)](
        gate_up, out, scale, n, gate_up.stride(0), BLOCK=block, FP8_LIMIT=FP8_MAX,
        num_warps=16 if block >= 8192 else 4,
    )  # fmt: skip
    return out, scale


def engine(gate_up: torch.Tensor, input_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's code for the down projection's input (``model.output_step``, then
    ``quantized.linear``)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return quantize_input(F.silu(gate) * up, input_scale)


def layers(run: object, inputs: list[torch.Tensor]) -> None:
    from fp8_gemm import LAYERS

    for layer in range(LAYERS):
        run(inputs[layer % len(inputs)])  # type: ignore[operator]


def timings(out: Path, row_counts: list[int]) -> None:
    from bf16_row import COPIES, median_ms

    options = {"unroll_reductions_threshold": model.SPLIT_SUMS_READ}  # as model._compiled
    compiled = torch.compile(engine, fullgraph=True, options=options)
    empty = torch.empty(0, device="cuda")
    static = torch.tensor([0.05], device="cuda")
    rows_out: list[dict[str, object]] = []
    for rows in row_counts:
        torch._dynamo.reset()
        inputs = [
            torch.randn(rows, 2 * INTERMEDIATE, device="cuda", dtype=torch.bfloat16)
            for _ in range(COPIES)
        ]
        want_q, want_scale = compiled(inputs[0], empty)
        got_q, got_scale = fused(inputs[0])
        scale_error = ((got_scale - want_scale).abs() / want_scale).max().item()
        values = (got_q.float() * got_scale - want_q.float() * want_scale).norm()
        error = (values / (want_q.float() * want_scale).norm()).item()
        row: dict[str, object] = {"rows": rows, "scale_error": float(f"{scale_error:.3g}")}
        row["value_error"] = float(f"{error:.3g}")
        for name, run in (
            ("engine", partial(compiled, input_scale=empty)),
            ("fused", fused),
            ("static", partial(compiled, input_scale=static)),
        ):
            row[f"{name}_ms"] = round(median_ms(partial(layers, run, inputs)), 4)
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    lines = [
        f"# fp8's down-projection input, one kernel or inductor's: {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}",
        "",
        "32 layers in one CUDA graph, median of 5. engine: inductor over the engine's code "
        "(dynamic per-token scales); fused: one Triton kernel a layer; static: a given scale "
        "(the floor). Errors: the fused kernel's scales and dequantized rows against the "
        "engine's, relative.",
        "",
        "| rows | engine ms | fused ms | static ms | engine / fused | scale error | value error |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows_out:
        lines.append(
            f"| {r['rows']} | {r['engine_ms']} | {r['fused_ms']} | {r['static_ms']} | "
            f"{r['engine_ms'] / r['fused_ms']:.3f} | {r['scale_error']} | {r['value_error']} |"  # type: ignore[operator]
        )
    (out / "fp8_silu_quant.json").write_text(json.dumps(rows_out, indent=1) + "\n")
    (out / "fp8_silu_quant.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def check() -> list[list[float]]:
    """The fused kernel in Triton's interpreter against the engine's code run eagerly: each
    row's scale (its largest value, rounded to bf16 on two paths, a few bf16 steps apart at
    most) and the dequantized rows (within e4m3's rounding, a few per cent)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    torch.manual_seed(0)
    found = []
    for rows, n in ((1, 96), (3, 200), (2, 1024)):
        gate_up = torch.randn(rows, 2 * n).to(torch.bfloat16)
        gate_up[-1] *= 50  # rows of different sizes
        want_q, want_scale = engine(gate_up, torch.empty(0))
        got_q, got_scale = fused(gate_up)
        scale_error = ((got_scale - want_scale).abs() / want_scale).max().item()
        values = (got_q.float() * got_scale - want_q.float() * want_scale).norm()
        error = (values / (want_q.float() * want_scale).norm()).item()
        found.append([rows, n, scale_error, error])
    print(json.dumps(found))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 128])
    parser.add_argument("--check", action="store_true", help="Triton's interpreter, no GPU")
    args = parser.parse_args()
    if args.check:
        check()
        return
    args.out.mkdir(parents=True, exist_ok=True)
    timings(args.out, args.rows)


if __name__ == "__main__":
    main()
