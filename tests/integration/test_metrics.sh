#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# kvpoold --metrics: a real kvpoold with two workers, load from kvbench
# throughput and one failing kvctl call, then a scrape with curl that
#  - promtool check metrics accepts (names, types, HELP, histograms);
#  - agrees with itself and with kvctl stats: ops_total{op="prepare"} ==
#    kvpool_prepares_total == the prepare histogram's count == kvctl's
#    prepares, and the failing call counted under its errno;
#  - lists only families man/kvpoold.8 documents, and has every name the
#    Grafana dashboard (etc/grafana) queries;
# and HTTP: 404 off /metrics, 405 for POST; a bad --metrics is exit 2
# naming the key.
# Usage: test_metrics.sh KVPOOLD KVCTL KVBENCH SOURCE_DIR. Exit 77 (skip)
# without curl or promtool (Debian's curl and prometheus packages).
set -euo pipefail
kvpoold=$1 kvctl=$2 kvbench=$3 src=$4
for tool in curl promtool; do
	command -v $tool >/dev/null || {
		echo "SKIP: $tool not found (scripts/deps.sh installs Debian's curl and prometheus)"
		exit 77
	}
done

dir=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*" >&2
	echo "--- kvpoold log:" >&2
	cat "$dir/log" >&2 || true
	exit 1
}

# A bad address: exit 2, the message names the key and what to use.
set +e
msg=$("$kvpoold" --foreground --backend=shm --socket="$dir/bad.sock" \
	--metrics=localhost:http 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] || fail "--metrics=localhost:http: exit $rc, want 2 ($msg)"
grep -q "metrics" <<<"$msg" && grep -q "127.0.0.1:9464" <<<"$msg" ||
	fail "--metrics=localhost:http: the message does not name the key and a form: $msg"

# Port 0: the kernel picks one; the log says which.
"$kvpoold" --foreground --backend=shm --socket="$dir/s.sock" --workers=2 \
	--device_mem=4M --host_mem=4M --metrics=127.0.0.1:0 >"$dir/log" 2>&1 &
pid=$!
port=
for _ in $(seq 100); do
	port=$(sed -n 's,.*metrics: serving http://127\.0\.0\.1:\([0-9]*\)/metrics.*,\1,p' \
		"$dir/log" | head -1)
	[ -n "$port" ] && [ -S "$dir/s.sock" ] && break
	sleep 0.1
done
[ -n "$port" ] || fail "no 'metrics: serving' line in the log"
url=http://127.0.0.1:$port/metrics

"$kvbench" throughput --clients 1 --users 64 --seconds 1 --warmup 0 \
	--socket "$dir/s.sock" >"$dir/bench" 2>&1 || fail "kvbench throughput: $(cat "$dir/bench")"
# One failing operation: a chunk nobody registered (chunk_get, ENOENT).
if "$kvctl" --socket "$dir/s.sock" chunk "$(printf '0%.0s' $(seq 64))" >/dev/null 2>&1; then
	fail "kvctl chunk of an unknown id succeeded"
fi

curl -sf "$url" >"$dir/m" || fail "curl $url"
promtool check metrics <"$dir/m" || fail "promtool check metrics rejects the scrape"

val() { # the value of one series, exactly as written (name{labels})
	awk -v s="$1" '$1 == s { print $2 }' "$dir/m"
}
ops=$(val 'kvpool_ops_total{op="prepare"}')
prepares=$(val 'kvpool_prepares_total{tenant="default",pool="0",gpu="0"}')
count=$(val 'kvpool_op_duration_seconds_count{op="prepare"}')
inf=$(val 'kvpool_op_duration_seconds_bucket{op="prepare",le="+Inf"}')
kvctl_prepares=$("$kvctl" --socket "$dir/s.sock" --json stats |
	sed -n 's/^  "prepares": \([0-9]*\),$/\1/p')
