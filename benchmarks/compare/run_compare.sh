#!/usr/bin/env bash
# Before/after speed comparison of two source trees on one GPU machine, in one run.
#
#   benchmarks/compare/run_compare.sh BASE_TREE NEW_TREE OUT_DIR [STAGE ...]
#
# BASE_TREE, NEW_TREE: folders holding handler/, benchmarks/, loadtest/, configs/ and
# config.properties (build/baseline from make_baseline.sh, and the checkout itself).
# STAGE: decode | engine | serving | all (the default); several as separate words or "a,b".
#
# Each benchmark runs for BASE then NEW with PYTHONPATH set to that tree's handler/ (and
# loadtest/serving for the serving benchmark), and that tree's own benchmark script; repeats
# alternate the order (base-new, new-base, ...) so that drift on the machine falls on both.
# Rounds go stage by stage (decode, engine, serving, then the second round of each, ...), so a
# deadline cuts repeats, never a whole stage. Raw outputs land in
#   OUT_DIR/{base,new}/{decode,engine,serving}/rN/   (each benchmark's own files + log.txt)
#   OUT_DIR/{base,new}/tree.json                       (which code ran: path, file hashes)
#   OUT_DIR/run.log                                    (what ran when, exit codes)
# and compare.py writes OUT_DIR/compare.md and compare.json at the end. Needs no network.
#
# Environment (defaults in brackets):
#   TOKENIZER        tokenizer folder [the first found of build/hunyuan-tokenizer (of the checkout
#                    holding this script), /tmp/hymt-compare-tok (build/tok/hunyuan-tokenizer.tar.gz
#                    is unpacked there first), shared/hunyuan-tokenizer, ../shared/hunyuan-tokenizer]
#   MODEL_DIR        the saved 7B random-weight model, made once, used by both trees [/tmp/hymt-7b]
#   WORK             TorchServe work folders and the tiny model [/tmp/hymt-compare-work]
#   DECODE_REPEATS, ENGINE_REPEATS, SERVING_REPEATS   rounds per stage at most [2, 2, 1]
#   DEADLINE_S       seconds from the start after which nothing new starts; a round (a pair of
#                    runs) starts only if it is expected to end in time [none]
#   DURATION         seconds per user level, engine and serving [8]
#   ENGINE_USERS, SERVING_USERS   [64,256, 64,256]
#   DECODE_BATCHES   [1 64 128]
#   CLIENT_PROCESSES load-client processes of the serving benchmark [4]
#   RUN_TIMEOUT      seconds one benchmark run may take [480]
#   PYTHON           [python3]
#   TORCHINDUCTOR_CACHE_DIR  one inductor cache for every run, TorchServe's workers too (they
#                    get a TMPDIR of their own) [/tmp/hymt-compare-inductor]
#   TINY=1           CPU smoke test of the plumbing: engine and serving with --tiny, no decode
#   DRY_RUN=1        print the benchmark commands instead of running them
set -uo pipefail

usage() {
    sed -n '2,6p' "$0" >&2
    exit 2
}
[ $# -ge 3 ] || usage

abspath() { (cd "$1" && pwd -P); }
BASE_TREE=$(abspath "$1") || { echo "no tree $1" >&2; exit 2; }
NEW_TREE=$(abspath "$2") || { echo "no tree $2" >&2; exit 2; }
mkdir -p "$3" || exit 2
OUT_DIR=$(abspath "$3")
shift 3

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
PYTHON=${PYTHON:-python3}
TINY=${TINY:-0}
DRY_RUN=${DRY_RUN:-0}
MODEL_DIR=${MODEL_DIR:-/tmp/hymt-7b}
WORK=${WORK:-/tmp/hymt-compare-work}
DURATION=${DURATION:-8}
ENGINE_USERS=${ENGINE_USERS:-64,256}
SERVING_USERS=${SERVING_USERS:-64,256}
DECODE_BATCHES=${DECODE_BATCHES:-1 64 128}
CLIENT_PROCESSES=${CLIENT_PROCESSES:-4}
RUN_TIMEOUT=${RUN_TIMEOUT:-480}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/hymt-compare-inductor}
export PYTHONUNBUFFERED=1
# Whatever PYTHONPATH the caller set (e.g. /tmp/site for TorchServe's wheels) goes after the tree.
SITE_PYTHONPATH=${PYTHONPATH:-}
START=$(date +%s)

