#!/bin/bash
# Device-machine run for issue 14's offload/reclaim work: build, then
# `kvbench replay --backend cuda` runs named NAME:PIPELINES[:ENV=VAL...] with
# the copy profile (KVPOOL_COPY_PROFILE) on; results and a summary in $OUT.
# Usage (repository root = the worktree): bench/offload/run.sh NAME:P[:K=V...] ...
set -u
cd .. && source .gpu/env.sh && cd .wt-offload || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
nproc >> $OUT/gpu.txt; git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
cmake -S . -B /tmp/b -DKVPOOL_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DKVPOOL_WERROR=ON \
  -DPython3_EXECUTABLE=/opt/torch/.venv/bin/python3 > /tmp/cm.log 2>&1 || { tail -40 /tmp/cm.log; exit 1; }
cmake --build /tmp/b -j16 > /tmp/bd.log 2>&1 || { grep -B3 -A8 -E 'error|Error' /tmp/bd.log | head -80; exit 1; }
mkdir -p $OUT/r
for spec in "$@"; do
	IFS=: read -r name p rest <<< "$spec"
	envs=()
	[ -n "$rest" ] && IFS=: read -r -a envs <<< "$rest"
	env "${envs[@]}" KVPOOL_COPY_PROFILE=$OUT/r/prof-$name.txt /tmp/b/kvbench replay \
	  --systems kvpool --pipelines $p --device-frac 0.25 --backend cuda --users 1000 \
	  --first-days 2 --batch 8 --json > $OUT/r/replay-$name.json 2> $OUT/r/err-$name.txt \
	  || { echo "$name failed"; tail -5 $OUT/r/err-$name.txt; }
done
/opt/torch/.venv/bin/python3 bench/offload/summary.py $OUT/r | tee $OUT/summary.txt
tar -C $OUT -czf $OUT/runs.tar.gz r && rm -rf $OUT/r
