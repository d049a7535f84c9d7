#!/bin/sh
# Container entrypoint: build the archive for the mounted model, then run TorchServe attached.
# `hymt start --foreground` stays in the foreground under tini (PID 1) and stops TorchServe on
# SIGTERM. Extra arguments are passed to `hymt start` (e.g. --set job_queue_size=500).
set -eu

home=/home/model-server
model_path="${HYMT_MODEL_PATH:-/models/hunyuan-mt}"

if [ ! -f "$model_path/config.json" ]; then
    echo "entrypoint: no Hugging Face model at $model_path (mount the Hunyuan-MT folder there, read-only)" >&2
    exit 1
fi

# A pid file left in the run volume by a killed container would look like a running server.
rm -f "$home/run/tmp/.model_server.pid"

# HYMT_WORKERS (the Helm chart sets it to the pod's GPUs x workersPerGpu) overrides the
# profile's minWorkers/maxWorkers (the gpu profile: 3, sharing one GPU's engine process).
hymt archive --model-path "$model_path" --profile "${HYMT_PROFILE:-gpu}" \
    --export-path "$home/model_store" \
    ${HYMT_WORKERS:+--set "minWorkers=$HYMT_WORKERS" --set "maxWorkers=$HYMT_WORKERS"}

exec hymt start --config "$home/docker/config.properties" --workdir "$home/run" \
    --model-store "$home/model_store" --timeout "${HYMT_START_TIMEOUT:-900}" --foreground "$@"
