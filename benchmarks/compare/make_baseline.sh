#!/usr/bin/env bash
# Stage what the device calls of run_compare.sh carry (build/ is git-ignored):
#   build/baseline/           the code before the refactor (commit 220283d, or REF): handler/,
#                             benchmarks/, loadtest/, configs/ and config.properties (run_bench.py
#                             reads the last two from its own tree), plus BASELINE_COMMIT
#   build/hunyuan-tokenizer/  the tokenizer (the ../shared beside the checkout does not travel),
#   build/tok/hunyuan-tokenizer.tar.gz   and the same compressed, which is what the calls carry
#
#   benchmarks/compare/make_baseline.sh [REF]
# TOKENIZER_SRC overrides where the tokenizer is copied from [../shared/hunyuan-tokenizer].
set -euo pipefail
REF=${1:-220283d}
cd "$(git rev-parse --show-toplevel)"
commit=$(git rev-parse --verify "$REF^{commit}")

dest=build/baseline
rm -rf "$dest"
mkdir -p "$dest"
git archive "$commit" handler benchmarks loadtest configs config.properties | tar -x -C "$dest"
echo "$commit" >"$dest/BASELINE_COMMIT"
echo "build/baseline: $commit, $(du -sh "$dest" | cut -f1)"

src=${TOKENIZER_SRC:-../shared/hunyuan-tokenizer}
if [ -f "$src/tokenizer.json" ]; then
    rm -rf build/hunyuan-tokenizer
    mkdir -p build/hunyuan-tokenizer
    cp "$src"/tokenizer.json "$src"/tokenizer_config.json "$src"/chat_template.jinja \
        build/hunyuan-tokenizer/
    chmod -R u+w build/hunyuan-tokenizer
    # The same, compressed (16 MB -> 2.5 MB), for carry: run_compare.sh unpacks it by itself.
    mkdir -p build/tok
    tar -czf build/tok/hunyuan-tokenizer.tar.gz -C build hunyuan-tokenizer
    echo "build/hunyuan-tokenizer: from $src, $(du -sh build/hunyuan-tokenizer | cut -f1);" \
        "build/tok/hunyuan-tokenizer.tar.gz: $(du -sh build/tok/hunyuan-tokenizer.tar.gz | cut -f1)"
else
    echo "no tokenizer at $src (set TOKENIZER_SRC): build/hunyuan-tokenizer not made" >&2
fi
