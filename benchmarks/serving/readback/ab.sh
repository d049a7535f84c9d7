#!/bin/bash
# CPU machine, tiny model: read-backs every step (HEAD) against every 8 (HEAD with SYNC_EVERY = 8), --stop sampled and eos, alternating
cd /work/main
for pair in 1 2; do
  for v in every1 every8; do
    if [ $v = every1 ]; then H=/work/main/handler; else H=/tmp/sync8/handler; fi
    for stop in sampled eos; do
      PYTHONPATH=$H /tmp/ci5/.venv/bin/python benchmarks/serving/bench_engine.py --tiny --out /tmp/absync/$v-$stop-$pair --work /tmp/absync/w \
        --users 1,8 --duration 8 --stop $stop 2>/dev/null | grep '^{"mixed' | sed "s/^/{\"tree\": \"$v\", \"stop\": \"$stop\", \"pair\": $pair, /; s/, {\"mixed/, \"mixed/" 
    done
  done
done
