#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Pools per GPU on the shm backend (issue 31):
#  - devices = all: one pool (device 0), the log says so, and it serves:
#    kvbench throughput's prepares and commits through pool 0 reach it; a
#    reload of the same file keeps it, one that lists devices is refused;
#  - devices = 0,1 (and 1,0: the label is the devices entry, not the pool
#    index): every per-pool /metrics series carries gpu beside pool, both
#    pools appear, and kvctl stats and kvctl top show one row per pool with
#    its GPU;
#  - tp = 2 over devices 0,1 (listed, or all on shm): one pool whose series
#    say gpu="0+1".
# Usage: test_gpu_pools.sh KVPOOLD KVCTL KVBENCH. Exit 77 (skip) without curl.
set -euo pipefail
kvpoold=$1 kvctl=$2 kvbench=$3
command -v curl >/dev/null || { echo "SKIP: curl not found (Debian's curl)"; exit 77; }

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
# start FLAGS...: a kvpoold on $dir/s.sock with /metrics on a port of the
# kernel's choosing; $url is its /metrics.
start() {
	rm -f "$dir/s.sock"
	"$kvpoold" --foreground --backend=shm --socket="$dir/s.sock" --workers=2 \
		--device_mem=4M --host_mem=4M --metrics=127.0.0.1:0 "$@" >"$dir/log" 2>&1 &
	pid=$!
	port=
	for _ in $(seq 100); do
		port=$(sed -n 's,.*metrics: serving http://127\.0\.0\.1:\([0-9]*\)/metrics.*,\1,p' \
			"$dir/log" | head -1)
		[ -n "$port" ] && [ -S "$dir/s.sock" ] && break
		sleep 0.1
	done
	[ -n "$port" ] || fail "kvpoold $*: no 'metrics: serving' line in the log"
	url=http://127.0.0.1:$port/metrics
}
stop() {
	kill "$pid"
	wait "$pid" || fail "kvpoold exited $? at SIGTERM"
	pid=
}

# --- devices = all on shm: one pool, said in the log, and it serves.
start --devices=all
grep -q 'devices = all: .*one pool (device 0)' "$dir/log" ||
	fail "devices = all: no log line saying shm makes it one pool (device 0)"
"$kvbench" throughput --clients 1 --users 64 --seconds 1 --warmup 0 \
	--socket "$dir/s.sock" >"$dir/bench" 2>&1 || fail "kvbench throughput: $(cat "$dir/bench")"
"$kvctl" --socket "$dir/s.sock" --json stats >"$dir/stats" || fail "kvctl stats"
commits=$(sed -n 's/.*"commits": *\([0-9]*\).*/\1/p' "$dir/stats" | head -1)
[ -n "$commits" ] && [ "$commits" -gt 0 ] ||
	fail "devices = all: pool 0 served no commit ($(cat "$dir/stats"))"
curl -sf "$url" >"$dir/m" || fail "curl $url"
grep -q '^kvpool_commits_total{tenant="default",pool="0",gpu="0"} [1-9]' "$dir/m" ||
	fail "devices = all: no commits series of pool 0 on gpu 0: $(grep commits_total "$dir/m")"
grep -q 'pool="1"' "$dir/m" && fail "devices = all on shm: a pool 1 in /metrics"
stop
echo "devices = all: ok"

# A reload keeps devices = all (resolved in the running daemon, not in the
# file read again): not refused; devices = 0,1 instead is refused by name.
printf 'devices = all\ndevice_mem = 4M\nhost_mem = 4M\n' >"$dir/conf"
rm -f "$dir/s.sock"
"$kvpoold" --foreground --backend=shm --socket="$dir/s.sock" --config="$dir/conf" \
	>"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
"$kvctl" --socket "$dir/s.sock" reload >"$dir/reload" 2>&1 ||
	fail "kvctl reload of the same devices = all: $(cat "$dir/reload")"
grep -q 'refused key devices' "$dir/log" && fail "a reload of the same devices = all refused devices"
printf 'devices = 0,1\ndevice_mem = 4M\nhost_mem = 4M\n' >"$dir/conf"
"$kvctl" --socket "$dir/s.sock" reload >"$dir/reload" 2>&1 || true
for _ in $(seq 50); do grep -q 'refused key devices' "$dir/log" && break; sleep 0.1; done
grep -q 'refused key devices' "$dir/log" || fail "devices = all -> 0,1 by reload was not refused"
stop
echo "reload with devices = all: ok"

