#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# libkvpool's ABI:
#  - every function include/kvpool.h declares is exported, under a
#    KVPOOL_x.y version node, and nothing else is exported;
#  - every name libclient/kvpool.map lists exists;
#  - no unchecked CPU writer (kvp_append_cpu) is exported;
#  - abidiff against the last release's ABI (abi/kvpool-0.1.abi): no
#    function removed or changed, no public type changed (added functions
#    are fine: they go in a new node; kvp_stats, kvp_latency and
#    kvp_connect_opts may turn reserved words into fields, keeping their
#    size; the growing structs of kvpool.h, GROWING STRUCTS, may gain
#    fields at their end). A change fails with abidiff's report.
# Usage: test_abi.sh LIBKVPOOL SOURCE_DIR. Exit 77 (skip) without abidiff
# (Debian's abigail-tools) or without debug info in the library.
set -euo pipefail
lib=$1 src=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

exported=$(objdump -T "$lib" | awk '$2 == "g" && $4 == ".text" { print $6 " " $7 }')
# The API: every function include/kvpool.h declares (a declaration starts
# at column 0 with its type; the KVPOOL_0.1 entry points of the growing
# structs' calls are declared as "int (kvp_users)(...)", out of reach of
# their macros).
public=$(grep -E '^[a-z].*[ *(]kvp_[a-z0-9_]+\)?\(' "$src/include/kvpool.h" |
	grep -oE 'kvp_[a-z0-9_]+\)?\(' | head -n 1000 | tr -d '()' | sort -u)
[ "$(wc -l <<<"$public")" -gt 50 ] || fail "found only $(wc -l <<<"$public") functions in kvpool.h"
for f in $public; do
	grep -Eq "^KVPOOL_[0-9]+\.[0-9]+ +$f\$" <<<"$exported" ||
		fail "$f is declared in kvpool.h but not exported under a KVPOOL_x.y node:" \
		     "add it to the newest node of libclient/kvpool.map"
done
while read -r node name; do
	grep -qx "$name" <<<"$public" ||
		fail "$name ($node) is exported but kvpool.h does not declare it"
done <<<"$exported"
for name in $(sed -n 's/^\t\(kvp_[a-z0-9_]*\);$/\1/p' "$src/libclient/kvpool.map"); do
	grep -qx "$name" <<<"$public" ||
		fail "libclient/kvpool.map lists $name, which kvpool.h does not declare"
done
# Writers that take no client cannot check a lease (issue 30): the
# exported writes are kvp_append() and its kin, which do.
for f in kvp_append_cpu kvp_append_layers_cpu; do
	! grep -q " $f\$" <<<"$exported" ||
		fail "$f is exported: it writes wherever its slots say, with no lease" \
		     "check; keep it internal (kernels/kvp_kernels.h)"
done
echo "exports: $(wc -l <<<"$exported") functions, all declared in kvpool.h, all versioned"

command -v abidiff >/dev/null || {
	echo "SKIP: abidiff not found (Debian's abigail-tools): ABI not compared"; exit 77; }
[ "$(readelf -S "$lib" | grep -c '\.debug_info')" -gt 0 ] || {
	echo "SKIP: $lib has no debug info (build RelWithDebInfo or Debug)"; exit 77; }
base=$(ls "$src"/abi/kvpool-*.abi | sort -V | tail -1)
# The library's ABI written as the baseline was (scripts/abi-dump.sh), then
# the two compared: abidiff reads both the same way.
now=$(mktemp)
trap 'rm -f "$now"' EXIT
abidw --headers-dir "$src/include" --no-corpus-path --no-comp-dir-path --no-show-locs \
	--drop-private-types --type-id-style hash --out-file "$now" "$lib"
# The structs that grow into reserved words (abi/kvpool.abignore lets a
# field take one) must keep their size.
for t in kvp_stats kvp_latency kvp_connect_opts; do
	was=$(grep -o "<class-decl name='$t' size-in-bits='[0-9]*'" "$base" | grep -o '[0-9]*' | tail -1)
	is=$(grep -o "<class-decl name='$t' size-in-bits='[0-9]*'" "$now" | grep -o '[0-9]*' | tail -1)
	[ -n "$was" ] && [ "$was" = "$is" ] ||
		fail "struct $t is $is bits, was $was: it may only grow into its reserved words"
done
set +e
report=$(abidiff --no-added-syms --suppressions "$src/abi/kvpool.abignore" "$base" "$now" 2>&1)
rc=$?
set -e
# abidiff's status bits: 1 error, 2 usage, 4 ABI change, 8 incompatible change.
if [ $rc -ne 0 ]; then
	echo "$report" >&2
	fail "abidiff $base: status $rc; the ABI of a release changed (see above). If that" \
	     "is a new release, bump the version and run scripts/abi-dump.sh"
fi
echo "abidiff against $(basename "$base"): no change"
echo PASS
