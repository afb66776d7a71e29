#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvpoold without --foreground (the README's quick tour) has every thread a
--foreground one has. The pools' threads (the shards' reclaimer, the disk
and remote tiers' threads) must be made after the fork that detaches: a
fork copies only the calling thread, so threads made before it are gone in
the daemon, and a lock one held at the fork stays held (the sanitizer
build's allocator lock hung kvctl stats under load). Both daemons here
serve the same flags; their thread counts must match, and kvctl stats must
answer the daemonized one.

Usage: test_daemonize.py KVPOOLD KVCTL.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KVPOOLD, KVCTL = sys.argv[1:3]
FLAGS = ["--backend=shm", "--device_mem=8M", "--host_mem=8M", "--workers=2"]


def threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def wait_served(sock, proc=None):
    """Until kvctl stats answers on sock (the workers run by then)."""
    deadline = time.monotonic() + 30
    while True:
        if os.path.exists(sock) and subprocess.run(
                [KVCTL, "--socket", sock, "stats"], capture_output=True,
                timeout=20).returncode == 0:
            return
        if time.monotonic() > deadline or (proc and proc.poll() is not None):
            sys.exit("FAIL: kvpoold did not serve %s" % sock)
        time.sleep(0.05)


def settled_threads(pid):
    """The thread count once it held still for half a second (a loaded
    machine may start the last thread late)."""
    last, same, deadline = -1, 0, time.monotonic() + 10
    while same < 5 and time.monotonic() < deadline:
        n = threads(pid)
        same = same + 1 if n == last else 0
        last = n
        time.sleep(0.1)
    return last


def main():
    tmp = tempfile.mkdtemp(prefix="kvpool-dz-")
    fg = None
    pidf = os.path.join(tmp, "d.pid")
    try:
        fsock = os.path.join(tmp, "f.sock")
        fg = subprocess.Popen([KVPOOLD, "--socket=" + fsock, "--foreground", *FLAGS],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_served(fsock, fg)
        want = settled_threads(fg.pid)
        dsock = os.path.join(tmp, "d.sock")
        r = subprocess.run([KVPOOLD, "--socket=" + dsock, "--pidfile=" + pidf,
                            "--log=" + os.path.join(tmp, "d.log"), *FLAGS],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            sys.exit("FAIL: daemonized kvpoold exited %d: %s" % (r.returncode, r.stderr))
        wait_served(dsock)
        pid = int(open(pidf).read())
        got = settled_threads(pid)
        st = subprocess.run([KVCTL, "--socket", dsock, "stats"], capture_output=True,
                            text=True, timeout=20)
        bad = []
        if got != want:
            bad.append("the daemonized kvpoold has %d threads, a --foreground one %d "
                       "(threads made before the fork are lost)" % (got, want))
        if st.returncode != 0 or "device" not in st.stdout:
            bad.append("kvctl stats against the daemonized kvpoold: %r" % st.stderr)
        for b in bad:
            print("FAIL: " + b, file=sys.stderr)
        if bad:
            sys.exit(1)
        print("PASS: %d threads each" % got)
    finally:
        if fg is not None:
            fg.send_signal(signal.SIGTERM)
            fg.wait(timeout=20)
        try:
            os.kill(int(open(pidf).read()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
