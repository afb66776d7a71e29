#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""disk_replay: the recommender replay with a disk tier the working set spills
into, against the same replay without one (issue 15, item 6).

Runs `kvbench replay --systems kvpool` twice on the same generated trace and
the same device and host tiers (a share of the working set each, so most
histories do not fit in memory): once without a disk tier (evicted histories
are recomputed) and once with --disk-dir/--disk-size (they are demoted to disk
and read back). Writes one JSON with both runs and a markdown table side by
side: hit rate, requests/s, KV served, prepare latencies, the pool's disk
counters.

    python3 scripts/disk_replay.py --build build --disk-dir /var/tmp/kvdisk \\
        --out bench/results/disk-replay-DATE
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Dict, List


def replay(args: argparse.Namespace, disk: bool) -> Dict[str, Any]:
    cmd: List[str] = [os.path.join(args.build, "kvbench"), "replay", "--systems", "kvpool",
                      "--users", str(args.users), "--days", str(args.days),
                      "--device-frac", str(args.device_frac),
                      "--host-frac", str(args.host_frac), "--json"]
    if args.backend != "shm":
        cmd += ["--backend", args.backend]
    if disk:
        shutil.rmtree(args.disk_dir, ignore_errors=True)
        os.makedirs(args.disk_dir)
        cmd += ["--disk-dir", args.disk_dir, "--disk-size", args.disk_size]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"disk_replay: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout)
    out["_command"] = " ".join(cmd)
    return out


def row(name: str, d: Dict[str, Any]) -> Dict[str, Any]:
    k = d["systems"]["kvpool"]
    pool = k.get("pool", {})
    return {
        "run": name,
        "hit_rate": k["hit_rate"],
        "requests_per_s": k["requests_per_s"],
        "kv_served_mib_per_s": k["bytes_per_s"] / 2**20,
        "wall_s": k["wall_s"],
        "prepare_p50_us": k["prepare_p50_ns"] / 1e3,
        "prepare_p99_us": k["prepare_p99_ns"] / 1e3,
        "onload_prepares": k["onload"]["prepares"],
        "evicted_pages": pool.get("evicted_pages"),
        "disk_demoted_pages": pool.get("disk_demoted_pages"),
        "disk_read_pages": pool.get("disk_read_pages"),
        "disk_dropped_pages": pool.get("disk_dropped_pages"),
        "command": d["_command"],
    }


def markdown(res: Dict[str, Any]) -> str:
    a, b = res["runs"]
    pool = res["pool"]
    lines = [
        f"# Replay with a spilling disk tier ({res['date']})",
        "",
        f"Machine: {res['machine'].get('cpu_model')} ({res['machine'].get('nproc')} CPUs), "
        f"kernel {res['machine'].get('kernel')}, host {res['host']}; disk tier in "
        f"`{res['disk_dir']}` ({res['disk_size']}).",
        "",
        f"Trace: generated, {res['users']} users, {res['days']} days; layout "
        f"{pool['layout']}; working set {pool['working_set_pages']} pages, device tier "
        f"{pool['device_pages']} + host tier {pool['host_pages']} pages: the rest spills. "
        f"Reference hit rates on the same trace: LRU over device + host "
        f"{res['lru_sim_hit_rate']:.4f}, no eviction {res['infinite_hit_rate']:.4f}.",
        "",
        "| | without disk tier | with disk tier |",
        "|---|---:|---:|",
    ]
    for key, fmt in [("hit_rate", "{:.4f}"), ("requests_per_s", "{:.0f}"),
                     ("kv_served_mib_per_s", "{:.0f}"), ("wall_s", "{:.1f}"),
                     ("prepare_p50_us", "{:.1f}"), ("prepare_p99_us", "{:.0f}"),
                     ("onload_prepares", "{}"), ("evicted_pages", "{}"),
                     ("disk_demoted_pages", "{}"), ("disk_read_pages", "{}"),
                     ("disk_dropped_pages", "{}")]:
        lines.append(f"| {key} | {fmt.format(a[key])} | {fmt.format(b[key])} |")
    lines += ["", "Commands (one run of this script, back to back):", "",
              f"    {res['command']}", "", f"    {a['command']}", f"    {b['command']}", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="holds kvbench and kvpoold")
    ap.add_argument("--disk-dir", required=True, help="the disk tier's directory (emptied)")
    ap.add_argument("--disk-size", default="1G")
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--device-frac", type=float, default=0.25)
    ap.add_argument("--host-frac", type=float, default=0.25)
    ap.add_argument("--backend", default="shm", choices=["shm", "cuda"])
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.md")
    args = ap.parse_args()

    without = replay(args, False)
    with_disk = replay(args, True)
    shutil.rmtree(args.disk_dir, ignore_errors=True)
    res: Dict[str, Any] = {
        "what": "kvbench replay, kvpool system, the same trace and tiers without and "
                "with a disk tier the working set spills into (issue 15, item 6)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([sys.executable] + sys.argv),
        "host": platform.node(),
        "machine": with_disk.get("machine", {}),
        "users": args.users, "days": args.days, "backend": args.backend,
        "disk_dir": args.disk_dir, "disk_size": args.disk_size,
        "pool": with_disk["pool"],
        "lru_sim_hit_rate": with_disk["lru_sim_hit_rate"],
        "infinite_hit_rate": with_disk["infinite_hit_rate"],
        "best_hit_rate": with_disk["best_hit_rate"],
        "runs": [row("without disk tier", without), row("with disk tier", with_disk)],
        "raw": {"without": without, "with": with_disk},
    }
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=2)
    md = markdown(res)
    with open(args.out + ".md", "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