# --- devices = 0,1 and 1,0: gpu beside pool in every per-pool series, both
# pools there, one kvctl row per pool; the load on pool 0 counted there only.
for devs in 0,1 1,0; do
	start --devices=$devs
	g0=${devs%,*} g1=${devs#*,}
	"$kvbench" throughput --clients 1 --users 64 --seconds 1 --warmup 0 \
		--socket "$dir/s.sock" >"$dir/bench" 2>&1 || fail "kvbench throughput: $(cat "$dir/bench")"
	curl -sf "$url" >"$dir/m" || fail "curl $url"
	# Every series with a pool label has a gpu label right after it, the
	# pool's devices entry.
	bad=$(grep -E '^kvpool_[a-z_]+\{[^}]*pool="' "$dir/m" |
		grep -vE "pool=\"0\",gpu=\"$g0\"|pool=\"1\",gpu=\"$g1\"" || true)
	[ -z "$bad" ] || fail "devices=$devs: series without the pool's gpu label: $(head -3 <<<"$bad")"
	for p in 0 1; do
		g=$([ $p = 0 ] && echo $g0 || echo $g1)
		grep -q "^kvpool_tier_frames{tenant=\"default\",pool=\"$p\",gpu=\"$g\",tier=\"device\",state=\"free\"} " \
			"$dir/m" || fail "devices=$devs: no device tier series of pool $p on gpu $g"
	done
	c0=$(awk -v s="kvpool_commits_total{tenant=\"default\",pool=\"0\",gpu=\"$g0\"}" '$1 == s { print $2 }' "$dir/m")
	c1=$(awk -v s="kvpool_commits_total{tenant=\"default\",pool=\"1\",gpu=\"$g1\"}" '$1 == s { print $2 }' "$dir/m")
	[ -n "$c0" ] && [ "$c0" -gt 0 ] && [ "$c1" = 0 ] ||
		fail "devices=$devs: commits pool 0 '$c0' (want > 0), pool 1 '$c1' (want 0)"

	# kvctl stats: a row per pool with its GPU; JSON: the pools array.
	"$kvctl" --socket "$dir/s.sock" stats >"$dir/stats" || fail "kvctl stats"
	hdr=$(grep -n '^POOL  *GPU ' "$dir/stats" | cut -d: -f1)
	[ -n "$hdr" ] || fail "devices=$devs: kvctl stats has no POOL GPU table: $(cat "$dir/stats")"
	r0=$(sed -n "$((hdr + 1))p" "$dir/stats") r1=$(sed -n "$((hdr + 2))p" "$dir/stats")
	read -r p gpu _ <<<"$r0"
	[ "$p $gpu" = "0 $g0" ] || fail "devices=$devs: kvctl stats pool row 1: '$r0'"
	read -r p gpu _ <<<"$r1"
	[ "$p $gpu" = "1 $g1" ] || fail "devices=$devs: kvctl stats pool row 2: '$r1'"
	"$kvctl" --socket "$dir/s.sock" --json stats >"$dir/stats.json" || fail "kvctl --json stats"
	tr -d ' \n' <"$dir/stats.json" >"$dir/flat"
	grep -q "\"pools\":\[{\"pool\":0,\"gpu\":$g0,.*},{\"pool\":1,\"gpu\":$g1," "$dir/flat" ||
		fail "devices=$devs: kvctl --json stats has no pools array with both GPUs: $(cat "$dir/stats.json")"
	# kvctl top: the same rows on its screen.
	"$kvctl" --socket "$dir/s.sock" top --count 1 >"$dir/top" || fail "kvctl top --count 1"
	grep -q '^POOL  *GPU ' "$dir/top" && grep -Eq "^ *0 +$g0 " "$dir/top" &&
		grep -Eq "^ *1 +$g1 " "$dir/top" ||
		fail "devices=$devs: kvctl top has no row per pool and GPU: $(cat "$dir/top")"
	stop
	echo "devices = $devs: ok"
done

# --- tp = 2 over devices 0,1: one pool, its series labelled with both GPUs
# (gpu="0+1": every frame is on both at once).
start --devices=0,1 --tp=2 --layout=layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16
curl -sf "$url" >"$dir/m" || fail "curl $url"
grep -q '^kvpool_tier_frames{tenant="default",pool="0",gpu="0+1",tier="device",state="free"} ' \
	"$dir/m" || fail "tp = 2: no device tier series of pool 0 labelled gpu=\"0+1\": $(grep tier_frames "$dir/m" | head -3)"
! grep -q 'pool="1"' "$dir/m" || fail "tp = 2 over two devices: a second pool in /metrics"
stop
# devices = all with tp = 2 on shm: one pool over devices 0 and 1, said in the log.
start --devices=all --tp=2 --layout=layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16
grep -q 'devices = all: .*one pool (devices 0 to tp-1)' "$dir/log" ||
	fail "devices = all, tp = 2: no log line saying shm makes it one pool of devices 0 to tp-1"
curl -sf "$url" >"$dir/m" || fail "curl $url"
grep -q '^kvpool_tier_frames{tenant="default",pool="0",gpu="0+1",tier="device",state="free"} ' \
	"$dir/m" || fail "devices = all, tp = 2: pool 0 is not over devices 0+1"
stop
echo "tp = 2: ok"
echo PASS
