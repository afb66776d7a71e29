#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 31 on a 2-GPU machine (nvidia-h200-x2) in one device call, most
# important first, each step under its own time limit: the cuda build; the
# graph-replay probe of the paged kernel (issue 27's open fault); the gpu2
# tests (two GPUs) and the gpu tests; tools/tp_proof.py (TP=2 on one tp
# pool, NCCL, vs TP=1 and transformers); kvbench peer (moves between the
# GPUs vs the raw peer copy); then issue 32's scaling grid on 16 of the
# host's cores. Everything lands in $OUT.
#
#   run (kind nvidia-h200-x2, carry .gpu): bash scripts/gpu/multigpu.sh
set -uo pipefail
KVPOOL_GPU_WERROR=${KVPOOL_GPU_WERROR:-OFF} # a proof run must not die on a new compiler warning
source scripts/gpu/env.sh
PY=/opt/torch/.venv/bin/python3
{ nvidia-smi -L; nvidia-smi topo -m; nproc; uname -r; date -u; git log --oneline -1 2>/dev/null; } > $OUT/machine.txt 2>&1
t0=$SECONDS
(cmake -S . -B /tmp/b $KVPOOL_GPU_CMAKE_FLAGS && cmake --build /tmp/b -j32) \
	> $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
echo "build ok ($((SECONDS - t0)) s), compiler warnings: $(grep -c "warning:" $OUT/build.txt)"
export PYTHONPATH=/tmp/b/python KVPOOLD=/tmp/b/kvpoold KVPOOL_SOURCE_DIR=$PWD
timeout ${GRAPH_S:-60} $PY -m pytest -q -p no:cacheprovider tests/python/test_paged_attention.py -k graph \
	> $OUT/graph.txt 2>&1; echo "graph probe rc=$? ($((SECONDS - t0)) s)"
grep -E "^E +(case|AssertionError)|assert|passed|failed" $OUT/graph.txt | head -12
timeout ${GPU2_S:-150} ctest --test-dir /tmp/b -L gpu2 --output-on-failure > $OUT/ctest-gpu2.txt 2>&1
echo "ctest gpu2 rc=$? ($((SECONDS - t0)) s)"; grep -E "tests passed|Passed|Failed|Skipped|Not Run" $OUT/ctest-gpu2.txt | tail -12
# test_tp_gpu2 (in the gpu2 label above) is tools/tp_proof.py --chunk --hf; its JSON:
cp /tmp/b/python/tp_gpu2.json $OUT/tp2.json 2>/dev/null && tail -c 2500 $OUT/tp2.json
if /tmp/b/kvbench peer --help > /dev/null 2>&1; then
	timeout ${PEER_S:-60} /tmp/b/kvbench peer --json > $OUT/peer.json 2> $OUT/peer.err
	echo "kvbench peer rc=$? ($((SECONDS - t0)) s)"; head -c 1200 $OUT/peer.json; tail -5 $OUT/peer.err
fi
[ -n "${GPU1-1}" ] && timeout ${CTEST_S:-90} ctest --test-dir /tmp/b -L gpu -E "${CTEST_SKIP:-test_llm_gpu|test_hf_gpu}" \
	--output-on-failure > $OUT/ctest-gpu.txt 2>&1; echo "ctest gpu rc=$? ($((SECONDS - t0)) s)"
grep -E "tests passed|Failed|Not Run" $OUT/ctest-gpu.txt | tail -8
# Issue 32: the grid four ways in one run on 16 of the host's cores: the
# default (one batch entry per lane), KVPOOL_BATCH=auto (a small submit as
# one entry on one lane when the lanes are quiet), one (always one lane)
# and 0 (one entry per operation, the way before batches); the replay
# (prepare p99 by phase) with the default only, with and without the
# reclaimer's boost (scaling.sh's replay_b). SCALING_MODES picks modes.
if [ -n "${SCALING-1}" ]; then
	for mode in ${SCALING_MODES:-lane auto one 0}; do
		pipes=""; [ $mode = lane ] && pipes="4 8 12"
		env KVPOOL_BATCH=$([ $mode = lane ] && echo 1 || echo $mode) SCALING_BACKEND=cuda \
			SCALING_SECONDS=${SCALING_SECONDS:-1} SCALING_WARMUP=0.5 SCALING_PIPELINES="$pipes" \
			SCALING_SUFFIX=batch-$mode timeout ${SCALING_S:-150} \
			taskset -c 0-15 scripts/scaling.sh /tmp/b $OUT > $OUT/scaling-$mode.txt 2>&1
		echo "scaling $mode rc=$? ($((SECONDS - t0)) s)"; tail -8 $OUT/scaling-$mode.txt
	done
fi
# Few files come back from a device call: everything in one archive.
(cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz $OUT/all.tgz)
