#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# kvbench replay against a real kvpoold and redis-server (both started and
# stopped by kvbench), all four systems:
#  1. tests/data/replay-tiny.kvtrace with a pool that holds everything: every
#     system's hit rate, and the bound, must be the hand-computed 32/108
#     (the trace's comments show the arithmetic);
#  2. a small generated trace with a pool smaller than its working set: it
#     must run, demote, and report hit rates no system exceeds the bound with.
# Usage: test_replay.sh KVBENCH DATA_DIR. Exit 77 (skip) without redis-server
# or in a kvbench built without hiredis.
set -euo pipefail
kvbench=$1
data=$2
# Built without hiredis the Redis system is a stub (reported skipped): this
# test checks all four, so it skips; built with hiredis Redis is required.
if "$kvbench" replay --help 2>&1 | grep -q "built without hiredis"; then
	echo "SKIP: kvbench was built without hiredis (scripts/deps.sh installs libhiredis-dev)"
	exit 77
fi
command -v redis-server >/dev/null || {
	echo "SKIP: redis-server not found (scripts/deps.sh installs Debian's)"; exit 77; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT

# One number from the JSON: the value after "key": in the object named by
# the optional prefix (a system's name).
num() {
	local obj=$1 key=$2
	if [ -n "$obj" ]; then
		tr -d '\n' <"$out" | grep -o "\"$obj\": *{[^}]*" | head -1 |
			grep -o "\"$key\": *[0-9.e+-]*" | head -1 | sed 's/.*: *//'
	else
		grep -o "\"$key\": *[0-9.e+-]*" "$out" | head -1 | sed 's/.*: *//'
	fi
}
same() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a - b < 1e-6 && b - a < 1e-6) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b + 1e-9) }'; }

echo "== hand-made trace, pool that holds everything"
"$kvbench" replay --trace "$data/replay-tiny.kvtrace" --pipelines 2 \
	--device-pages 256 --host-pages 64 --json >"$out"
want=$(awk 'BEGIN { printf "%.6f", 32 / 108 }')
for k in hit_rate best_hit_rate infinite_hit_rate; do
	v=$(num "" "$k")
	same "$v" "$want" || { echo "FAIL: $k $v, want $want (32 of 108 tokens)"; exit 1; }
done
for s in kvpool inproc uds redis; do
	v=$(num "$s" hit_rate)
	same "$v" "$want" || { echo "FAIL: $s hit_rate $v, want $want"; exit 1; }
	t=$(num "$s" hit_tokens)
	[ "$t" = 32 ] || { echo "FAIL: $s hit $t tokens, want 32"; exit 1; }
	a=$(num "$s" appended_tokens)
	[ "$a" = 76 ] || { echo "FAIL: $s appended $a tokens, want 108 - 32 = 76"; exit 1; }
done
echo "   all four systems and the bound: 32/108 = $want"

echo "== generated trace, 40 users, first day, a pool of 550 pages for 753 (evictions)"
"$kvbench" replay --users 40 --first-days 1 --pipelines 3 --device-pages 450 \
	--host-pages 100 --json >"$out"
best=$(num "" best_hit_rate)
for s in kvpool inproc uds redis; do
	v=$(num "$s" hit_rate)
	le "$v" "$best" || { echo "FAIL: $s hit rate $v above the bound $best"; exit 1; }
	b=$(num "$s" bytes_per_s)
	awk -v b="$b" 'BEGIN { exit !(b > 0) }' || { echo "FAIL: $s bytes_per_s $b"; exit 1; }
done
dem=$(grep -o '"demoted_users": *[0-9]*' "$out" | head -1 | sed 's/.*: *//')
[ "${dem:-0}" -gt 0 ] || { echo "FAIL: kvpool demoted no user: the pool was not under pressure"; exit 1; }
echo "   hit rates under the bound $best; kvpool demoted $dem users"
echo "PASS"
