#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# remote_netns (issue 17): the remote tier across three machines, made of
# three network namespaces joined by veth pairs to a bridge in a fourth,
# with the test's own addresses (10.X.Y.1-3/24):
#   store: a redis-server cluster node in each of A, B and C, one cluster;
#   kvpoold in A and in B, each --remote= the cluster.
# 1. A computes a prompt's pages, and other prompts push them out of its
#    device tier: they are written behind to the store.
# 2. B's lookup of the same tokens reports them cached (one batched round
#    onloads them), B's bytes equal A's, only the last token to compute;
#    the same for a sealed chunk (B's register finds it sealed), and for a
#    prompt A still holds (published ahead of eviction by A's reclaimer).
# 3. C's store node is killed; B looks up a second prompt A stored: the
#    pages before the first one on C come back, the rest are misses
#    (recomputed), every byte served is A's, no hang (bounded here), and
#    B's /metrics shows C's node down with errors.
# Everything it starts stops by itself (trap). Needs root for ip netns;
# exits 77 with the reason where it cannot make namespaces or has no
# redis-server / redis-cli.
#
# Usage: test_remote_netns.sh KVPOOLD REMOTE_CLIENT
set -uo pipefail

kvpoold=$1
client=$2
skip() { echo "SKIP remote_netns: $*"; exit 77; }
fail() { echo "FAIL remote_netns: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root for ip netns (CI runs as root)"
for p in ip redis-server redis-cli curl timeout; do
	command -v $p >/dev/null || skip "$p is not installed (scripts/deps.sh)"
done
[ -x "$kvpoold" ] && [ -x "$client" ] || fail "no $kvpoold or $client"

tag=kvr$$
a=${tag}a b=${tag}b c=${tag}c sw=${tag}s
net=10.$((100 + $$ % 100)).$(( ($$ / 100) % 250 ))
dir=$(mktemp -d /tmp/kvpool-remote-netns-XXXXXX)
pids=()

# Every process in the test's namespaces is the test's: all go, then the
# namespaces (and with them the veths and the bridge).
cleanup() {
	for n in $a $b $c $sw; do
		ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
	done
	for p in "${pids[@]}"; do
		kill -9 "$p" 2>/dev/null
	done
	wait 2>/dev/null
	for n in $a $b $c $sw; do
		ip netns del "$n" 2>/dev/null
	done
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add $sw 2>"$dir/err" || skip "cannot create a network namespace: $(cat "$dir/err")"
ns() { local n=$1; shift; ip netns exec "$n" "$@"; }
ns $sw ip link add br0 type bridge || skip "no bridge support in this kernel"
ns $sw ip link set br0 up
i=1
for n in $a $b $c; do
	ip netns add $n || fail "ip netns add $n"
	ns $sw ip link add p$i type veth peer name eth0 netns $n ||
		skip "no veth support in this kernel"
	ns $sw ip link set p$i master br0
	ns $sw ip link set p$i up
	ns $n ip link set lo up
	ns $n ip addr add $net.$i/24 dev eth0
	ns $n ip link set eth0 up
	i=$((i + 1))
done
ipa=$net.1 ipb=$net.2 ipc=$net.3

# The store: a cluster node in each namespace.
i=0
for n in $a $b $c; do
	ip=$net.$((i + 1))
	mkdir -p "$dir/r$i"
	ip netns exec $n redis-server --bind $ip --port 7000 --cluster-enabled yes \
		--cluster-config-file "$dir/r$i/nodes.conf" --dir "$dir/r$i" --save '' \
		--appendonly no --protected-mode no --logfile "$dir/r$i/log" &
	pids+=($!)
	i=$((i + 1))
done
rpid=("${pids[@]}")
for ip in $ipa $ipb $ipc; do
	# From A: also proves the bridge carries A's packets to B and C.
	timeout 5 bash -c "until ip netns exec $a redis-cli -h $ip -p 7000 ping 2>/dev/null |
		grep -q PONG; do sleep 0.1; done" ||
		fail "redis-server on $ip did not start or A cannot reach it"
done
ns $a timeout 20 redis-cli --cluster create $ipa:7000 $ipb:7000 $ipc:7000 \
	--cluster-replicas 0 --cluster-yes >"$dir/create" 2>&1 ||
	fail "redis-cli --cluster create: $(tail -3 "$dir/create")"
for ip in $ipa $ipb $ipc; do
	timeout 10 bash -c "until ip netns exec $a redis-cli -h $ip -p 7000 cluster info |
		grep -q cluster_state:ok; do sleep 0.1; done" ||
		fail "the cluster did not form at $ip"
done
url=redis-cluster://$ipa:7000,$ipb:7000,$ipc:7000

# kvpoold in A and in B: a device tier of 64 pages of 16 KiB.
start_kvpoold() { # NS NAME
	ip netns exec $1 "$kvpoold" -f --socket="$dir/$2.sock" --device_mem=1M --host_mem=1M \
		--remote="$url" --remote_timeout_ms=300 --metrics=127.0.0.1:0 \
		>"$dir/$2.log" 2>&1 &
	pids+=($!)
	timeout 5 bash -c "until grep -q 'metrics: serving' '$dir/$2.log'; do sleep 0.05; done" ||
		fail "kvpoold $2 did not start: $(tail -3 "$dir/$2.log")"
}
metrics() { # NS NAME
	local port
	port=$(sed -n 's,.*metrics: serving http://127\.0\.0\.1:\([0-9]*\)/metrics.*,\1,p' \
		"$dir/$2.log")
	ns $1 curl -sf "http://127.0.0.1:$port/metrics"
}
metric() { # NS NAME SERIES
	metrics $1 $2 | awk -v s="$3" '$1 == s { print $2 }'
}
wait_for() { # SECONDS COMMAND...: until it succeeds; false past SECONDS
	local end=$((SECONDS + $1))
	shift
	until "$@"; do
		[ $SECONDS -lt $end ] || return 1
		sleep 0.05
	done
}
queue_empty() { # NS NAME: its write-behind queue is drained
	[ "$(metric $1 $2 kvpool_remote_queued_bytes)" = 0 ]
}
written_since() { # W0 N: A wrote at least N pages since it had written W0
	[ $(( $(metric $a A kvpool_remote_written_pages_total) - $1 )) -ge $2 ]
}
start_kvpoold $a A
start_kvpoold $b B

N=129  # 8 full pages of 16 tokens and one
N2=641 # 40 pages: some on C's slots (all 40 missing C: p = (2/3)^40)
# 1. A computes two prompts; 2,000 tokens of others evict them.
timeout 30 "$client" "$dir/A.sock" prefill 11 1000 $N 2000 ||
	fail "A's prefill of prompt 1"
timeout 30 "$client" "$dir/A.sock" prefill 22 50000 $N2 2000 ||
	fail "A's prefill of prompt 2"
wait_for 10 queue_empty $a A || fail "A's write-behind queue did not drain"
written=$(metric $a A kvpool_remote_written_pages_total)
[ "${written:-0}" -ge 16 ] || fail "A wrote ${written:-0} pages to the store, want >= 16"
echo "A: $written pages written behind"

# 2. B: the prompt is cached, its bytes are A's, one token to compute.
out=$(timeout 10 "$client" "$dir/B.sock" lookup 11 1000 $N 8) ||
	fail "B's lookup of prompt 1: $out"
echo "B prompt 1: $out"
grep -q '^cached=128 ' <<<"$out" || fail "B: not 128 tokens cached: $out"
grep -q '^recompute=1$' <<<"$out" || fail "B: recomputes more than the last token: $out"
onl=$(metric $b B kvpool_remote_onloaded_pages_total)
[ "${onl:-0}" -eq 8 ] || fail "B onloaded ${onl:-0} pages from the store, want 8"

# 2b. A sealed chunk (a document's KV): A registers and fills it, other
#     prompts push it out to the store; B's register of the same tokens
#     finds it sealed (nothing to compute) and B's bytes are A's.
NC=100 # 7 pages
timeout 30 "$client" "$dir/A.sock" chunk-put 33 90000 $NC 2000 ||
	fail "A's chunk"
wait_for 10 queue_empty $a A || fail "A's write-behind queue did not drain after the chunk"
onl0=$(metric $b B kvpool_remote_onloaded_pages_total)
out=$(timeout 10 "$client" "$dir/B.sock" chunk-get 33 90000 $NC 1) ||
	fail "B's register of A's chunk: $out"
onl=$(metric $b B kvpool_remote_onloaded_pages_total)
[ $((onl - onl0)) -eq 7 ] || fail "B onloaded $((onl - onl0)) chunk pages, want 7"
echo "B chunk: found sealed, A's bytes, 7 pages from the store"

# 2c. Ahead of eviction: a prompt A computes and keeps (nothing pushes it
#     out) reaches the store by A's reclaimer tick; B finds it cached.
w0=$(metric $a A kvpool_remote_written_pages_total)
timeout 30 "$client" "$dir/A.sock" prefill 44 70000 $N 0 || fail "A's prefill of prompt 3"
wait_for 10 written_since $w0 8 || fail "A did not publish prompt 3 ahead of eviction"
out=$(timeout 10 "$client" "$dir/B.sock" lookup 44 70000 $N 8) ||
	fail "B's lookup of prompt 3, which A still holds: $out"
echo "B prompt 3 (A still holds it): $out"

# 3. C's store node dies; B asks for prompt 2.
kill -9 "${rpid[2]}"
t0=$(date +%s%N)
out=$(timeout 10 "$client" "$dir/B.sock" lookup 22 50000 $N2 -1) ||
	fail "B's lookup of prompt 2 with C down: $out"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "B prompt 2, C down: $out (${ms} ms)"
[ $ms -lt 5000 ] || fail "B's lookup with a store node down took $ms ms"
pages=$(sed -n 's/^cached=[0-9]* pages=\([0-9]*\)$/\1/p' <<<"$out")
[ "${pages:-40}" -lt 40 ] || fail "B found all 40 pages with C down"
up=$(metric $b B "kvpool_remote_node_up{node=\"$ipc:7000\"}")
err=$(metric $b B "kvpool_remote_node_errors_total{node=\"$ipc:7000\"}")
[ "$up" = 0 ] || fail "B's metrics: node $ipc:7000 up=$up after it was killed"
[ "${err:-0}" -ge 1 ] || fail "B's metrics: no errors counted for $ipc:7000"
# Both daemons still serve.
for s in A B; do
	timeout 10 "$client" "$dir/$s.sock" lookup 11 1000 $N -1 >/dev/null ||
		fail "kvpoold $s does not answer after the store node died"
done
echo "PASS remote_netns"
exit 0
