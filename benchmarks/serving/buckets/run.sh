#!/usr/bin/env bash
# On the GPU machine, from the repository root, in one call: one bf16 pass over the
# projections at 320-512 tokens (does padding a step's tokens cost time there?); the engine
# with and without the 160 and 224 decode buckets and with the scheduler's lookahead at 2 and 1,
# taking turns (engine_ab.py); fp8's SiLU + input quantization in one kernel
# (fp8_silu_quant.py). Results under $1 (default $OUT).
set -uo pipefail
out=${1:-$OUT}
tok=${TOK:-build/tok}
export PYTHONPATH=handler:benchmarks/decode PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt"
timeout 120 python3 benchmarks/decode/fp8_gemm.py --out "$out/gemm" \
  --tokens 320 352 384 416 448 480 512 2>&1 | tee "$out/gemm.log" | tail -n 12
timeout 420 python3 benchmarks/serving/engine_ab.py --tokenizer "$tok" --out "$out/engine" \
  --slots 256 --users 64,256 --rounds 3 --duration 6 \
  --variants buckets=-160,-224 base buckets=-160,-224+lookahead=1 lookahead=1 2>&1 \
  | tee "$out/engine.log" | grep "^|"
timeout 120 python3 benchmarks/decode/fp8_silu_quant.py --out "$out/silu" 2>&1 \
  | tee "$out/silu.log" | tail -n 12
