#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call: the batch-1 decode step with the
# step functions reading sums of up to 15 splits inside the next kernel (the engine now)
# against inductor's 8 (step_ab.py, split_sums=8), bf16 and int8; the kernels of int8 + head's
# step (step_kernels.py); the fast engine's GPU tests. Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 5 \
  --runs none:base none:split_sums=8 int8+head:base int8+head:split_sums=8 int8:base 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 5
timeout 100 python3 benchmarks/decode/step_kernels.py --out "$out" --forms int8+head \
  > "$out/step_kernels.log" 2>&1
grep -v "^$" "$out/step_kernels.md"
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_fast_engine_gpu.py 2>&1 \
  | tee "$out/gpu-fast-engine.txt" | tail -n 3
