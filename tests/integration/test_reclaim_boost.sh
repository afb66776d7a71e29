#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# kvpool.conf `reclaim_boost` (issue 32; shard.h, kvpool.conf(5)):
#  - a value that is not a boolean stops kvpoold before it serves: exit 2,
#    a message naming the key, the value and what to write;
#  - the same in a config file, naming the file's line;
#  - reclaim_boost = yes with reclaim = yes starts and serves a replay of
#    prepares and commits that runs the device tier past its watermarks
#    (kvbench throughput), and stops cleanly (exit 0 on SIGTERM);
#  - a reload that changes it is refused as a restart-only key.
# Usage: test_reclaim_boost.sh KVPOOLD KVCTL KVBENCH.
set -euo pipefail
kvpoold=$1 kvctl=$2 kvbench=$3
dir=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*" >&2
	cat "$dir/log" >&2 2>/dev/null || true
	exit 1
}

# 1. A bad value on the command line.
rc=0
"$kvpoold" --foreground --backend=shm --socket="$dir/s.sock" --reclaim_boost=maybe \
	>"$dir/out" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--reclaim_boost=maybe: exit $rc, want 2"
grep -q "reclaim_boost = 'maybe': use yes or no" "$dir/out" ||
	fail "--reclaim_boost=maybe: message: $(cat "$dir/out")"
[ ! -e "$dir/s.sock" ] || fail "a socket was made before the error"

# 2. In a file.
printf 'socket = %s\nbackend = shm\nreclaim_boost = sometimes\n' "$dir/s.sock" >"$dir/bad.conf"
rc=0
"$kvpoold" --foreground --config="$dir/bad.conf" >"$dir/out" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "reclaim_boost = sometimes in a file: exit $rc, want 2"
grep -q "bad.conf:3" "$dir/out" && grep -q "reclaim_boost" "$dir/out" ||
	fail "the file's error does not name its line and key: $(cat "$dir/out")"

# 3. On, serving, and a clean stop.
printf 'socket = %s\nbackend = shm\nworkers = 2\ndevice_mem = 8M\nhost_mem = 8M\nreclaim = yes\nreclaim_boost = yes\n' \
	"$dir/s.sock" >"$dir/good.conf"
"$kvpoold" --foreground --config="$dir/good.conf" >"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
[ -S "$dir/s.sock" ] || fail "kvpoold with reclaim_boost = yes did not start"
"$kvbench" throughput --socket "$dir/s.sock" --clients 2 --seconds 0.5 --warmup 0.1 \
	--json >"$dir/tp.json" 2>"$dir/tp.err" || fail "kvbench throughput: $(cat "$dir/tp.err")"
grep -q '"ops_per_s"' "$dir/tp.json" || fail "no ops_per_s in $(cat "$dir/tp.json")"

# 4. A reload that changes it is refused (restart only), the daemon goes on.
sed -i 's/reclaim_boost = yes/reclaim_boost = no/' "$dir/good.conf"
kill -HUP "$pid"
for _ in $(seq 100); do grep -q "reload: done" "$dir/log" && break; sleep 0.05; done
grep -q "refused key reclaim_boost" "$dir/log" || fail "the reload did not refuse reclaim_boost"
"$kvctl" --socket "$dir/s.sock" stats >/dev/null || fail "kvctl stats after the reload"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "kvpoold exited $rc on SIGTERM"
echo "ok"
