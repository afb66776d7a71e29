#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's commands, run as written (issue 26: commands that failed as
# written). Two checks:
#  1. the quick tour's "Run the daemon and look at it" block, extracted from
#     README.md and run with bash -e, build/ pointing at this build and
#     /tmp/kvp at a temp dir: every command must succeed;
#  2. every kvctl line in the README's sh blocks, run against a live kvpoold:
#     none may be a usage error (exit 2: a subcommand or option that does not
#     exist); kvctl top and --watch are interactive and only parsed (--help).
# Usage: test_readme.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd)
readme=$src/README.md
tmp=$(mktemp -d /tmp/kvpool-readme.XXXXXX)
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null
	# The tour's daemon, when the tour stopped before its own kill.
	[ -s "$tmp/kvp/kvpoold.pid" ] && kill "$(cat "$tmp/kvp/kvpoold.pid")" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

# The first ```sh block after a line, as text.
block_after() {
	awk -v mark="$1" '
		index($0, mark) { found = 1; next }
		found && /^```sh/ { inb = 1; next }
		inb && /^```/ { exit }
		inb { print }' "$readme"
}

tour=$(block_after "Run the daemon and look at it:")
[ -n "$tour" ] || { echo "FAIL: no quick-tour block in README.md" >&2; exit 1; }
printf '%s\n' "$tour" | sed -e "s|build/|$build/|g" -e "s|/tmp/kvp|$tmp/kvp|g" \
	>"$tmp/tour.sh"
echo "== the quick tour, as the README has it"
if ! (cd "$tmp" && timeout 300 bash -euo pipefail "$tmp/tour.sh") >"$tmp/tour.out" 2>&1; then
	echo "FAIL: the README's quick tour failed:" >&2
	cat "$tmp/tour.sh" "$tmp/tour.out" >&2
	exit 1
fi
grep -q "device" "$tmp/tour.out" || { echo "FAIL: no stats in the tour" >&2
				       cat "$tmp/tour.out" >&2; exit 1; }

echo "== every kvctl line of the README against a kvpoold"
sock=$tmp/s/kvpoold.sock
"$build/kvpoold" --socket="$sock" --backend=shm --foreground --device_mem=4M \
	--host_mem=4M >"$tmp/kvpoold.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
fails=0 n=0
while IFS= read -r line; do
	cmd=${line%%#*}
	cmd=${cmd#sudo }
	cmd=${cmd#build/}
	read -r -a argv <<<"$cmd"
	[ "${argv[0]:-}" = kvctl ] || continue
	argv=("${argv[@]:1}")
	case " ${argv[*]} " in
	*" top "* | *" --watch "*) argv+=(--help) ;;
	esac
	n=$((n + 1))
	rc=0
	timeout 20 "$build/kvctl" --socket="$sock" "${argv[@]}" >/dev/null 2>"$tmp/err" || rc=$?
	if [ "$rc" -eq 2 ] || [ "$rc" -gt 2 ]; then
		echo "FAIL: README: '$line' -> exit $rc: $(cat "$tmp/err")" >&2
		fails=$((fails + 1))
	fi
done < <(awk '/^ *```sh/ { inb = 1; next } inb && /^ *```/ { inb = 0 } inb' "$readme")
[ "$n" -gt 5 ] || { echo "FAIL: only $n kvctl lines found in README.md" >&2; exit 1; }
[ "$fails" -eq 0 ] || exit 1
echo "PASS: the quick tour, and $n kvctl lines of the README"
