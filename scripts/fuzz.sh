#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the libFuzzer targets (fuzz/) with clang in build-fuzz and run each
# for a bounded time over its seed corpus (fuzz/corpus/TARGET), with
# ASan+UBSan. Fails when any target crashes, reports, leaks, times out or
# runs out of memory, printing the reproducer and the command that replays it.
#
#   bash scripts/fuzz.sh [--seeds] [TARGET...]
#
# FUZZ_SECONDS   seconds per target (default 20)
# FUZZ_RSS_MB    memory limit per target, MiB (default 2048)
# FUZZ_CC        the compiler (default clang-14; Debian's clang-14 and
#                libclang-rt-14-dev, which scripts/deps.sh installs)
# --seeds        regenerate fuzz/corpus with fuzz/make_seeds first
#
# New inputs the fuzzers find go to build-fuzz/fuzz-work/TARGET, not into
# the tree; crashes to build-fuzz/fuzz-crashes/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-20}
rss=${FUZZ_RSS_MB:-2048}
cc=${FUZZ_CC:-clang-14}
build=build-fuzz
all=(fuzz_ring fuzz_hello fuzz_config fuzz_disk_record fuzz_disk_scan
     fuzz_remote_value fuzz_cluster_reply)
seeds=0
targets=()
for a in "$@"; do
	case $a in
	--seeds) seeds=1 ;;
	fuzz_*) targets+=("$a") ;;
	*) echo "fuzz.sh: unknown argument '$a' (--seeds, or target names: ${all[*]})" >&2
	   exit 2 ;;
	esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

command -v "$cc" >/dev/null || {
	echo "fuzz.sh: no $cc; install clang-14 and libclang-rt-14-dev (scripts/deps.sh)" >&2
	exit 1
}
cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DKVPOOL_FUZZ=ON -DKVPOOL_TESTS=OFF \
	-DKVPOOL_CUDA=OFF -DKVPOOL_PYTHON=OFF -DKVPOOL_WERROR=OFF \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# Without hiredis there is no cluster client to fuzz.
build_targets=()
for t in "${targets[@]}"; do
	if [ "$t" = fuzz_cluster_reply ] && ! grep -q '^HIREDIS_FOUND:INTERNAL=1' "$build/CMakeCache.txt"; then
		echo "fuzz.sh: fuzz_cluster_reply skipped: no hiredis (libhiredis-dev)"
		continue
	fi
	build_targets+=("$t")
done
[ $seeds -eq 0 ] || build_targets+=(make_seeds)
cmake --build "$build" -j2 --target "${build_targets[@]}"
if [ $seeds -eq 1 ]; then
	rm -rf fuzz/corpus
	"$build/fuzz/make_seeds" fuzz/corpus
	echo "fuzz.sh: seeds written to fuzz/corpus"
fi

failed=()
for t in "${build_targets[@]}"; do
	[ "$t" != make_seeds ] || continue
	work=$build/fuzz-work/$t
	crashes=$build/fuzz-crashes/$t
	log=$build/fuzz-logs/$t.log
	mkdir -p "$work" "$crashes" "$(dirname "$log")"
	rm -f "$crashes"/*
	# -close_fd_mask=3: the daemon code's own messages stay out of the
	# log; libFuzzer's and the sanitizers' reports still come through.
	if "$build/fuzz/$t" "$work" "fuzz/corpus/$t" -max_total_time="$seconds" \
		-rss_limit_mb="$rss" -timeout=10 -max_len=65536 -close_fd_mask=3 \
		-print_final_stats=1 -artifact_prefix="$crashes/" >"$log" 2>&1; then
		echo "fuzz.sh: $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" |
			grep -o '[0-9]*$') runs in ${seconds}s, no finding"
		continue
	fi
	failed+=("$t")
	echo "fuzz.sh: $t FAILED; the end of $log:" >&2
	tail -n 40 "$log" >&2
	for f in "$crashes"/*; do
		[ -e "$f" ] || continue
		echo "fuzz.sh: reproducer: $f" >&2
		echo "fuzz.sh: replay:     $build/fuzz/$t $f" >&2
	done
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzz.sh: findings in: ${failed[*]}" >&2
	exit 1
fi
echo "fuzz.sh: every target ran ${seconds}s with no finding"
