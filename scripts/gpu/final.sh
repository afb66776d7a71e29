#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The session's closing run on the GPU machine, most important first (each
# step under its own time limit, so a slow one cannot starve the rest):
# the cuda build, the C GPU tests, scripts/scaling.sh with the cuda replay,
# the disk tier against recompute, kvbench disk on the machine's ext4.
# Everything lands in $OUT (small files only).
set -uo pipefail
source scripts/gpu/env.sh
{ nvidia-smi -L; nproc; uname -r; date -u; git log --oneline -1 2>/dev/null; } > $OUT/machine.txt
(cmake -S . -B /tmp/b $KVPOOL_GPU_CMAKE_FLAGS && cmake --build /tmp/b -j16) > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
echo "build ok"
timeout ${CTEST_S:-90} ctest --test-dir /tmp/b -L gpu -E "${CTEST_SKIP:-test_llm_gpu|test_hf_gpu}" \
	--output-on-failure > $OUT/ctest-gpu.txt 2>&1; echo "ctest rc=$?"; grep -E "tests passed|Passed|Failed|Skipped" $OUT/ctest-gpu.txt | tail -15
SCALING_BACKEND=cuda SCALING_SECONDS=${SCALING_SECONDS:-1} timeout ${SCALING_S:-150} \
	scripts/scaling.sh /tmp/b $OUT > $OUT/scaling.txt 2>&1; echo "scaling rc=$?"; tail -30 $OUT/scaling.txt
if [ -x /tmp/b/kvbench ] && /tmp/b/kvbench disk --help >/dev/null 2>&1; then
	mkdir -p /var/tmp/kvbench-disk
	timeout 150 /tmp/b/kvbench disk --dir /var/tmp/kvbench-disk --json > $OUT/disk-device.json 2> $OUT/disk-device.err
	echo "kvbench disk rc=$?"; head -c 1500 $OUT/disk-device.json
fi
if grep -q disk_dir /tmp/b/kvpoold 2>/dev/null || /tmp/b/kvpoold --help 2>&1 | grep -q disk_dir; then
	PYTHONPATH=/tmp/b/python timeout ${DISK_S:-120} /opt/torch/.venv/bin/python3 tools/disk_recompute.py \
		--build /tmp/b --disk-dir /var/tmp/kvdisk --json $OUT/disk-recompute.json > $OUT/disk-recompute.txt 2>&1
	echo "disk_recompute rc=$?"; tail -20 $OUT/disk-recompute.txt
fi
# zstd on K/V a model made (Llama-3-8B geometry and RoPE, random weights).
if [ -n "${ZSTD_KV:-}" ]; then
	timeout 200 /opt/torch/.venv/bin/python3 scripts/disk_kv_dump.py --model config:llama3-8b \
		--tokens 2048 --out /var/tmp/kv-llama.pages > $OUT/kv-llama.txt 2>&1 &&
	for c in none zstd zstd:1; do
		timeout 90 /tmp/b/kvbench disk --dir /var/tmp/kvbench-disk --compress $c --size 256M \
			--layout layers=32,kv_heads=8,head_dim=128,dtype=bf16,page_tokens=16 \
			--data /var/tmp/kv-llama.pages --json > $OUT/disk-llama-$c.json 2>>$OUT/kv-llama.txt
	done
	echo "zstd on llama kv rc=$?"; grep -h '"zstd_ratio\|compress_mbps\|demote_ratio\|"compress"' $OUT/disk-llama-*.json
fi
# The remote tier (issue 17) against recompute, when it is built.
if [ -f tools/remote_recompute.py ]; then
	PYTHONPATH=/tmp/b/python timeout ${REMOTE_S:-150} /opt/torch/.venv/bin/python3 tools/remote_recompute.py \
		--build /tmp/b --json $OUT/remote-recompute.json > $OUT/remote-recompute.txt 2>&1
	echo "remote_recompute rc=$?"; tail -20 $OUT/remote-recompute.txt
fi
(cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz)
