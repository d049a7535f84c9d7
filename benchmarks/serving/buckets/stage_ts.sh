#!/usr/bin/env bash
# Sourced by the first of two back-to-back GPU calls, from the repository root: the card's
# name, the TorchServe wheels (.whl/ts, carried) staged in /tmp/site, and the 7B-shaped
# random-weight folder /tmp/hymt-7b that serve.sh serves in the second call. Needs $out, $tok.
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ts/*.whl 2>&1 | tail -n 2
PYTHONPATH=$PWD/handler:$PWD/loadtest/serving python3 -c "
from pathlib import Path
from run_bench import build_model
print(build_model(Path('/tmp/hymt-7b'), Path('$tok'), False))"
