#!/bin/bash
# A/B: one row of bf16 products in the Triton tiled kernel (default) against cuBLAS.
set -x
export PYTHONPATH=handler:benchmarks/decode
R=${OUT:-out}/r; mkdir -p $R
for v in default cublas-one-row; do
  n=$((n+1))
  timeout 200 python benchmarks/decode/blas_variant.py $v --out $R/d$n-$v --skip-hf --batches 1 8 \
     --quantized-batches --fast-new-tokens 64 --kernels 30 > $R/d$n-$v.log 2>&1
  grep -E "^\| fast" $R/d$n-$v/results.md
done
for v in default cublas-one-row default cublas-one-row; do
  n=$((n+1))
  timeout 150 python benchmarks/decode/blas_variant.py $v benchmarks/serving/bench_engine.py \
    --tokenizer ${TOKDIR:-../shared/hunyuan-tokenizer} --out $R/e$n-$v --slots 256 --users 1 --duration 6 > $R/e$n-$v.log 2>&1
  tail -3 $R/e$n-$v.log; grep -E "^\|" $R/e$n-$v/engine.md | head -4
done
