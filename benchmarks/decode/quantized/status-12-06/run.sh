#!/usr/bin/env bash
# GPU call 1 of 2 (the second is benchmarks/serving/buckets/serve.sh, right after, on the same
# machine): stage the TorchServe wheels (.whl/ts, carried) in /tmp/site and save the 7B-shaped
# folder /tmp/hymt-7b for the serving call; then int8 + head's batch-1 step with the norms'
# outputs as fp16 (the engine) and as bf16 (norms16=off), int4 + head's, and bf16's, replays
# taken in turns (step_ab.py). Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
tok=${TOK:-build/tok}
source benchmarks/serving/buckets/stage_ts.sh
PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1 timeout 330 python3 \
  benchmarks/decode/step_ab.py --out "$out/step" --batches 1 --turns 7 \
  --runs none:base int8+head:base int8+head:norms16=off int4+head:base 2>&1 \
  | tee "$out/step_ab.log" | grep "^|" | tail -n 8
