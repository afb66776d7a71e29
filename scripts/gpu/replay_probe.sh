#!/usr/bin/env bash
# Where the replay's prepare p99 comes from: the same build with 1 and 4
# workers, and a run with the copy profile (synchronous device -> host copies
# happen only where a prepare demotes for itself). Results tarred into $OUT.
set -uo pipefail
source scripts/gpu/env.sh
[ -x /tmp/a/kvbench ] || { cmake -S . -B /tmp/a $KVPOOL_GPU_CMAKE_FLAGS >/dev/null && cmake --build /tmp/a -j16 >/dev/null; } || exit 1
R=/tmp/probe; rm -rf $R; mkdir -p $R
nvidia-smi -L > $R/device.txt
for w in ${WORKERS:-1 4}; do
 for p in ${PIPES:-4 8 12}; do
  env ${PROFILE:+KVPOOL_COPY_PROFILE=$R/prof-w$w-p$p.txt} /tmp/a/kvbench replay --systems kvpool --pipelines $p --workers $w \
   --device-frac 0.25 --backend cuda --users 1000 --first-days 2 --batch 8 --json \
   > $R/w$w-p$p.json 2>$R/w$w-p$p.err
  /opt/torch/.venv/bin/python3 scripts/gpu/replay_summary.py $R/w$w-p$p.json "w$w p$p"
 done
done | tee $R/summary.txt
tar -czf $OUT/probe.tgz -C $R .
