#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 32 on the GPU machine, one device call: the cuda build, the gpu
# tests (test_gpu_issuer among them: the onload issuer with and without),
# then the replay's prepare latency with onloads enqueued by the GPU's
# issuer thread (default) and inline in the worker (KVPOOL_ONLOAD_INLINE=1),
# alternated twice, on 16 cores (scripts/scaling.sh with a one-point grid;
# replay_b there is the reclaimer's boost A/B). Everything lands in $OUT.
#
#   run (carry .gpu): bash scripts/gpu/issuer_ab.sh
set -uo pipefail
KVPOOL_GPU_WERROR=${KVPOOL_GPU_WERROR:-OFF}
source scripts/gpu/env.sh
{ nvidia-smi -L; nproc; uname -r; date -u; } > $OUT/machine.txt 2>&1
t0=$SECONDS
(cmake -S . -B /tmp/b $KVPOOL_GPU_CMAKE_FLAGS && cmake --build /tmp/b -j16) \
	> $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
echo "build ok ($((SECONDS - t0)) s)"
timeout ${CTEST_S:-150} ctest --test-dir /tmp/b -L gpu -E "${CTEST_SKIP:-test_llm_gpu|test_hf_gpu|test_tp_gpu2|kvbench_peer}" \
	--output-on-failure > $OUT/ctest-gpu.txt 2>&1; echo "ctest gpu rc=$? ($((SECONDS - t0)) s)"
grep -E "tests passed|Failed|Not Run|\[issuer\]" $OUT/ctest-gpu.txt | tail -8
/tmp/b/tests/test_gpu_issuer 2>&1 | grep "\[issuer\]"
for i in ${ROUNDS:-1 2}; do
	for mode in issuer inline; do
		env $([ $mode = inline ] && echo KVPOOL_ONLOAD_INLINE=1) SCALING_BACKEND=cuda \
			SCALING_SECONDS=0.5 SCALING_WARMUP=0.2 SCALING_CLIENTS=1 SCALING_WORKERS=1 \
			SCALING_SUFFIX=$mode$i timeout ${AB_S:-120} taskset -c 0-15 \
			scripts/scaling.sh /tmp/b $OUT > $OUT/$mode$i.txt 2>&1
		echo "$mode$i rc=$? ($((SECONDS - t0)) s)"; grep "replay pipelines" $OUT/$mode$i.txt
	done
done
# Few files come back from a device call: everything in one archive.
(cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz $OUT/all.tgz)
