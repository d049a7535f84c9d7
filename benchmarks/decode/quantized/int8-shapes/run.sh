#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call: the batch-1 decode step of
# int8 + head with int8's one-row tiles per shape (the engine now) against one tile for all
# (step_ab.py), beside bf16's; the kernels of bf16's and int8 + head's batch-1 steps
# (step_kernels.py); the weight-only GPU tests. Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
timeout 260 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 5 \
  --runs none:base int8+head:base int8+head:int8_shapes=off 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 4
timeout 150 python3 benchmarks/decode/step_kernels.py --out "$out" --forms none int8+head \
  > "$out/step_kernels.log" 2>&1
grep -v "^$" "$out/step_kernels.md"
timeout 130 python3 -m pytest -q -m gpu tests/gpu/test_weight_only_gpu.py 2>&1 \
  | tee "$out/gpu-weight-only.txt" | tail -n 3