declare -A REPEATS=(
    [decode]=${DECODE_REPEATS:-2}
    [engine]=${ENGINE_REPEATS:-2}
    [serving]=${SERVING_REPEATS:-1}
)
# Seconds one base+new pair is expected to take before one has been timed (then: the last pair).
declare -A PAIR_ESTIMATE=([decode]=150 [engine]=150 [serving]=300)

STAGES=()
for word in "${@:-all}"; do
    for stage in ${word//,/ }; do
        case $stage in
            all) STAGES+=(decode engine serving) ;;
            decode | engine | serving) STAGES+=("$stage") ;;
            *) echo "unknown stage: $stage (decode | engine | serving | all)" >&2; exit 2 ;;
        esac
    done
done
if [ "$TINY" = 1 ]; then
    MODEL_DIR=${TINY_MODEL_DIR:-$WORK/tiny-model}
    kept=()
    for stage in "${STAGES[@]}"; do [ "$stage" = decode ] || kept+=("$stage"); done
    STAGES=("${kept[@]}")
fi

log() {
    local line
    line="[$(date -u +%H:%M:%S) +$(($(date +%s) - START))s] $*"
    echo "$line"
    echo "$line" >>"$OUT_DIR/run.log"
}

tree_of() { if [ "$1" = base ]; then echo "$BASE_TREE"; else echo "$NEW_TREE"; fi; }

pythonpath_for() { # SIDE STAGE
    local tree path
    tree=$(tree_of "$1")
    path=$tree/handler
    [ "$2" = serving ] && path=$path:$tree/loadtest/serving
    echo "$path${SITE_PYTHONPATH:+:$SITE_PYTHONPATH}"
}

find_tokenizer() {
    local candidate
    local checkout=$HERE/../..
    local packed=$checkout/build/tok/hunyuan-tokenizer.tar.gz # make_baseline.sh's, for carry
    if [ -f "$packed" ] && [ ! -f /tmp/hymt-compare-tok/tokenizer.json ]; then
        mkdir -p /tmp/hymt-compare-tok &&
            tar -xzf "$packed" -C /tmp/hymt-compare-tok --strip-components=1 >&2
    fi
    for candidate in "${TOKENIZER:-}" "$checkout/build/hunyuan-tokenizer" /tmp/hymt-compare-tok \
        "$checkout/shared/hunyuan-tokenizer" "$checkout/../shared/hunyuan-tokenizer"; do
        if [ -n "$candidate" ] && [ -f "$candidate/tokenizer.json" ]; then
            abspath "$candidate"
            return 0
        fi
    done
    return 1
}

# Which code a side runs: hymt_serve must resolve inside that tree (not an installed copy).
record_tree() { # SIDE
    local side=$1 tree
    tree=$(tree_of "$side")
    mkdir -p "$OUT_DIR/$side"
    PYTHONPATH=$(pythonpath_for "$side" serving) "$PYTHON" - "$tree" "$side" \
        >"$OUT_DIR/$side/tree.json" <<'EOF'
import hashlib, importlib.util, json, pathlib, sys
tree, side = pathlib.Path(sys.argv[1]), sys.argv[2]
spec = importlib.util.find_spec("hymt_serve")
origin = pathlib.Path(spec.origin).resolve() if spec and spec.origin else None
if origin is None or (tree / "handler").resolve() not in origin.parents:
    sys.exit(f"{side}: hymt_serve resolves to {origin}, not inside {tree}/handler")
digest = hashlib.sha256()
files = sorted(p for p in (tree / "handler").rglob("*.py") if "__pycache__" not in p.parts)
for path in files:
    digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes())
commit = tree / "BASELINE_COMMIT"
print(json.dumps({
    "side": side,
    "tree": str(tree),
    "hymt_serve": str(origin),
    "handler_py_files": len(files),
    "handler_sha256": digest.hexdigest(),
    "baseline_commit": commit.read_text().strip() if commit.is_file() else None,
}, indent=2))
EOF
}

wait_gpu_idle() { # before each run: nothing of the last run may still hold the GPU
    command -v nvidia-smi >/dev/null || return 0
    local used i
    for i in $(seq 1 90); do
        used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null |
            sort -n | tail -1)
        if [ -z "$used" ] || [ "$used" -lt 2048 ]; then
            [ "$i" -gt 1 ] && log "GPU idle after ${i}s (${used:-?} MiB in use)"
            return 0
        fi
        sleep 1
    done
    log "WARNING: GPU still holds ${used} MiB after 90 s; running anyway"
    nvidia-smi >>"$OUT_DIR/run.log" 2>&1
}

