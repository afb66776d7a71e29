#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Write the ABI of a built libkvpool.so (public types from include/ only) to
# abi/kvpool-VERSION.abi, the baseline test_abi compares every build with.
# Run it when a release is made (and only then: between releases the ABI
# may grow, never change).
# Usage: scripts/abi-dump.sh [BUILD_DIR] (default build). Needs abigail-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
version=$(sed -n 's/^project(kvpool VERSION \([0-9]*\.[0-9]*\).*/\1/p' CMakeLists.txt)
out=abi/kvpool-$version.abi
mkdir -p abi
abidw --headers-dir include --no-corpus-path --no-comp-dir-path --no-show-locs \
	--drop-private-types --type-id-style hash --out-file "$out" "$build/libkvpool.so"
# No paths of this machine in the file (translation units are named by path).
sed -i "s,$PWD/,,g" "$out"
echo "wrote $out"
