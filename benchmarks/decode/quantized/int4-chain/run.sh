#!/usr/bin/env bash
# On the GPU machine, from the repository root: int4's one row in the chain kernel against the
# [words, columns] tile, per projection (int4_chain.py); the GPU tests of the int4 kernels;
# then the int4 + head batch-1 step with the chain kernel against the words tile and bf16
# (step_ab.py), in one call. Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
PYTHONPATH=handler timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_weight_only_gpu.py -k "chain or int4" 2>&1 | tail -n 5 | tee "$out/gpu_tests.txt"
timeout 170 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 7 \
  --runs none:base int4+head:base int4+head:int4_row=words+int4=1,128,32,1,1,1056 \
  int4+head:int4=1,128,64,1,1,2112 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 7
timeout 90 python3 benchmarks/decode/int4_chain.py --out "$out/chain" > "$out/chain.log" 2>&1
tail -n 22 "$out/chain.log"
