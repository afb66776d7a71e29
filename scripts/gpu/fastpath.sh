#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 27's proof on the GPU machine, in one device call, most important
# first (each step under its own time limit): the build; the paged-attention
# kernel against its torch reference (tests/python/test_paged_attention.py:
# fp32/bf16/fp16, GQA, shared launches, splits, a graph replayed for other
# lengths); then tools/fastpath.py (TTFT, decode step, graph floors, batch
# of 8, repeated compositions) with --identity: chunk_proof --quick on the
# paged path (fp32 tokens identical to one full prefill; bf16 like for like
# through SDPA). Everything lands in $OUT.
#
#   run: bash scripts/gpu/fastpath.sh   (carry .gpu; see gpu/README.md). One
# device call may run 600 s: the limits below keep the whole under it.
set -uo pipefail
source scripts/gpu/env.sh
PY=/opt/torch/.venv/bin/python3
{ nvidia-smi -L; nproc; uname -r; date -u; git log --oneline -1 2>/dev/null; } > $OUT/machine.txt
(cmake -S . -B /tmp/b $KVPOOL_GPU_CMAKE_FLAGS && cmake --build /tmp/b -j16 --target kvpoold kvctl kvpool_python) \
	> $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
echo "build ok"
export PYTHONPATH=/tmp/b/python KVPOOLD=/tmp/b/kvpoold KVPOOL_SOURCE_DIR=$PWD
timeout ${KERNEL_S:-120} $PY -m pytest -q -p no:cacheprovider tests/python/test_paged_attention.py \
	> $OUT/test-paged-attention.txt 2>&1; echo "kernel tests rc=$?"; tail -15 $OUT/test-paged-attention.txt
timeout ${FAST_S:-480} $PY tools/fastpath.py --kvpoold /tmp/b/kvpoold --reps ${REPS:-5} --identity \
	--out $OUT/fastpath.json > $OUT/fastpath.txt 2>&1
echo "fastpath rc=$?"; tail -25 $OUT/fastpath.txt
