#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One line of a `kvbench replay --json` result (cuda backend), for the GPU
scripts' logs: replay_summary.py FILE LABEL"""
import json
import sys

d = json.load(open(sys.argv[1]))
k = d["systems"]["kvpool"]
L = k["latency"]
us = lambda op, p: L[op][p] / 1e3  # noqa: E731
print(f"{sys.argv[2]:12} prep p50 {us('prepare', 'p50_ns'):.1f} p90 {us('prepare', 'p90_ns'):.1f}"
      f" p99 {us('prepare', 'p99_ns'):.1f} p999 {us('prepare', 'p999_ns'):.1f} us"
      f" | commit p99 {us('commit', 'p99_ns'):.0f} | onload p99 {us('prepare_onload', 'p99_ns'):.0f} us"
      f" | stalls {k['pool']['reclaim_stalls']} | GB/s {k['bytes_per_s'] / 1e9:.0f}"
      f" | hit {k['hit_rate']:.3f} | offload {d['gpu']['offload_vs_ceiling']:.3f}")