stop_torchserve() { # WORKDIR: a TorchServe run_bench left behind (killed by the timeout)
    local tmp=$1/run/tmp
    [ -f "$tmp/.model_server.pid" ] || return 0
    if kill -0 "$(cat "$tmp/.model_server.pid")" 2>/dev/null; then
        log "stopping the TorchServe left in $1"
        TEMP=$tmp TMPDIR=$tmp timeout 90 torchserve --stop --foreground >>"$OUT_DIR/run.log" 2>&1
    fi
}

benchmark_command() { # SIDE STAGE DEST WORKDIR -> the command, one word per line
    local tree
    tree=$(tree_of "$1")
    case $2 in
        decode)
            # shellcheck disable=SC2086 # DECODE_BATCHES is a list of words on purpose
            printf '%s\n' "$PYTHON" "$tree/benchmarks/decode/bench_decode.py" --out "$3" \
                --batches $DECODE_BATCHES --skip-hf --quantized-batches
            ;;
        engine)
            printf '%s\n' "$PYTHON" "$tree/benchmarks/serving/bench_engine.py" --out "$3" \
                --tokenizer "$TOKENIZER_DIR" --users "$ENGINE_USERS" --duration "$DURATION" \
                --work "$4"
            [ "$TINY" = 1 ] && echo --tiny
            ;;
        serving)
            printf '%s\n' "$PYTHON" "$tree/loadtest/serving/run_bench.py" --out "$3" \
                --tokenizer "$TOKENIZER_DIR" --model-dir "$MODEL_DIR" --modes continuous \
                --gpus 1 --users "$SERVING_USERS" --duration "$DURATION" --skip-naive \
                --client-processes "$CLIENT_PROCESSES" --work "$4"
            [ "$TINY" = 1 ] && echo --tiny
            ;;
    esac
    return 0
}

run_one() { # SIDE STAGE ROUND [END_BY: epoch seconds by which it must have ended]
    local side=$1 stage=$2 round=$3 end_by=${4:-} limit=$RUN_TIMEOUT dest work rc started
    dest=$OUT_DIR/$side/$stage/r$round
    work=$WORK/$side-$stage-r$round
    local -a command
    mapfile -t command < <(benchmark_command "$side" "$stage" "$dest" "$work")
    if [ "$DRY_RUN" = 1 ]; then
        log "DRY RUN $side $stage r$round: PYTHONPATH=$(pythonpath_for "$side" "$stage") ${command[*]}"
        return 0
    fi
    rm -rf "$dest" "$work"
    mkdir -p "$dest" "$work"
    wait_gpu_idle
    if [ -n "$end_by" ] && [ $((end_by - $(date +%s))) -lt "$limit" ]; then
        limit=$((end_by - $(date +%s)))
        [ "$limit" -lt 1 ] && limit=1
    fi
    log "start $side $stage r$round (limit ${limit}s): ${command[*]}"
    started=$(date +%s)
    # One SIGINT to the benchmark alone (--foreground: not to its process group, whose second
    # signal would cut its finally block short), so that it stops TorchServe itself.
    (cd "$(tree_of "$side")" && PYTHONPATH=$(pythonpath_for "$side" "$stage") \
        timeout --foreground -s INT -k 30 "$limit" "${command[@]}") >"$dest/log.txt" 2>&1
    rc=$?
    echo "$rc" >"$dest/rc"
    log "end $side $stage r$round: rc=$rc after $(($(date +%s) - started))s"
    [ "$rc" -eq 0 ] || tail -n 30 "$dest/log.txt" | sed 's/^/    | /' | tee -a "$OUT_DIR/run.log"
    if [ "$stage" = serving ]; then
        stop_torchserve "$work"
        local file
        for file in "$work"/describe-*.json; do [ -f "$file" ] && cp "$file" "$dest/"; done
        for file in ts_log.log model_log.log; do
            [ -f "$work/run/logs/$file" ] && tail -c 300000 "$work/run/logs/$file" >"$dest/$file"
        done
    fi
    return 0
}

