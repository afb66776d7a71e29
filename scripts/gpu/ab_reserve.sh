#!/usr/bin/env bash
# A/B of a change on the device machine: A = this tree, B = this tree with DIFF (arg 1)
# reversed; both built side by side, then the replays (ab_run.sh), results into $OUT.
set -uo pipefail
source scripts/gpu/env.sh
nvidia-smi -L > $OUT/device.txt
nproc >> $OUT/device.txt
rm -rf /tmp/srcb && mkdir /tmp/srcb && tar --exclude=./.gpu -cf - . | tar -xf - -C /tmp/srcb
(cd /tmp/srcb && patch -R -p1 < "$OLDPWD/${1:-bench/results/raw-2026-11-27-reserve/reserve.diff}") > $OUT/patch.txt 2>&1
(cmake -S . -B /tmp/a $KVPOOL_GPU_CMAKE_FLAGS >/dev/null && cmake --build /tmp/a -j8 >/dev/null 2>$OUT/build-a.err) &
(cmake -S /tmp/srcb -B /tmp/bb $KVPOOL_GPU_CMAKE_FLAGS >/dev/null && cmake --build /tmp/bb -j8 >/dev/null 2>$OUT/build-b.err) &
wait
ls /tmp/a/kvbench /tmp/bb/kvbench || exit 1
bash "$(dirname "$0")/ab_run.sh"
