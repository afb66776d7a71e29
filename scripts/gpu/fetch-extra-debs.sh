#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run here after ../shared/gpu/fetch-deps.sh: adds to .gpu/debs the Debian
# packages kvpool builds with that the shared script does not fetch, and
# redis-server for the remote tier's benchmark (the
# GPU machine has no network). scripts/gpu/env.sh uses them there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/debs
cd .gpu/debs
apt-get download libjansson-dev libjansson4 libhiredis-dev libhiredis0.14 \
	libxxhash-dev libxxhash0 libmicrohttpd-dev libmicrohttpd12 \
	libinih-dev libinih1 libsystemd-dev libsystemd0 \
	redis-server redis-tools liblzf1 libjemalloc2 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
