#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build kvpool and run every test: the normal build (warnings as errors, all
# labels; gpu tests skip where there is no device), then the unit tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer, then an install check.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)

echo "== build (RelWithDebInfo, -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVPOOL_WERROR=ON
cmake --build build -j"$jobs"
echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== ASan + UBSan build: unit and integration tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVPOOL_SANITIZE=ON \
	-DKVPOOL_WERROR=ON -DKVPOOL_CUDA=OFF
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== install check"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install build --prefix "$prefix" >/dev/null
for f in bin/kvpoold bin/kvctl bin/kvbench include/kvpool.h lib/libkvpool.so \
	 lib/pkgconfig/kvpool.pc share/man/man1/kvctl.1 share/man/man1/kvbench.1 \
	 share/man/man3/kvpool.3 share/man/man5/kvpool.conf.5 share/man/man8/kvpoold.8; do
	[ -e "$prefix/$f" ] || { echo "install check: $f missing" >&2; exit 1; }
done
# A program built against the installed header and library, as a user would.
printf '#include <kvpool.h>\nint main(void) { return kvp_version() > 0 ? 0 : 1; }\n' >"$prefix/t.c"
cc "$prefix/t.c" -o "$prefix/t" $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs kvpool)
LD_LIBRARY_PATH=$prefix/lib "$prefix/t"
echo "all tests passed"
