#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call: the decode step with int8's
# one row taking the norms' outputs as fp16 (the engine now) against bf16 (norms16=off),
# int8 + head and int8, batches 1 and 64, beside bf16's step (step_ab.py); then the
# weight-only kernel's GPU tests. Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt"
timeout 330 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 64 --turns 7 \
  --runs none:base int8+head:base int8+head:norms16=off int8:base int8:norms16=off 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 12
timeout 200 python3 -m pytest -q -p no:logging tests/gpu/test_weight_only_gpu.py 2>&1 \
  | tee "$out/gpu-weight-only.txt" | tail -n 3
