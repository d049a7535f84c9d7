#!/usr/bin/env bash
# On the GPU machine, from the repository root: the one-row tile sweep with warps
# (row_tiles.py), then the batch-1 decode step with the best single tiles it found against the
# engine's (step_ab.py), in one call. Results under $1 (default $OUT).
set -euo pipefail
out=${1:-$OUT}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
python3 benchmarks/decode/row_tiles.py --out "$out" --forms int8 bf16 2>&1 | tee "$out/row_tiles.log"
runs=$(python3 - "$out/best.json" <<'PY'
import json, sys
best = json.load(open(sys.argv[1]))
def cfg(tile):  # (block_n, block_k, warps, stages, programs) -> Config fields
    return ",".join(str(v) for v in [16, *tile])
runs = []
i8 = best["int8"]
if i8.get("best") and i8["best"] != i8["engine"]:
    runs += ["int8+head:base", f"int8+head:int8={cfg(i8['best'])}"]
b = best["bf16"]
if b.get("best") and b["best"] != b["engine"]:
    runs += ["none:base", f"none:plain={cfg(b['best'])}"]
print(" ".join(runs))
PY
)
echo "step_ab runs: $runs"
if [ -n "$runs" ]; then
  # shellcheck disable=SC2086
  python3 benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 5 --runs $runs \
    2>&1 | tee "$out/step_ab.log"
fi
