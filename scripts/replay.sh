#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The recommender replay with every baseline, in one command: build kvbench
# (Release), run `kvbench replay` (kvpool on a private kvpoold, the engine
# in-process, the same daemon over its Unix socket, a private redis-server)
# on a KuaiRand-1K-like trace, and write bench/results/replay-DATE.json, the
# markdown summary replay-DATE.md and two gnuplot PNGs (hit rate per hour of
# the trace, prepare latency CDF per system). Extra arguments go to
# `kvbench replay` (e.g. --first-days 7).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j"$(nproc)" --target kvpoold kvbench >/dev/null

date=$(date -u +%F)
res=bench/results
base=$res/replay-$date
plots=$(mktemp -d /tmp/kvpool-replay.XXXXXX)
trap 'rm -rf "$plots"' EXIT
args=(--users 1000 --first-days 2 --pipelines 4 --batch 8 "$@")

build-release/kvbench replay "${args[@]}" --json --md "$plots/summary.md" \
	--plot-dir "$plots" >"$base.json"

gnuplot <<GP
set terminal pngcairo size 1000,560 noenhanced
set datafile missing "NaN"
set key outside right
set grid
set output "$base-hitrate.png"
set title "Token hit rate per hour of the trace (pool: a quarter of the working set on the device, a quarter on the host)"
set xlabel "hour of the trace"
set ylabel "tokens not recomputed / tokens needed"
set yrange [0:1.02]
plot "$plots/hitrate.dat" u 1:2 w l lw 2 t "kvpool", \
     "" u 1:3 w l t "inproc", "" u 1:4 w l t "uds", "" u 1:5 w l t "redis", \
     "" u 1:6 w l dt 2 lw 2 t "best (bound)", "" u 1:7 w l dt 3 t "infinite", \
     "" u 1:8 w l dt 4 t "lru sim"
set output "$base-latency-cdf.png"
set title "Prepare latency CDF (prepares without onload)"
set xlabel "latency, us (log)"
set ylabel "fraction of prepares"
set logscale x
set yrange [0:1]
plot "$plots/cdf.dat" u 2:1 w l lw 2 t "kvpool", "" u 3:1 w l t "inproc", \
     "" u 4:1 w l t "uds", "" u 5:1 w l t "redis"
GP

{
	echo "# kvbench replay, $date"
	echo
	echo "Reproduce with one command: \`bash scripts/replay.sh\` (it wrote this file,"
	echo "\`$(basename "$base").json\` and the two PNGs below)."
	echo
	cat "$plots/summary.md"
	echo
	echo "![hit rate per hour]($(basename "$base")-hitrate.png)"
	echo
	echo "![prepare latency CDF]($(basename "$base")-latency-cdf.png)"
} >"$base.md"
echo "wrote $base.json $base.md $base-hitrate.png $base-latency-cdf.png"