prepare_serving_model() { # the saved model, once, by the NEW tree's own helper (neither side pays)
    [ -f "$MODEL_DIR/config.json" ] && { log "model folder $MODEL_DIR already there"; return 0; }
    if [ "$DRY_RUN" = 1 ]; then
        log "DRY RUN: would save the model folder $MODEL_DIR"
        return 0
    fi
    if ! command -v torchserve >/dev/null; then
        log "ERROR: torchserve is not on PATH (stage the wheels first, see README.md)"
        return 1
    fi
    log "saving the model folder $MODEL_DIR (tiny=$TINY)"
    (cd "$NEW_TREE" && PYTHONPATH=$(pythonpath_for new serving) "$PYTHON" - \
        "$MODEL_DIR" "$TOKENIZER_DIR" "$TINY" <<'EOF'
import sys
from pathlib import Path

from run_bench import build_model

print(build_model(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"))
EOF
    ) >>"$OUT_DIR/run.log" 2>&1
    local rc=$?
    log "model folder ready: rc=$rc"
    return "$rc"
}

# --- main ---------------------------------------------------------------------------------------

log "run_compare: base=$BASE_TREE new=$NEW_TREE out=$OUT_DIR stages=${STAGES[*]} tiny=$TINY"
for side in base new; do
    if ! record_tree "$side"; then
        log "ERROR: cannot run the $side tree"
        exit 1
    fi
done
# Scripts that cannot import what they name from hymt_serve: skip that stage for both sides.
declare -A SKIP_STAGE=()
for side in base new; do
    [ "${#STAGES[@]}" -gt 0 ] || break
    report=$(cd "$(tree_of "$side")" && PYTHONPATH=$(pythonpath_for "$side" serving) \
        "$PYTHON" "$HERE/preflight.py" "$(tree_of "$side")" "${STAGES[@]}" 2>&1)
    while IFS= read -r line; do
        stage=${line%%:*}
        case " ${STAGES[*]} " in *" $stage "*) ;; *) continue ;; esac
        [ "${line#*: }" = ok ] && continue
        SKIP_STAGE[$stage]=1
        mkdir -p "$OUT_DIR/$side/$stage"
        echo "$line" >"$OUT_DIR/$side/$stage/preflight.txt"
        log "ERROR: the $side tree cannot run $line; skipping that stage"
    done <<<"$report"
done

if printf '%s\n' "${STAGES[@]}" | grep -qx -e engine -e serving; then
    TOKENIZER_DIR=$(find_tokenizer) || {
        log "ERROR: no tokenizer (set TOKENIZER; see README.md)"
        exit 1
    }
    log "tokenizer: $TOKENIZER_DIR"
fi

declare -A LAST_PAIR=()
max_round=0
for stage in "${STAGES[@]}"; do
    [ "${REPEATS[$stage]}" -gt "$max_round" ] && max_round=${REPEATS[$stage]}
done
for round in $(seq 1 "$max_round"); do
    for stage in "${STAGES[@]}"; do
        [ "$round" -le "${REPEATS[$stage]}" ] || continue
        [ -n "${SKIP_STAGE[$stage]:-}" ] && continue
        if [ "$stage" = serving ] && [ "$round" = 1 ]; then
            prepare_serving_model || { SKIP_STAGE[serving]=1; continue; }
        fi
        if [ -n "${DEADLINE_S:-}" ]; then
            left=$((START + DEADLINE_S - $(date +%s)))
            need=${LAST_PAIR[$stage]:-${PAIR_ESTIMATE[$stage]}}
            if [ "$round" -gt 1 ] && [ "$left" -lt $((need * 115 / 100)) ]; then
                log "skip $stage r$round: ${left}s left, a pair took ${need}s"
                continue
            fi
            if [ "$left" -lt 60 ]; then
                log "skip $stage r$round: ${left}s left"
                continue
            fi
        fi
        if [ $((round % 2)) = 1 ]; then order=(base new); else order=(new base); fi
        pair_start=$(date +%s)
        for index in 0 1; do
            end_by=
            if [ -n "${DEADLINE_S:-}" ]; then # the first of a pair may use half of what is left
                end_by=$((START + DEADLINE_S))
                [ "$index" = 0 ] && end_by=$(($(date +%s) + (end_by - $(date +%s)) / 2))
            fi
            run_one "${order[$index]}" "$stage" "$round" "$end_by"
        done
        LAST_PAIR[$stage]=$(($(date +%s) - pair_start))
    done
done

log "comparing"
"$PYTHON" "$HERE/compare.py" "$OUT_DIR" | tee -a "$OUT_DIR/run.log"
log "done"
