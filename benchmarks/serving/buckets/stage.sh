#!/usr/bin/env bash
# GPU call 1 of 2 (the second is serve.sh, right after, on the same machine): stage the
# TorchServe wheels (.whl/ts, carried) in /tmp/site, save the 7B-shaped random-weight folder
# /tmp/hymt-7b, then the engine alone, taking turns at one and 256 users: the scheduler as the
# session began (lookahead 2, rows at their length kept until their read-back), lookahead 1
# alone, and this tree (lookahead 1, rows retired at their length). Results under $1.
set -uo pipefail
out=${1:-$OUT}
tok=${TOK:-build/tok}
source benchmarks/serving/buckets/stage_ts.sh
PYTHONPATH=handler PYTHONUNBUFFERED=1 timeout 240 python3 benchmarks/serving/engine_ab.py \
  --tokenizer "$tok" --out "$out/engine" --slots 256 --users 1,256 --rounds 3 --duration 5 \
  --variants lookahead=2+retire=0 retire=0 base 2>&1 | tee "$out/engine.log" | grep "^|"
