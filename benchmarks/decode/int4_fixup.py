"""int4's one row with its split sum done by the last program of each column tile, against
the engine's kernel followed by a sum of its own.

At one row int4's tiles (128 columns) split a 7B's qkv 32 ways and its attention output and
down projection 64 ways, so that even a 4,096-column product fills the GPU. Each product's
fp32 partial sums ``[splits, 1, out]`` are then summed by a kernel of its own: inductor writes
out a sum inside the next kernel only below ``model.SPLIT_SUMS_READ`` parts. That is about 96
kernels of a batch-1 step. Tiles that split at most 8 ways made the products slower by more
than the sums cost (benchmarks/decode/quantized/attention-splits/).

Here the kernel keeps its splits and sums them itself. Each program stores its partial sums,
then counts itself in with an atomic add on its column tile's counter. The program that comes
last (the count reaches the splits) reads the tile's partial sums back through L2, writes
their sum, and resets the counter for the next launch. This is split-K with its reduction in
the last program, as stream-K GEMMs do their fixup. The counters are one int32 per column
tile and row, zero between launches, so one buffer serves every launch of a stream.

Variants, 32 layers of each projection in one CUDA graph (8 distinct weights in turn, none in
L2), median of 5, bf16 inputs:

- ``engine``: ``weight_only.launch`` on the engine's one-row tile, then ``parts.sum(0)``;
- ``kernel``: the engine's kernel alone (what the sum costs on top);
- ``fixup``: the kernel here, on the same tile (its sums checked against ``engine``'s).

gate_up splits 8 ways, and the step already reads that sum inside the SiLU product's kernel:
for it, ``kernel`` is the time to beat, not ``engine``.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/int4_fixup.py --out DIR

``--check`` runs the fixup kernel once per shape against the reference in Triton's
interpreter (no GPU: ``TRITON_INTERPRET=1``, fp16 inputs, small shapes).
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels import weight_only_triton as kernels

PROJECTIONS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096)}
PROJECTIONS["down"] = (4096, 14336)


@triton.jit(do_not_specialize=["M", "SPLITS"])  # type: ignore[untyped-decorator]
def fixup_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, s_ptr, parts_ptr, out_ptr, counts_ptr, M, N, K, stride_xm, SPAN, SPLITS,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BF16_PAIRS: tl.constexpr,
):  # fmt: skip
    # The engine's one_row_kernel for int4 (its int4_row), then the last program of each
    # (column tile, row) sums the tile's splits into out [M, N].
    row = tl.program_id(2)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    start = tl.program_id(1) * SPAN
    sums = kernels.int4_row(
        x_ptr + row * stride_xm, w_ptr, s_ptr, cols, col_ok, N, K, start, SPAN, GROUP, BLOCK_N,
        BLOCK_K, BF16_PAIRS,
    )  # fmt: skip
    tl.store(parts_ptr + tl.program_id(1) * M * N + row * N + cols, sums, mask=col_ok)
    tl.debug_barrier()  # every thread's partial sums stored before the count
    counter = counts_ptr + row * tl.num_programs(0) + tl.program_id(0)
    seen = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if seen == SPLITS - 1:
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for split in range(0, SPLITS):
            total += tl.load(
                parts_ptr + split * M * N + row * N + cols,
                mask=col_ok,
                other=0.0,
                cache_modifier=".cg",  # from L2: another SM's stores are not in this L1
            )
        tl.store(out_ptr + row * N + cols, total, mask=col_ok)
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


class Fixup:
    """The fixup kernel's buffers for one shape: partial sums, the sum, zeroed counters."""

    def __init__(self, x: torch.Tensor, weight: torch.Tensor, config: wo.Config) -> None:
        rows, n = x.shape[0], wo.out_features(weight)
        self.config = config
        self.splits = wo.splits_for(weight, config)
        self.parts = torch.empty(self.splits, rows, n, device=x.device, dtype=torch.float32)
        self.out = torch.empty(rows, n, device=x.device, dtype=torch.float32)
        tiles = triton.cdiv(n, config.block_n)
        self.counts = torch.zeros(rows * tiles, device=x.device, dtype=torch.int32)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        config, (rows, inputs) = self.config, x.shape
        n = wo.out_features(weight)
        group = inputs // scale.shape[1]
        span = triton.cdiv(inputs, self.splits * config.block_k) * config.block_k
        grid = (triton.cdiv(n, config.block_n), self.splits, rows)
        fixup_kernel[grid](
            x, weight, scale, self.parts, self.out, self.counts, rows, n, inputs, x.stride(0),
            span, self.splits, GROUP=group, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            BF16_PAIRS=wo.bf16_pairs(x) if x.is_cuda else False, num_warps=config.warps,
            num_stages=config.stages,
        )  # fmt: skip
        return self.out


