#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job: build kvpool (Release) and run it on the recommender workload,
# on the shm backend: a private kvpoold with a device tier smaller than the
# working set and a host tier, four pipeline processes replaying a
# KuaiRand-1K-like trace through the shared-memory rings (info, prepare from
# start+len, append, commit, release; demotion, onload and eviction happen),
# then what the operator sees (kvctl stats, kvctl users), then a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j"$(nproc)" --target kvpoold kvctl kvbench

bin=build-release
dir=$(mktemp -d /tmp/kvpool-demo.XXXXXX)
sock=$dir/kvpoold.sock
export KVPOOL_SOCKET=$sock
cleanup() {
	[ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT

layout=layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16
echo "== kvpoold on $sock (shm backend, 48 MiB device tier, 32 MiB host tier, $layout)"
"$bin/kvpoold" --socket="$sock" --backend=shm --foreground --log="$dir/kvpoold.log" \
	--device_mem=48M --host_mem=32M --layout="$layout" &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

echo "== 4 pipeline processes replay the first day of a 200-user trace (batches of 8)"
"$bin/kvbench" replay --socket "$sock" --layout "$layout" --systems kvpool \
	--users 200 --first-days 1 --pipelines 4 --no-targets "$@"

echo
echo "== kvctl stats"
"$bin/kvctl" stats
echo
echo "== kvctl users (first 10)"
"$bin/kvctl" users --limit 10 2>/dev/null

echo
echo "== stop: SIGTERM"
kill -TERM "$daemon"
wait "$daemon" && echo "kvpoold exited cleanly"
daemon=
tail -n 3 "$dir/kvpoold.log"
