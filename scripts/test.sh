#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build kvpool and run every test: the normal build (warnings as errors, all
# labels; gpu tests skip where there is no device), then the unit tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer, then an install check.
#
# `bash scripts/test.sh --install-check [BUILD_DIR]` runs only the install
# check, on a tree already built in BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/.."

# Install BUILD_DIR into a temp prefix and use the installed tree as a user
# would: every file there; the installed kvpoold, kvctl and kvbench run with
# no LD_LIBRARY_PATH (their RUNPATH, $ORIGIN/../lib, finds libkvpool.so):
# kvpoold serves a temp socket, kvctl stats asks it, SIGTERM stops it; a
# program built with pkg-config against the installed header and library,
# and one with find_package(kvpool) that talks to the installed kvpoold;
# the Python package imports, installed and pip-built; each installed man
# page renders without a warning.
install_check() {
	local build=$1 prefix pid sock i f b page warn py
	prefix=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: the variable is local
	trap "rm -rf '$prefix'" EXIT
	cmake --install "$build" --prefix "$prefix" >/dev/null
	for f in bin/kvpoold bin/kvctl bin/kvbench include/kvpool.h lib/libkvpool.so \
		 lib/pkgconfig/kvpool.pc share/man/man1/kvctl.1 share/man/man1/kvbench.1 \
		 share/man/man3/kvpool.3 share/man/man3/kvp_prepare.3 share/man/man5/kvpool.conf.5 \
		 share/man/man8/kvpoold.8 \
		 lib/systemd/system/kvpoold.service lib/systemd/system/kvpoold.socket \
		 lib/sysusers.d/kvpool.conf share/doc/kvpool/grafana/kvpool-dashboard.json \
		 lib/cmake/kvpool/kvpoolConfig.cmake lib/cmake/kvpool/kvpoolConfigVersion.cmake \
		 lib/cmake/kvpool/kvpoolTargets.cmake; do
		[ -e "$prefix/$f" ] || { echo "install check: $f missing" >&2; return 1; }
	done
	for b in kvpoold kvctl kvbench; do
		readelf -d "$prefix/bin/$b" | grep -q 'RUNPATH.*\[\$ORIGIN/\.\./lib\]' || {
			echo "install check: bin/$b has no RUNPATH \$ORIGIN/../lib:" >&2
			readelf -d "$prefix/bin/$b" | grep -iE 'rpath|runpath|needed' >&2
			return 1
		}
	done
	(
		unset LD_LIBRARY_PATH
		"$prefix/bin/kvctl" --version >/dev/null
		"$prefix/bin/kvbench" --version >/dev/null
		sock=$prefix/run/kvpoold.sock
		mkdir -p "$prefix/run"
		# The installed kvpool.conf, as the service reads it.
		"$prefix/bin/kvpoold" --config="$prefix/etc/kvpool.conf" --socket="$sock" \
			--backend=shm --foreground --device_mem=4M --host_mem=4M \
			>"$prefix/kvpoold.log" 2>&1 &
		pid=$!
		trap 'kill "$pid" 2>/dev/null || true' EXIT
		for i in $(seq 100); do
			[ -S "$sock" ] && break
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if ! "$prefix/bin/kvctl" --socket="$sock" stats >"$prefix/stats.out" 2>&1 ||
		   ! grep -q device "$prefix/stats.out"; then
			echo "install check: installed kvctl stats against the installed kvpoold failed:" >&2
			cat "$prefix/stats.out" "$prefix/kvpoold.log" >&2
			exit 1
		fi
		kill -TERM "$pid"
		wait "$pid" || { echo "install check: kvpoold exited $? on SIGTERM" >&2
				 cat "$prefix/kvpoold.log" >&2; exit 1; }
	)
	# A program built against the installed header and library, as a user would.
	printf '#include <kvpool.h>\nint main(void) { return kvp_version() > 0 ? 0 : 1; }\n' >"$prefix/t.c"
	# shellcheck disable=SC2046 # pkg-config prints several words
	cc "$prefix/t.c" -o "$prefix/t" $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs kvpool)
	LD_LIBRARY_PATH=$prefix/lib "$prefix/t"
	# The same through CMake: find_package(kvpool) in PREFIX/lib/cmake/kvpool,
	# the kvpool::kvpool target, only the installed files; the program asks
	# the installed kvpoold for its stats and checks the growable struct's
	# size, lists users through the kvp_users macro (kvp_users_sz, node
	# KVPOOL_0.2: kvpool.h, GROWING STRUCTS), then runs with no
	# LD_LIBRARY_PATH (the target's RUNPATH).
	mkdir -p "$prefix/cm"
	cat >"$prefix/cm/CMakeLists.txt" <<-'CM'
		cmake_minimum_required(VERSION 3.25)
		project(kvpool_client C)
		find_package(kvpool 0.1 REQUIRED)
		add_executable(client client.c)
		target_link_libraries(client PRIVATE kvpool::kvpool)
	CM
	cat >"$prefix/cm/client.c" <<-'C'
		#include <kvpool.h>
		#include <stdio.h>
		int main(int argc, char **argv)
		{
			struct kvp_connect_opts o = { .socket = argv[1], .name = "cmake-client" };
			struct kvp_client *c;
			struct kvp_stats st;
			struct kvp_user_info rows[4];
			uint64_t next;
			char err[KVP_ERRLEN];
			int rc;

			if (sizeof(st) != sizeof(st.tier) + KVP_STATS_WORDS * 8)
				return 3;
			rc = kvp_connect(&c, &o, err, sizeof(err));
			if (rc) {
				fprintf(stderr, "connect: %s\n", err);
				return 1;
			}
			rc = kvp_stats(c, 0, &st);
			printf("version %d, %llu device frames\n", kvp_version(),
			       (unsigned long long)st.tier[KVP_TIER_DEVICE].frames_total);
			if (!rc && kvp_users(c, 0, rows, 4, &next) != 0)
				rc = 4; /* an empty pool: no row, no error */
			kvp_close(c);
			return rc ? 2 : 0;
		}
	C
	cmake -S "$prefix/cm" -B "$prefix/cm/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
	cmake --build "$prefix/cm/build" >/dev/null
	(
		unset LD_LIBRARY_PATH
		sock=$prefix/run/cm.sock
		"$prefix/bin/kvpoold" --socket="$sock" --backend=shm --foreground \
			--device_mem=4M --host_mem=4M >"$prefix/kvpoold-cm.log" 2>&1 &
		pid=$!
		trap 'kill "$pid" 2>/dev/null || true' EXIT
		for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
		"$prefix/cm/build/client" "$sock" | grep -q '^version 1, 256 device frames$' || {
			echo "install check: the find_package(kvpool) client failed" >&2
			cat "$prefix/kvpoold-cm.log" >&2; exit 1; }
	)
	# The Python package: installed in PREFIX/lib/python3/dist-packages (its
	# RUNPATH finds the installed libkvpool), and built by pip from python/
	# against the installed libkvpool, offline.
	py=$(sed -n 's/^KVPOOL_PYTHON_EXECUTABLE:INTERNAL=//p' "$build/CMakeCache.txt")
	[ -n "$py" ] || { echo "install check: no Python package built (python3-dev?)" >&2
			  return 1; }
	(cd "$prefix" && unset LD_LIBRARY_PATH &&
	 PYTHONPATH=$prefix/lib/python3/dist-packages "$py" -c \
		'import kvpool; assert kvpool.library_version() > 0')
	# pip as the README says: Debian's Python is externally managed (PEP
	# 668), so into a venv that sees Debian's torch and numpy.
	"$py" -m venv --system-site-packages "$prefix/venv"
	KVPOOL_PREFIX=$prefix "$prefix/venv/bin/pip" install -q --no-build-isolation \
		--no-index ./python
	rm -rf python/build python/kvpool.egg-info
	(cd "$prefix" && "$prefix/venv/bin/python" -c \
		'import kvpool, kvpool.tiny; assert kvpool.library_version() > 0')
	# python3 -m kvpool.chat --tiny from the installed tree against the
	# installed kvpoold, with the layout its --help names: a chunk
	# registered and a generation.
	(
		unset LD_LIBRARY_PATH
		sock=$prefix/run/chat.sock
		lay=$(cd "$prefix" && PYTHONPATH=$prefix/lib/python3/dist-packages "$py" -c \
			'from kvpool.chat import TINY_LAYOUT; print(TINY_LAYOUT)')
		"$prefix/bin/kvpoold" --socket="$sock" --backend=shm --foreground \
			--device_mem=4M --host_mem=4M --layout="$lay" >"$prefix/kvpoold-chat.log" 2>&1 &
		pid=$!
		trap 'kill "$pid" 2>/dev/null || true' EXIT
		for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
		out=$(cd "$prefix" && printf '/register system You are terse.\n/generate hi\n/quit\n' |
		      PYTHONPATH=$prefix/lib/python3/dist-packages timeout 120 "$py" -m kvpool.chat \
			--tiny --socket="$sock" --max-tokens=4 2>&1) || {
			echo "install check: python3 -m kvpool.chat --tiny failed: $out" >&2; exit 1; }
		case $out in
		*error*|*Traceback*)
			echo "install check: kvpool.chat --tiny: $out" >&2; exit 1 ;;
		esac
	)
	# The installed units name the installed kvpoold and pass systemd's checks.
	grep -qx "ExecStart=$prefix/bin/kvpoold .*" "$prefix/lib/systemd/system/kvpoold.service" || {
		echo "install check: kvpoold.service does not run $prefix/bin/kvpoold" >&2; return 1; }
	# ... and the installed kvpool.conf, which the unit names.
	[ -f "$prefix/etc/kvpool.conf" ] &&
	grep -qx "Environment=KVPOOLD_OPTS=--config=$prefix/etc/kvpool.conf" \
		"$prefix/lib/systemd/system/kvpoold.service" || {
		echo "install check: no $prefix/etc/kvpool.conf named by kvpoold.service" >&2
		return 1; }
	# Documentation= is checked too (man: or file: paths that exist).
	warn=$(cd "$prefix/lib/systemd/system" &&
	       systemd-analyze verify kvpoold.service kvpoold.socket 2>&1) || true
	[ -z "$warn" ] || { echo "install check: systemd-analyze verify: $warn" >&2; return 1; }
	if command -v man >/dev/null; then
		for page in "$prefix"/share/man/man?/*; do
			# A call's own name (.so its family's page) is read by name below.
			grep -q '^\.so ' "$page" && continue
			warn=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null) || true
			[ -z "$warn" ] || { echo "install check: $page: $warn" >&2; return 1; }
		done
		# man kvp_commit (any call of kvpool.h) finds its family's page;
		# man kvpool the overview.
		for pair in kvp_prepare:kvp_prepare kvp_commit:kvp_prepare \
			    kvp_server_info:kvp_stats kvp_connect:kvp_connect \
			    kvp_chunk_entry:kvp_chunk_register kvpool:kvpool; do
			page=${pair%%:*}
			f=$(MANPATH=$prefix/share/man man -w "$page" 2>&1) &&
			[ "$f" = "$prefix/share/man/man3/${pair#*:}.3" ] || {
				echo "install check: man $page: $f" >&2; return 1; }
			warn=$(MANWIDTH=80 MANPATH=$prefix/share/man man --warnings "$page" 2>&1 \
			       >/dev/null) || true
			[ -z "$warn" ] || { echo "install check: man $page: $warn" >&2; return 1; }
		done
	else
		echo "install check: no man(1) here; man pages not rendered"
	fi
	echo "install check passed"
}

if [ "${1:-}" = "--install-check" ]; then
	install_check "${2:-build}"
	exit
fi

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

echo "== ASan + UBSan: kvbench prefix (chunk limits under pressure, through a private kvpoold)"
# Every workload of kvbench prefix on pools smaller than its working set:
# registrations that evict under max_chunks / chunk_memory_ratio, in-process
# and in the sanitizer kvpoold (issue 25: a use after free there took down
# every tenant). A smaller trace than the default, the same code paths.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	build-asan/kvbench prefix --json --conversations 40 --rag-requests 400 \
	--library 2000 --agent-requests 200 --compose-samples 500 \
	--kvpoold build-asan/kvpoold >/dev/null

echo "== fuzz targets (libFuzzer, clang): every parser of outside bytes, bounded"
# ring entries, the hello, kvpool.conf, disk records and files, store values
# and cluster replies; their seed corpora are fuzz/corpus (README, Fuzzing).
FUZZ_SECONDS=${FUZZ_SECONDS:-20} bash scripts/fuzz.sh

echo "== Release build: unit tests (what -O3 does to padding and aliasing)"
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DKVPOOL_WERROR=ON \
	-DKVPOOL_CUDA=OFF
cmake --build build-release -j"$jobs"
ctest --test-dir build-release --output-on-failure -j"$jobs" -L unit

echo "== the README's first command: scripts/demo.sh (its Release build is the one above)"
bash scripts/demo.sh >"${TMPDIR:-/tmp}/kvpool-demo.$$.log" 2>&1 || {
	echo "scripts/demo.sh failed:" >&2
	tail -n 40 "${TMPDIR:-/tmp}/kvpool-demo.$$.log" >&2
	exit 1
}
grep -q "kvpoold exited cleanly" "${TMPDIR:-/tmp}/kvpool-demo.$$.log"
rm -f "${TMPDIR:-/tmp}/kvpool-demo.$$.log"

echo "== install check"
install_check build
echo "all tests passed"
