"""Compiling the weight-only kernel for an H100/H200 (sm_90) here, without a GPU: a few of the
tile configs an int4 + int8-head engine compiles, one after the other and then in threads
(each run in a fresh process with an empty Triton cache), to see how much of Triton's compile
runs outside the GIL (hymt_serve.engine.kernels.ahead compiles in threads on that account).

    PYTHONPATH=handler python benchmarks/decode/compile_threads.py [--threads 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

TILES = [  # (x, w, kind, block_m, block_n, block_k, warps, deep): int4 and int8 many-rows tiles
    ("*bf16", "*i32", 2, 32, 64, 128, 4, True),
    ("*bf16", "*i32", 2, 64, 64, 128, 4, True),
    ("*bf16", "*i8", 0, 64, 128, 128, 4, False),
    ("*bf16", "*i8", 0, 128, 128, 128, 4, False),
]
WARM = ("*bf16", "*bf16", 0, 16, 32, 128, 4, False)  # compiled first: Triton's imports


def compile_one(tile: tuple[object, ...]) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hymt_serve.engine.kernels import weight_only_triton as kernels

    x, w, kind, block_m, block_n, block_k, warps, deep = tile
    signature = {
        "x_ptr": x, "w_ptr": w, "s_ptr": "*fp16", "out_ptr": "*fp32", "M": "i32", "N": "i32",
        "K": "i32", "stride_xm": "i32", "KIND": "constexpr", "GROUP": "constexpr",
        "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "SPAN": "i32",
        "DEEP": "constexpr",
    }  # fmt: skip
    names = list(signature)
    aligned = ("x_ptr", "w_ptr", "s_ptr", "out_ptr", "N", "K", "stride_xm", "SPAN")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    constants = {
        "KIND": kind, "GROUP": 128 if kind == 2 else 1, "BLOCK_M": block_m,
        "BLOCK_N": block_n, "BLOCK_K": block_k, "DEEP": deep,
    }  # fmt: skip
    source = ASTSource(kernels.weight_only_kernel, signature, constants, attrs)
    options = {"num_warps": warps, "num_stages": 3}
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def measure(threads: int) -> float:
    compile_one(WARM)
    start = time.perf_counter()
    if threads <= 1:
        for tile in TILES:
            compile_one(tile)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(compile_one, TILES))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=len(TILES))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    times = {}
    for threads in (1, args.threads):
        with tempfile.TemporaryDirectory() as cache:
            command = [sys.executable, __file__, "--one", str(threads)]
            environ = {**os.environ, "TRITON_CACHE_DIR": cache}
            done = subprocess.run(command, env=environ, capture_output=True, text=True, check=True)
            times[threads] = json.loads(done.stdout.strip().splitlines()[-1])
    serial, threaded = times[1], times[args.threads]
    print(
        f"{len(TILES)} compiles on {os.cpu_count()} cores: one after the other {serial:.2f} s, "
        f"in {args.threads} threads {threaded:.2f} s ({threaded / serial:.2f} x)"
    )


if __name__ == "__main__":
    main()
