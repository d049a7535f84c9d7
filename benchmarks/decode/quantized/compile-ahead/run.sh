#!/usr/bin/env bash
# On the GPU machine, from the repository root: the GPU test of compiling ahead, then the
# ready time of bf16, int4 + head and int8 + head with the weight-only kernels compiled ahead,
# and int4 + head once more with none compiled ahead (serial, as before), each in a fresh
# process with empty caches (ready_time.py), three rounds in turned orders. Results under $1
# (default $OUT). ROUNDS (3), SERIAL (int4+head; empty for none) and TESTS_S (90 s; 0 skips
# the test) shorten it to fit a call.
set -uo pipefail
out=${1:-$OUT}
rounds=${ROUNDS:-3}
serial=${SERIAL-int4+head}
tests_s=${TESTS_S:-90}
export PYTHONPATH=handler PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
if [ "$tests_s" != 0 ]; then
  timeout "$tests_s" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_weight_only_gpu.py \
    -k "compiled_ahead or kernel_matches" 2>&1 | tail -n 5 | tee "$out/gpu_tests.txt"
fi
timeout "${READY_S:-520}" python3 benchmarks/decode/ready_time.py --out "$out/ready" \
  --checkpoint /tmp/hymt-7b-random --forms none int4+head int8+head \
  ${serial:+--serial $serial} --rounds "$rounds" 2>&1 \
  | tee "$out/ready.log" | tail -n 12
