#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What a new operator hits, said in their words (issue 26, item 10).

 1. device_mem larger than the machine's memory on the shm backend: kvpoold
    starts but warns, naming device_mem, the GiB asked and the GiB there;
 2. kvctl offload --tier disk on a kvpoold without a disk tier: the message
    names the command the operator typed (offload --tier disk) and the fix
    (--disk_dir), never a raw tier bitmask or "evict";
 4. kvctl stats says what the daemon serves first (version, pid, uptime,
    backend, the layout every client must match, the disk and remote
    tiers), as text and in --json's "server" object;
 3. backend=cuda on a machine without an NVIDIA driver (skipped where a
    driver is loaded, or where kvpoold was built without CUDA): "no NVIDIA
    driver", and backend=shm as the way out, not the CUDA runtime's
    "driver version is insufficient".

Usage: test_operator_messages.py KVPOOLD KVCTL.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KVPOOLD, KVCTL = sys.argv[1:3]
# 4 MiB pages: a pool larger than the machine is a few thousand frames.
BIG_LAYOUT = "layers=8,kv_heads=8,head_dim=128,dtype=bf16,page_tokens=128"
bad = []


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg, file=sys.stderr)
        bad.append(msg)


def ram_bytes():
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def start(tmp, *flags, layout=None):
    sock = os.path.join(tmp, "s.sock")
    log = os.path.join(tmp, "log")
    lf = open(log, "w")
    args = [KVPOOLD, "--socket=" + sock, "--backend=shm", "--foreground"]
    if layout:
        args.append("--layout=" + layout)
    p = subprocess.Popen(args + list(flags), stdout=lf, stderr=lf)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if "info: serving " in open(log).read():
            return p, sock, log
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    sys.exit("FAIL: kvpoold did not start:\n" + open(log).read())


def stop(p):
    p.send_signal(signal.SIGTERM)
    check(p.wait(timeout=30) == 0, "kvpoold did not exit 0 on SIGTERM")


def case_memory(tmp):
    gib = ram_bytes() // (1 << 30) + 4
    p, _, log = start(tmp, "--device_mem=%dG" % gib, "--host_mem=0",
                      layout=BIG_LAYOUT)
    stop(p)
    text = open(log).read()
    line = next((l for l in text.splitlines() if "warning:" in l and "device_mem" in l), "")
    check(line and ("%d.0 GiB" % gib) in line and "this machine has" in line,
          "1: device_mem=%dG on a %.1f GiB machine: no warning naming both "
          "(log: %r)" % (gib, ram_bytes() / (1 << 30), text[:2000]))


def case_offload_disk(tmp):
    p, sock, _ = start(tmp, "--device_mem=4M", "--host_mem=4M")
    try:
        r = subprocess.run([KVCTL, "--socket", sock, "offload", "--user", "5",
                            "--tier", "disk"], capture_output=True, text=True,
                           timeout=20)
    finally:
        stop(p)
    check(r.returncode == 1, "2: kvctl offload --tier disk exit %d" % r.returncode)
    check("offload --tier disk" in r.stderr and "--disk_dir" in r.stderr and
          "0x" not in r.stderr and "evict" not in r.stderr,
          "2: kvctl offload --tier disk without a disk tier said %r" % r.stderr)


def case_stats_server(tmp):
    import json
    disk = os.path.join(tmp, "disk")
    os.mkdir(disk)
    layout = "layers=2,kv_heads=2,head_dim=8,dtype=fp32,page_tokens=16"
    p, sock, _ = start(tmp, "--device_mem=4M", "--host_mem=4M", "--disk_dir=" + disk,
                       "--disk_size=64M", "--workers=2", layout=layout)
    try:
        time.sleep(1.1)
        txt = subprocess.run([KVCTL, "--socket", sock, "stats"], capture_output=True,
                             text=True, timeout=20)
        js = subprocess.run([KVCTL, "--socket", sock, "stats", "--json"],
                            capture_output=True, text=True, timeout=20)
    finally:
        stop(p)
    check(txt.returncode == 0 and js.returncode == 0, "4: kvctl stats failed: %r %r"
          % (txt.stderr, js.stderr))
    lines = txt.stdout.splitlines()
    check(lines and lines[0].startswith("kvpoold ") and ("pid %d" % p.pid) in lines[0]
          and re.search(r"up [1-9][0-9]*s$", lines[0]),
          "4: the first line of kvctl stats: %r" % lines[:1])
    for want in ("backend   shm, 1 pool, 2 workers", "layout    " + layout,
                 "disk      %s, 64.0 MiB, none" % disk, "remote    none"):
        check(want in txt.stdout, "4: kvctl stats lacks %r:\n%s" % (want, txt.stdout))
    try:
        srv = json.loads(js.stdout)["server"]
    except (ValueError, KeyError) as e:
        check(False, "4: kvctl stats --json has no server object: %s %r" % (e, js.stdout[:300]))
        return
    check(srv.get("layout") == layout and srv.get("backend") == "shm" and
          srv.get("pid") == p.pid and srv.get("uptime_s", -1) >= 1 and
          srv.get("disk", {}).get("dir") == disk and srv.get("remote", 0) is None,
          "4: kvctl stats --json server: %r" % srv)


def case_no_driver():
    if os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi"):
        print("3: skipped: an NVIDIA driver is loaded here")
        return
    tmp = tempfile.mkdtemp(prefix="kvpool-msg-")
    try:
        r = subprocess.run([KVPOOLD, "--socket=" + os.path.join(tmp, "s.sock"),
                            "--backend=cuda", "--foreground"],
                           capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "built without CUDA" in r.stderr:
        print("3: skipped: this kvpoold was built without CUDA")
        return
    check(r.returncode != 0, "3: backend=cuda without a driver started")
    check("no NVIDIA driver" in r.stderr and "backend=shm" in r.stderr and
          "insufficient" not in r.stderr,
          "3: backend=cuda without a driver said %r" % r.stderr)


def main():
    for case in (case_memory, case_offload_disk, case_stats_server):
        tmp = tempfile.mkdtemp(prefix="kvpool-msg-")
        try:
            case(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    case_no_driver()
    if bad:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
