#!/usr/bin/env bash
# A/B of the onload reserve: A = working tree, B = working tree with reserve.diff reversed.
set -uo pipefail
source .gpu/env.sh
nvidia-smi -L > $OUT/device.txt
nproc >> $OUT/device.txt
cf="-DKVPOOL_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DKVPOOL_WERROR=ON -DPython3_EXECUTABLE=/opt/torch/.venv/bin/python3"
rm -rf /tmp/srcb && mkdir /tmp/srcb && tar --exclude=./.gpu -cf - . | tar -xf - -C /tmp/srcb
(cd /tmp/srcb && patch -R -p1 < "$OLDPWD/.gpu/reserve.diff") > $OUT/patch.txt 2>&1
(cmake -S . -B /tmp/a $cf >/dev/null && cmake --build /tmp/a -j8 >/dev/null 2>$OUT/build-a.err) &
(cmake -S /tmp/srcb -B /tmp/bb $cf >/dev/null && cmake --build /tmp/bb -j8 >/dev/null 2>$OUT/build-b.err) &
wait
ls /tmp/a/kvbench /tmp/bb/kvbench || exit 1
for rep in 1 2; do
 for p in 4 8 12; do
  for v in a bb; do
   t0=$(date +%s)
   /tmp/$v/kvbench replay --systems kvpool --pipelines $p --device-frac 0.25 --backend cuda \
     --users 1000 --first-days 2 --batch 8 --json > $OUT/replay-$v-p$p-r$rep.json 2>$OUT/replay-$v-p$p-r$rep.err
   echo "$v p$p r$rep rc=$? $(( $(date +%s)-t0 ))s" >> $OUT/log.txt
  done
 done
done
