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
   /opt/torch/.venv/bin/python3 - $R/replay-$v-p$p-r$rep.json $v $p $rep <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); k=d['systems']['kvpool']; L=k['latency']
print(f"{sys.argv[2]:3} p{sys.argv[3]:2} r{sys.argv[4]} prep p50 {L['prepare']['p50_ns']/1e3:.1f} p99 {L['prepare']['p99_ns']/1e3:.1f} p999 {L['prepare']['p999_ns']/1e3:.1f} us | onload p99 {L['prepare_onload']['p99_ns']/1e3:.0f} us | stalls {k['pool']['reclaim_stalls']} | GB/s {k['bytes_per_s']/1e9:.0f} | hit {k['hit_rate']:.3f} | offload {d['gpu']['offload_vs_ceiling']:.3f}")
PY
  done
 done
done | tee $R/summary.txt
tar -czf $OUT/res.tgz -C $R .
