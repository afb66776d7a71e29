#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""pybench: what a call costs from Python against the same call from C.

kvp_info round trips through kvpoold's rings, timed per call from Python
(Client.info, perf_counter_ns around each call) and from C (the extension's
_bench_info: the same kvp_info in a C loop, clock_gettime around each call),
on the same connection, in the same process and run, in alternating rounds so
that both see the same machine load. Reports p50/p99 of each and
py_over_c_p50 (issue 12: at most 2).

    python3 tools/pybench.py --kvpoold build/kvpoold --json bench/results/python-DATE.json
    KVPOOL_SOCKET=/run/kvpool/kvpoold.sock python3 tools/pybench.py   # an existing daemon

Needs the kvpool package on PYTHONPATH (build/python, or an installed one).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional


def pct(xs: List[int], p: float) -> float:
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(p / 100.0 * len(s)))])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def start_daemon(path: str) -> tuple:
    d = tempfile.mkdtemp(prefix="pybench-")
    sock = os.path.join(d, "kvpoold.sock")
    log = open(os.path.join(d, "kvpoold.log"), "w")
    proc = subprocess.Popen([path, f"--socket={sock}", "--backend=shm", "--foreground",
                             "--layout=layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16",
                             "--device_mem=16M", "--host_mem=0"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"kvpoold did not start (see {log.name})")
        time.sleep(0.02)
    time.sleep(0.1)
    return proc, sock, d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpoold", help="start this kvpoold (shm backend) on a temp socket")
    ap.add_argument("--socket", help="an existing daemon's socket (default $KVPOOL_SOCKET)")
    ap.add_argument("--iterations", type=int, default=20000, help="calls of each kind")
    ap.add_argument("--round", type=int, default=1000, help="calls per alternating round")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when py_over_c_p50 is above the limit (2)")
    args = ap.parse_args()

    import kvpool

    proc, tmp, sock = None, None, args.socket
    if args.kvpoold:
        proc, sock, tmp = start_daemon(args.kvpoold)
    try:
        with kvpool.connect(sock, "pybench") as c:
            user = 1
            with c.prepare(user, 0, 100) as lease:  # a cached user: a real answer
                lease.commit()
            for _ in range(2000):  # warm up both paths
                c.info(user)
            c._bench_info(user, 2000)
            py: List[int] = []
            cc: List[int] = []
            info = c.info
            clock = time.perf_counter_ns
            done = 0
            while done < args.iterations:
                n = min(args.round, args.iterations - done)
                for _ in range(n):
                    t0 = clock()
                    info(user)
                    py.append(clock() - t0)
                cc.extend(c._bench_info(user, n))
                done += n
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
            subprocess.run(["rm", "-rf", tmp], check=False)

    res: Dict[str, object] = {
        "benchmark": "python",
        "what": "kvp_info round trip through kvpoold's shm rings: Client.info from "
                "Python vs kvp_info from C, same process, same connection, alternating "
                f"rounds of {args.round}",
        "command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.date.today().isoformat(),
        "machine": {"host": platform.node(), "cpu": cpu_model(), "cpus": os.cpu_count(),
                    "kernel": platform.release()},
        "python": sys.version.split()[0],
        "interpreter": sys.executable,
        "iterations": args.iterations,
        "c": {"p50_ns": pct(cc, 50), "p99_ns": pct(cc, 99)},
        "py": {"p50_ns": pct(py, 50), "p99_ns": pct(py, 99)},
    }
    res["py_over_c_p50"] = round(res["py"]["p50_ns"] / res["c"]["p50_ns"], 3)
    res["py_over_c_p99"] = round(res["py"]["p99_ns"] / res["c"]["p99_ns"], 3)
    res["py_minus_c_p50_ns"] = res["py"]["p50_ns"] - res["c"]["p50_ns"]
    res["limit"] = 2.0
    res["ok"] = res["py_over_c_p50"] <= 2.0
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if res["ok"] or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
