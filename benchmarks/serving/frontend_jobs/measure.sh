#!/usr/bin/env bash
# Live request objects in TorchServe's front end while the tiny model serves a closed loop
# (async mode, as the GPU profile runs): after each forced full GC, the count of RestJob and
# RequestInput objects and the live heap, next to the requests answered so far.
#   bash benchmarks/serving/frontend_jobs/measure.sh OUT_DIR [USERS] [SECONDS]
# Needs the dev environment (scripts/setup.sh dev: TorchServe and its Java) and nothing on
# ports 8080-8082.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:?output folder}; users=${2:-32}; seconds=${3:-150}
mkdir -p "$out"
PYTHONPATH=$PWD/handler:$PWD/loadtest/serving python loadtest/serving/run_bench.py --tiny \
  --skip-naive --modes continuous --users "$users" --duration "$seconds" --client-processes 2 \
  --out "$out/bench" --work "$out/work" >"$out/bench.log" 2>&1 &
bench=$!
pid=""
for _ in $(seq 300); do  # the front end's JVM, once it runs
  pid=$(pgrep -f org.pytorch.serve.ModelServer | head -1 || true)
  [ -n "$pid" ] && grep -q '"cold_start"' "$out/bench.log" 2>/dev/null && break
  sleep 1
done
[ -n "$pid" ] || { echo "TorchServe did not start" >&2; exit 1; }
jcmd="$(dirname "$(readlink -f /proc/"$pid"/exe)")/jcmd"
metrics=http://127.0.0.1:8082/metrics
echo "seconds,requests_answered,restjob_objects,requestinput_objects,live_heap_kb" >"$out/samples.csv"
start=$(date +%s)
while kill -0 "$bench" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do
  answered=$(curl -s "$metrics" | awk '/^ts_inference_requests_total/ {s += $2} END {print s + 0}')
  histogram=$("$jcmd" "$pid" GC.class_histogram 2>/dev/null || true)  # forces a full GC first
  jobs=$(awk '$4 == "org.pytorch.serve.job.RestJob" {print $2}' <<<"$histogram")
  inputs=$(awk '$4 == "org.pytorch.serve.util.messages.RequestInput" {print $2}' <<<"$histogram")
  heap=$("$jcmd" "$pid" GC.heap_info 2>/dev/null | awk '/heap.*used/ {for (i = 1; i <= NF; i++) if ($i == "used") print $(i + 1)}' | tr -d K | head -1)
  [ -n "$jobs" ] && echo "$(( $(date +%s) - start )),$answered,$jobs,${inputs:-0},${heap:-0}" | tee -a "$out/samples.csv"
  sleep 20
done
wait "$bench" || true
grep '"users"' "$out/bench.log" | cut -c1-200
