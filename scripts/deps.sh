#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the Debian 12 packages kvpool builds with, where they are missing.
# Needs root (or sudo) only when something is missing.
set -euo pipefail

# python3-*: the Python package (python/), its tests (ctest -L python) and
# test.sh's offline `pip install ./python` check (python3-venv: into a venv
# with Debian's torch, as Debian's own Python is externally managed, PEP 668).
# liburing-dev, libzstd-dev, libxxhash-dev: the disk tier (daemon/disk/):
# io_uring I/O, per-page zstd, the records' xxhash64 checksums.
# libjansson-dev: chunk metadata is a JSON object (kvpoold checks and matches it).
# libmicrohttpd-dev: kvpoold --metrics serves /metrics over it.
# prometheus, curl: test_metrics scrapes /metrics and runs promtool check metrics.
# libsystemd-dev: socket activation and sd_notify; systemd: test_systemd runs
# systemd-socket-activate and systemd-analyze (no running systemd needed).
# tmux: test_kvctl_top drives kvctl top in a pane (send-keys, capture-pane).
# libinih-dev: kvpool.conf is parsed by libinih.
# abigail-tools: test_abi compares libkvpool's ABI with abi/ (abidw, abidiff).
# libhiredis-dev: the remote tier (daemon/remote/) talks to Redis Cluster through
# hiredis (kvbench's Redis baseline too); redis-server: the remote tier's tests
# start clusters of it; redis-tools: redis-cli and redis-benchmark (remote_netns
# forms its cluster with redis-cli, kvbench remote's raw baseline);
# iproute2: remote_netns builds its three network namespaces with ip netns/veth.
# clang-14, libclang-rt-14-dev: scripts/fuzz.sh builds the fuzz targets (fuzz/)
# with clang and links libFuzzer (libclang_rt.fuzzer) and the sanitizers from it.
pkgs=(gcc make cmake pkg-config liburing-dev libzstd-dev libxxhash-dev libcmocka-dev libssl-dev
      libjansson-dev libinih-dev libmicrohttpd-dev prometheus curl
      libsystemd-dev systemd tmux abigail-tools libhiredis-dev redis-server redis-tools iproute2 gnuplot-nox
      clang-14 libclang-rt-14-dev
      python3-dev python3-numpy python3-torch python3-pytest python3-pip python3-venv)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
		|| missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kvpool: installing missing Debian packages: ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || {
		echo "kvpool: need root or sudo to install: ${missing[*]}" >&2
		exit 1
	}
	sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
