#!/bin/bash
# CPU machine, tiny model: read-backs after every step (this tree) against every 8 (a copy of
# this tree's handler with SYNC_EVERY = 8), with --stop sampled and --stop eos, in two
# alternating pairs; one JSON line per level on stdout. Run from the repository root:
#   bash benchmarks/serving/readback/ab.sh > ab.jsonl
set -euo pipefail
work=$(mktemp -d)
cp -r handler "$work/every8"
sed -i 's/^SYNC_EVERY = 1 /SYNC_EVERY = 8 /' "$work/every8/hymt_serve/engine/scheduler/loop.py"
grep -q '^SYNC_EVERY = 8 ' "$work/every8/hymt_serve/engine/scheduler/loop.py"
for pair in 1 2; do
  for tree in every1 every8; do
    handler=$PWD/handler
    [ "$tree" = every8 ] && handler=$work/every8
    for stop in sampled eos; do
      PYTHONPATH=$handler python benchmarks/serving/bench_engine.py --tiny \
        --out "$work/$tree-$stop-$pair" --work "$work/w" --users 1,8 --duration 8 --stop "$stop" \
        2>/dev/null | grep '^{"mixed' \
        | sed "s/^{/{\"tree\": \"$tree\", \"stop\": \"$stop\", \"pair\": $pair, /"
    done
  done
done