[ -n "$ops" ] && [ "$ops" -gt 1000 ] || fail "kvpool_ops_total{op=\"prepare\"} is '$ops'"
[ "$ops" = "$prepares" ] && [ "$ops" = "$count" ] && [ "$ops" = "$inf" ] &&
	[ "$ops" = "$kvctl_prepares" ] ||
	fail "prepares disagree: ops_total $ops, prepares_total $prepares," \
	     "histogram count $count, +Inf $inf, kvctl stats $kvctl_prepares"
[ "$(val 'kvpool_op_errors_total{op="chunk_get",error="ENOENT"}')" = 1 ] ||
	fail "the failed chunk_get is not kvpool_op_errors_total{op=\"chunk_get\",error=\"ENOENT\"} 1"
[ "$(val 'kvpool_workers')" = 2 ] || fail "kvpool_workers is not 2"
for t in device host; do
	grep -q "^kvpool_tier_frames{tenant=\"default\",pool=\"0\",gpu=\"0\",tier=\"$t\",state=\"free\"} " \
		"$dir/m" || fail "no free frames of the $t tier"
done
# Copy bandwidth both ways: bytes and seconds served as pairs, and copies
# that moved bytes took time (on shm their wall time).
for d in d2h h2d; do
	b=$(val "kvpool_copy_${d}_bytes_total{tenant=\"default\",pool=\"0\",gpu=\"0\"}")
	t=$(val "kvpool_copy_${d}_seconds_total{tenant=\"default\",pool=\"0\",gpu=\"0\"}")
	[ -n "$b" ] && [ -n "$t" ] || fail "kvpool_copy_${d}_bytes_total '$b' or _seconds_total '$t' missing"
	[ "$b" = 0 ] || awk -v t="$t" 'BEGIN { exit !(t > 0) }' ||
		fail "kvpool_copy_${d}_bytes_total is $b but _seconds_total is $t"
done
# The histogram's buckets never decrease.
awk -F'[{} ]' '/^kvpool_op_duration_seconds_bucket\{op="prepare"/ {
	if ($NF + 0 < last) exit 1; last = $NF + 0 }' "$dir/m" ||
	fail "prepare's buckets decrease"

# Every family documented, every name the dashboard asks for served.
families=$(sed -n 's/^# TYPE \([a-z0-9_]*\) .*/\1/p' "$dir/m")
for f in $families; do
	grep -q "^\.B $f\$" "$src/man/kvpoold.8" ||
		fail "$f is not in man/kvpoold.8 (METRICS: .B $f)"
done
for n in $(grep -oE '(kvpool|process)_[a-z0-9_]*' "$src/etc/grafana/kvpool-dashboard.json" |
	   sort -u); do
	base=$(sed -E 's/_(bucket|sum|count)$//' <<<"$n")
	# The remote tier's families are served only with --remote: those
	# must be documented (test_remote_hostile.py scrapes them).
	grep -qx "$n" <<<"$families" || grep -qx "$base" <<<"$families" ||
		{ [[ $n == kvpool_remote_* ]] && grep -q "^\.B $n\$" "$src/man/kvpoold.8"; } ||
		fail "the dashboard queries $n, which kvpoold does not serve"
done
# The process_* families, as Prometheus' client libraries serve them.
rss=$(val process_resident_memory_bytes) fds=$(val process_open_fds)
start=$(val process_start_time_seconds)
[ -n "$rss" ] && [ "$rss" -gt 1000000 ] && [ -n "$fds" ] && [ "$fds" -gt 3 ] &&
	awk -v s="$start" -v now="$(date +%s)" 'BEGIN { exit !(s > now - 600 && s <= now + 1) }' ||
	fail "process_*: resident '$rss', open fds '$fds', start time '$start'"

[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" = 404 ] ||
	fail "/ is not 404"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url")" = 405 ] ||
	fail "POST /metrics is not 405"

kill "$pid"
wait "$pid" || fail "kvpoold did not exit 0 on SIGTERM"
pid=
echo "PASS: $(grep -c '^# TYPE' "$dir/m") families, $ops prepares"
