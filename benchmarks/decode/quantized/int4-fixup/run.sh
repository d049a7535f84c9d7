#!/usr/bin/env bash
# On the GPU machine, from the repository root: int4's one row with the split sums done by
# the last program of each column tile, against the engine's kernel and a sum of its own
# (int4_fixup.py), then the int4 + head step's kernels (step_kernels.py), in one call.
# Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/decode/int4_fixup.py --out "$out" > "$out/int4_fixup.log" 2>&1
tail -n 12 "$out/int4_fixup.log"
timeout 150 python3 benchmarks/decode/step_kernels.py --out "$out" --forms none int4+head \
  > "$out/step_kernels.log" 2>&1
grep -v "^$" "$out/step_kernels.md"
