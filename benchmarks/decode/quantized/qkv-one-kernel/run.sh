#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call: the decode step with q, k and v
# written by one kernel (step_ab.py, qkv=one; not kept) against the engine, bf16 and
# int8 + head at batches 1 and 64; then the fast engine's GPU tests. Results under $1
# (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 64 --turns 7 \
  --runs none:base none:qkv=one int8+head:base int8+head:qkv=one 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 9
timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_fast_engine_gpu.py 2>&1 \
  | tee "$out/gpu-fast-engine.txt" | tail -n 3