class FixupByWeight:
    """A :class:`Fixup` for each of the weights, picked by the weight it is called with."""

    def __init__(
        self, x: torch.Tensor, weights: list[tuple[torch.Tensor, torch.Tensor]], config: wo.Config
    ) -> None:
        self.by_weight = {id(q): Fixup(x, q, config) for q, _ in weights}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.by_weight[id(weight)](x, weight, scale)


def engine(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return kernel(x, weight, scale).sum(0)


def kernel(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    config = wo.config_for(wo.INT4, 1, x.dtype)
    group = x.shape[1] // scale.shape[1]
    return wo.launch(x, weight, scale, wo.INT4, group, wo.splits_for(weight, config), config)


def layers(run: object, x: torch.Tensor, weights: list[tuple[torch.Tensor, ...]]) -> None:
    from bf16_row import COPIES
    from fp8_gemm import LAYERS

    for layer in range(LAYERS):
        run(x, *weights[layer % COPIES])  # type: ignore[operator]


def timings(out: Path) -> None:
    from bf16_row import COPIES, median_ms
    from fp8_gemm import LAYERS

    torch.manual_seed(0)
    rows: list[dict[str, object]] = []
    config = wo.config_for(wo.INT4, 1, torch.bfloat16)
    for name, (n, k) in PROJECTIONS.items():
        weights = [
            wo.quantize_int4_groups(torch.randn(n, k, device="cuda") * 0.02) for _ in range(COPIES)
        ]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        fixup = FixupByWeight(x, weights, config)
        want = engine(x, *weights[0])
        got = fixup(x, *weights[0])
        error = ((got - want).norm() / want.norm()).item()
        read = LAYERS * n * k // 2
        for variant, run in (("engine", engine), ("kernel", kernel), ("fixup", fixup)):
            ms = median_ms(partial(layers, run, x, weights))
            rows.append(
                {"shape": name, "variant": variant, "splits": wo.splits_for(weights[0][0], config),
                 "ms": round(ms, 4), "tb_s": round(read / ms / 1e9, 2),
                 "error": float(f"{error:.3g}") if variant == "fixup" else 0.0}
            )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        del weights, fixup
        torch.cuda.empty_cache()
    lines = [
        f"# int4's one row, split sums in the last program: {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}",
        "",
        "32 layers of each projection in one CUDA graph, median of 5, the engine's one-row tile "
        f"{tuple(config)}; error: the fixup's sum against the engine's, relative.",
        "",
        "| shape | splits | engine ms | kernel alone ms | fixup ms | engine / fixup | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in PROJECTIONS:
        mine = {r["variant"]: r for r in rows if r["shape"] == name}
        lines.append(
            f"| {name} | {mine['engine']['splits']} | {mine['engine']['ms']} | "
            f"{mine['kernel']['ms']} | {mine['fixup']['ms']} | "
            f"{mine['engine']['ms'] / mine['fixup']['ms']:.3f} | {mine['fixup']['error']} |"  # type: ignore[operator]
        )
    total = {v: sum(r["ms"] for r in rows if r["variant"] == v) for v in ("engine", "fixup")}  # type: ignore[misc]
    lines += [
        "",
        f"Four projections: engine {total['engine']:.4f} ms, fixup {total['fixup']:.4f} ms.",
    ]
    (out / "int4_fixup.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "int4_fixup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def check() -> list[list[object]]:
    """The fixup kernel in Triton's interpreter against the dequantized reference, twice per
    shape (the counters must be zero again after a launch)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import triton.runtime.interpreter as interpreter

    patch = interpreter._patch_lang_tensor

    def patched(tensor: object) -> None:  # numpy 2 and a loop bound: see tests/interpreter.py
        patch(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])  # type: ignore[attr-defined]

    interpreter._patch_lang_tensor = patched
    torch.manual_seed(0)
    found = []
    for n, k, splits_to in ((200, 256, 1), (96, 512, 4), (64, 1024, 8)):
        q, scale = wo.quantize_int4_groups(torch.randn(n, k))
        x = torch.randn(1, k).half()
        config = wo.Config(1, 32, 32, 1, 1, triton.cdiv(n, 32) * splits_to)
        fixup = Fixup(x, q, config)
        want = wo.reference(x.float(), q, scale).float()
        for _ in range(2):
            got = fixup(x, q, scale)
            error = ((got - want).norm() / want.norm()).item()
            found.append([n, k, fixup.splits, error, int(fixup.counts.abs().sum())])
    print(json.dumps(found))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--check", action="store_true", help="Triton's interpreter, no GPU")
    args = parser.parse_args()
    if args.check:
        check()
        return
    args.out.mkdir(parents=True, exist_ok=True)
    timings(args.out)


if __name__ == "__main__":
    main()
