#!/usr/bin/env bash
# Replays A (/tmp/a) vs B (/tmp/bb) alternating; results tarred into $OUT.
set -uo pipefail
source scripts/gpu/env.sh
R=/tmp/res; rm -rf $R; mkdir -p $R
reps=${REPS:-2}
for rep in $(seq $reps); do
 for p in ${PIPES:-4 8 12}; do
  for v in ${VARIANTS:-a bb}; do
   /tmp/$v/kvbench replay --systems kvpool --pipelines $p --device-frac 0.25 --backend cuda \
     --users 1000 --first-days 2 --batch 8 --json > $R/replay-$v-p$p-r$rep.json 2>$R/replay-$v-p$p-r$rep.err
   /opt/torch/.venv/bin/python3 scripts/gpu/replay_summary.py $R/replay-$v-p$p-r$rep.json "$v p$p r$rep"
  done
 done
done | tee $R/summary.txt
tar -czf $OUT/res.tgz -C $R .
