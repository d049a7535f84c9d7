#!/usr/bin/env bash
# TorchServe's front-end heap before and after 100,000 bad requests in async mode (the GPU
# profile's mode), with TorchServe's own request map and with our front-end plugin, one after
# the other: live heap and live RestJob objects after a full GC (bad_requests.py says how).
#   bash benchmarks/serving/frontend_jobs/measure.sh OUT_DIR [REQUESTS] [EVERY]
# Needs the dev environment (scripts/setup.sh dev: TorchServe and its Java, with jcmd beside
# the java that runs it).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:?output folder}; requests=${2:-100000}; every=${3:-10000}
mkdir -p "$out"
for plugin in off on; do
  PYTHONPATH=$PWD/handler python benchmarks/serving/frontend_jobs/bad_requests.py "$out" \
    --plugin "$plugin" --requests "$requests" --every "$every" --job-queue 2 \
    2>"$out/stderr-$plugin.log"
done
