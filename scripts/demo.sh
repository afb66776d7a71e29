#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job: build kvpool (Release) and run it on a demo workload, on the
# shm backend: a private kvpoold, four client processes that prepare, append,
# commit and release KV pages for many users through the shared-memory rings,
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

echo "== kvpoold on $sock (shm backend, 96 MiB device tier, 256 MiB host tier)"
"$bin/kvpoold" --socket="$sock" --backend=shm --foreground --log="$dir/kvpoold.log" \
	--device_mem=96M --host_mem=256M --max_tokens_per_user=64 &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

echo "== 4 client processes, 256 users each, batches of 32: prepare + append + commit + release"
"$bin/kvbench" throughput --socket "$sock" --clients 4 --seconds 3 "$@"

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
