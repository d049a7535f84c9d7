#!/usr/bin/env bash
# On the GPU machine, from the repository root: the weight-only GPU tests of the kernels
# against the reference (not the 7B models); the batch-1 step of
# bf16, int8 + head as the engine is, int8 + head with every int8 one row on the CUDA-core
# kernel (two tiles) and int4 + head (step_ab.py); then the sweep of int8's one row on CUDA
# cores against the tiled kernel per shape (int8_cores.py). Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
PYTHONPATH=handler timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_weight_only_gpu.py -k "cuda_cores or kernel_matches" 2>&1 | tail -n 5 \
  | tee "$out/gpu_tests.txt"
cores="int8_shapes=off+int8"
timeout 280 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 7 \
  --runs none:base int8+head:base "int8+head:$cores=1,64,128,4,1,1056" \
  "int8+head:$cores=1,128,128,4,1,528" int4+head:base 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 6
timeout 150 python3 benchmarks/decode/int8_cores.py --out "$out/sweep" 2>&1 \
  | tee "$out/sweep.log" | grep -A40 "^# int8"
