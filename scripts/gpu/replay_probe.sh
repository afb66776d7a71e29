#!/usr/bin/env bash
# Where the replay's prepare p99 comes from: the same build with 1 and 4
# workers, and a run with the copy profile (synchronous device -> host copies
# happen only where a prepare demotes for itself). Results tarred into $OUT.
set -uo pipefail
source scripts/gpu/env.sh
cf="-DKVPOOL_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DKVPOOL_WERROR=ON -DPython3_EXECUTABLE=/opt/torch/.venv/bin/python3"
[ -x /tmp/a/kvbench ] || { cmake -S . -B /tmp/a $cf >/dev/null && cmake --build /tmp/a -j16 >/dev/null; } || exit 1
R=/tmp/probe; rm -rf $R; mkdir -p $R
nvidia-smi -L > $R/device.txt
sum() { /opt/torch/.venv/bin/python3 - "$@" <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); k=d['systems']['kvpool']; L=k['latency']
print(f"{sys.argv[2]:12} prep p50 {L['prepare']['p50_ns']/1e3:.1f} p90 {L['prepare']['p90_ns']/1e3:.1f} p99 {L['prepare']['p99_ns']/1e3:.1f} p999 {L['prepare']['p999_ns']/1e3:.1f} us | commit p99 {L['commit']['p99_ns']/1e3:.0f} | onload p99 {L['prepare_onload']['p99_ns']/1e3:.0f} us | stalls {k['pool']['reclaim_stalls']} | GB/s {k['bytes_per_s']/1e9:.0f} | hit {k['hit_rate']:.3f} | offload {d['gpu']['offload_vs_ceiling']:.3f}")
PY
}
for w in ${WORKERS:-1 4}; do
 for p in ${PIPES:-4 8 12}; do
  env ${PROFILE:+KVPOOL_COPY_PROFILE=$R/prof-w$w-p$p.txt} /tmp/a/kvbench replay --systems kvpool --pipelines $p --workers $w \
   --device-frac 0.25 --backend cuda --users 1000 --first-days 2 --batch 8 --json \
   > $R/w$w-p$p.json 2>$R/w$w-p$p.err
  sum $R/w$w-p$p.json "w$w p$p"
 done
done | tee $R/summary.txt
tar -czf $OUT/probe.tgz -C $R .
