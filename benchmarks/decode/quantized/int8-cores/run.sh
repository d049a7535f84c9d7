#!/usr/bin/env bash
# On the GPU machine, from the repository root: the weight-only GPU tests, the sweep of int8's
# one row on CUDA cores against the tiled kernel (int8_cores.py), then the batch-1 step of bf16,
# int8 + head as the engine is and int8 + head with every int8 one row on the cores kernel's
# fastest tile over the four projections (step_ab.py). Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
PYTHONPATH=handler timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/gpu/test_weight_only_gpu.py 2>&1 | tail -n 5 | tee "$out/gpu_tests.txt"
timeout 200 python3 benchmarks/decode/int8_cores.py --out "$out/sweep" 2>&1 \
  | tee "$out/sweep.log" | grep -A40 "^# int8"
best=$(python3 - "$out/sweep/int8_cores.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
totals = {}
for r in rows:
    if r["variant"] == "cores" and r["shape"] != "head":
        totals[tuple(r["config"])] = totals.get(tuple(r["config"]), 0) + r["ms"]
print(",".join(map(str, min(totals, key=totals.get))))
PY
)
echo "cores tile: $best" | tee "$out/cores_tile.txt"
timeout 330 python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 7 \
  --runs none:base int8+head:base "int8+head:int8=$best+int8_shapes=off" 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 5
