#!/usr/bin/env bash
# CPU A/B of the handler's reply path: the tiny model in async mode, 32 users for 30 s, the
# previous handler and this one alternating, twice.
#   git archive af0456e handler | tar -x -C PREV
#   bash benchmarks/serving/frontend_jobs/ab/ab.sh PREV OUT
# Needs the dev environment (scripts/setup.sh dev) and nothing on ports 8080-8082.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
prev=$(realpath "${1:?a folder holding the previous handler/}"); out=${2:?output folder}
mkdir -p "$out"
for round in 1 2; do
  for v in prev new; do
    handler=$PWD/handler; [ $v = prev ] && handler=$prev/handler
    PYTHONPATH=$handler:$PWD/loadtest/serving python loadtest/serving/run_bench.py --tiny \
      --skip-naive --modes continuous --users 32 --duration 30 --client-processes 2 \
      --out "$out/$v-$round" --work "$out/work-$v-$round" >"$out/$v-$round.log" 2>&1
    grep '"users"' "$out/$v-$round.log" >"$out/$v-$round.jsonl"
    echo "$v $round $(cut -c1-160 "$out/$v-$round.jsonl")"
  done
done
