#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# kvctl top under tmux, against a real kvpoold under load from kvbench:
# the screen is drawn in place (one header in the pane), shows both tiers,
# rates per second with prepares > 0 once a second sample exists, op
# latency percentiles for prepare and the top users; ^C (send-keys) ends
# it with status 0. Also `kvctl top --help` exits 0, bad --interval,
# --count and --json are usage errors (2), and `kvctl stats
# --watch 1 --count 3 --json` prints three objects whose prepares never
# decrease.
# Usage: test_kvctl_top.sh KVPOOLD KVCTL KVBENCH. Exit 77 (skip) without tmux.
set -euo pipefail
kvpoold=$1 kvctl=$2 kvbench=$3
command -v tmux >/dev/null || { echo "SKIP: tmux not found (Debian's tmux)"; exit 77; }

dir=$(mktemp -d)
session=kvtop$$
pid=
cleanup() {
	tmux -L "$session" kill-server 2>/dev/null || true
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*" >&2
	[ -f "$dir/pane" ] && { echo "--- pane:" >&2; cat "$dir/pane" >&2; }
	exit 1
}

"$kvctl" top --help >/dev/null || fail "kvctl top --help did not exit 0"
# Usage errors: exit 2 before connecting, naming the word.
for args in "top --json" "top --interval 0" "stats --count 2" "stats --watch x"; do
	set +e
	msg=$("$kvctl" --socket "$dir/none.sock" $args 2>&1)
	rc=$?
	set -e
	[ $rc = 2 ] || fail "kvctl $args: exit $rc, want 2 ($msg)"
done

"$kvpoold" --foreground --backend=shm --socket="$dir/s.sock" --workers=2 \
	--device_mem=4M --host_mem=4M >"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
"$kvbench" throughput --clients 1 --seconds 6 --warmup 0 --socket "$dir/s.sock" \
	>/dev/null 2>&1 &
bench=$!

tmux -L "$session" -f /dev/null new-session -d -x 120 -y 50 \
	"$kvctl --socket $dir/s.sock top --interval 1; echo \"top exited \$?\"; sleep 30"
ok=
for _ in $(seq 60); do
	sleep 0.25
	tmux -L "$session" capture-pane -p >"$dir/pane"
	if grep -q 'rates over the last interval' "$dir/pane" &&
	   grep -Eq '^per second: prepares [1-9]' "$dir/pane"; then
		ok=1
		break
	fi
done
[ -n "$ok" ] || fail "no second screen with prepares per second > 0 in 15 s"
[ "$(grep -c '^kvpool top: ' "$dir/pane")" = 1 ] ||
	fail "the screen is not redrawn in place (headers: $(grep -c '^kvpool top: ' "$dir/pane"))"
for want in '^device +[0-9]+ / [0-9]+ +frames used' '^host +[0-9]+ / ' \
	    '^LATENCY +OPS/S +P50 +P99 +P99.9' '^prepare +[1-9][0-9]* +<=[0-9.]+[um]?s' \
	    '^TOP USERS' '^[0-9]+ +0 +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+$' '^TOP TENANTS' \
	    '^tenant 0 ' '^while copying: device->host [^ ]+.* host->device [^ ]+'; do
	grep -Eq "$want" "$dir/pane" || fail "the pane lacks /$want/"
done
tmux -L "$session" send-keys C-c
for _ in $(seq 40); do
	sleep 0.1
	tmux -L "$session" capture-pane -p >"$dir/pane"
	grep -q 'top exited' "$dir/pane" && break
done
grep -Eq '(^|\^C)top exited 0$' "$dir/pane" || fail "kvctl top did not exit 0 at ^C"
wait "$bench" || true

"$kvctl" --socket "$dir/s.sock" stats --watch 1 --count 3 --json >"$dir/watch"
[ "$(grep -c '"scope"' "$dir/watch")" = 3 ] || fail "stats --watch 1 --count 3: not 3 objects"
sed -n 's/^  "prepares": \([0-9]*\),$/\1/p' "$dir/watch" | sort -nc ||
	fail "stats --watch: prepares decreased"
echo "PASS"
