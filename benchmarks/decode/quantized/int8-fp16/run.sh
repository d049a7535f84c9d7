#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call: the widening modes of
# int8_widen.py (one row, the four projections of a 7B), then the weight-only GPU tests.
# Results under $1 (default $OUT). (The call of 2026-12-04 also ran step_ab.py on a trial
# that cast bf16 rows to fp16 in the engine; that code was not kept: see README.md.)
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/decode/int8_widen.py --out "$out" > "$out/widen.log" 2>&1
tail -n 22 "$out/widen.log"
timeout 130 python3 -m pytest -q -m gpu tests/gpu/test_weight_only_gpu.py 2>&1 \
  | tee "$out/gpu-weight-only.txt" | tail -n 3
