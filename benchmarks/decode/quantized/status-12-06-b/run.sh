#!/usr/bin/env bash
# On the GPU machine, from the repository root: the batch-1 step of bf16, fp8 + head, int8 +
# head and int4 + head as the engine is after int4-splits, replays taken in turns
# (step_ab.py). Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1 timeout 400 python3 \
  benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 7 \
  --runs none:base fp8+head:base int8+head:base int4+head:base 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 5
