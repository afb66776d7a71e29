#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job: build kvpool (Release) and run it on the demo workload.
# For now that is the engine benchmark on the shm backend; extra arguments
# go to `kvbench engine` (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j"$(nproc)" --target kvbench
exec build-release/kvbench engine "$@"
