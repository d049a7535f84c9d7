"""Run a benchmark script under one of PyTorch's dense-product settings, set before it starts.

    python benchmarks/decode/blas_variant.py VARIANT [SCRIPT.py] ARGS...

VARIANT: ``default``; ``fp32-reduce`` (bf16 products reduce in fp32, split-K allowed);
``no-splitk`` (no split-K either: PyTorch allows it on cuBLASLt only); ``lt`` (cuBLASLt,
which ``blas_library: cublaslt`` selects in the server); ``lt-nosplitk``; ``cublas-one-row``
(one row of a bf16 product in cuBLAS, not the tiled Triton kernel: ``one_row_kernel:
cublas``). SCRIPT defaults to
``benchmarks/decode/bench_decode.py``; the rest goes to it. Results: benchmarks/decode/blas/.
"""

from __future__ import annotations

import runpy
import sys

import torch

SPLITK = {"fp32-reduce": (False, True), "no-splitk": (False, False), "lt-nosplitk": (False, False)}


def main() -> None:
    variant = sys.argv.pop(1)
    if variant not in {"default", "lt", "cublas-one-row", *SPLITK}:
        sys.exit(f"unknown variant {variant!r}")
    if variant == "cublas-one-row":
        from hymt_serve.engine.kernels import weight_only

        weight_only.set_plain_row_kernel("cublas")
    matmul = torch.backends.cuda.matmul
    if variant.startswith("lt"):
        torch.backends.cuda.preferred_blas_library("cublaslt")
    if variant in SPLITK:  # (reduced-precision reductions, split-K) for bf16 products
        matmul.allow_bf16_reduced_precision_reduction = SPLITK[variant]
    library = torch.backends.cuda.preferred_blas_library()
    print("variant", variant, matmul.allow_bf16_reduced_precision_reduction, library, flush=True)
    given = len(sys.argv) > 1 and sys.argv[1].endswith(".py")
    script = sys.argv.pop(1) if given else "benchmarks/decode/bench_decode.py"
    sys.path.insert(0, script.rsplit("/", 1)[0])
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
