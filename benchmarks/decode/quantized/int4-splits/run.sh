#!/usr/bin/env bash
# On the GPU machine, from the repository root: the weight-only GPU tests and the fast
# engine's, then the batch-1 step of bf16, int8 + head and int4 + head as the engine is
# (SPLIT_SUMS_READ 32: int4's gate_up sums its 16 splits inside the SiLU kernel) and int4 +
# head as before (split_sums=16) (step_ab.py). Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
PYTHONPATH=handler timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_weight_only_gpu.py tests/gpu/test_fast_engine_gpu.py 2>&1 | tail -n 5 \
  | tee "$out/gpu_tests.txt"
timeout 330 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 7 \
  --runs none:base int8+head:base int4+head:base int4+head:split_sums=16 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 5
