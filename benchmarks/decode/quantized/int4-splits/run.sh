#!/usr/bin/env bash
# On the GPU machine, from the repository root: the GPU tests of int4's chain kernel (with
# its sums in the last program too), then the batch-1 step of bf16, int8 + head and int4 +
# head, and int4 + head with its split sums changed (step_ab.py): gate_up's 16-way sum read
# inside the SiLU kernel (split_sums=32), the other projections' 64-128-way sums in the chain
# kernel's last program (last_sums=32), gate_up's too (last_sums=16). Results under $1
# (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
PYTHONPATH=handler timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_weight_only_gpu.py -k "chain" 2>&1 | tail -n 5 | tee "$out/gpu_tests.txt"
timeout 420 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 7 \
  --runs none:base int8+head:base int4+head:base int4+head:split_sums=32 \
  int4+head:split_sums=32+last_sums=32 int4+head:last_sums=16 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 7
