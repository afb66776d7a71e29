#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The socket's group can reach it (issue 26, item 1).

kvpoold --socket_group=G on a socket whose directories do not exist yet: a
process of another uid that has G among its groups (not the daemon's uid,
not root) connects with kvctl stats; one without G is refused by the socket
directory's mode, with the message naming the socket and the group. The
socket's directory is the daemon's uid's and G's, 0750; the directories
above it that kvpoold made are 0755 (nothing secret in a path). With
socket_mode granting others (0666) the directory is traversable by others
too.

Usage: test_socket_group.py KVPOOLD KVCTL. Exit 77 (skip) when not root
(the clients drop to uid 65534 with setpriv).
"""
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

KVPOOLD, KVCTL = sys.argv[1:3]
NOBODY, GROUP = 65534, 2000
bad = []


def check(cond, msg):
    if not cond:
        print("FAIL: " + msg, file=sys.stderr)
        bad.append(msg)


def kvctl(sock, groups):
    cmd = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY]
    cmd += ["--groups=" + ",".join(map(str, groups))] if groups else ["--clear-groups"]
    return subprocess.run(cmd + [KVCTL, "--socket", sock, "stats"],
                          capture_output=True, text=True, timeout=20)


def serve(tmp, *flags):
    sock = os.path.join(tmp, "run", "kvpool", "kvpoold.sock")
    log = open(os.path.join(tmp, "log"), "w")
    p = subprocess.Popen([KVPOOLD, "--socket=" + sock, "--backend=shm", "--foreground",
                          "--device_mem=4M", "--host_mem=4M", *flags],
                         stdout=log, stderr=log)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            sys.exit("FAIL: kvpoold did not serve: " +
                     open(os.path.join(tmp, "log")).read())
        time.sleep(0.05)
    return p, sock


def stop(p):
    p.send_signal(signal.SIGTERM)
    check(p.wait(timeout=20) == 0, "kvpoold did not exit 0")


def case_group(tmp):
    p, sock = serve(tmp, "--socket_group=%d" % GROUP)
    try:
        d = os.path.dirname(sock)
        st = os.stat(d)
        check(st.st_gid == GROUP and stat.S_IMODE(st.st_mode) == 0o750,
              "the socket directory is gid %d mode %o (want %d, 0750)"
              % (st.st_gid, stat.S_IMODE(st.st_mode), GROUP))
        up = os.stat(os.path.dirname(d))
        check(stat.S_IMODE(up.st_mode) == 0o755,
              "a directory kvpoold made above it is mode %o (want 0755)"
              % stat.S_IMODE(up.st_mode))
        r = kvctl(sock, [GROUP])
        check(r.returncode == 0 and "device" in r.stdout,
              "a member of socket_group could not connect: %r" % r.stderr)
        r = kvctl(sock, [])
        check(r.returncode != 0, "a uid outside socket_group connected")
    finally:
        stop(p)


def case_world(tmp):
    p, sock = serve(tmp, "--socket_mode=0666")
    try:
        st = os.stat(os.path.dirname(sock))
        check(stat.S_IMODE(st.st_mode) == 0o755,
              "socket_mode 0666: the socket directory is mode %o (want 0755)"
              % stat.S_IMODE(st.st_mode))
        r = kvctl(sock, [])
        check(r.returncode == 0, "socket_mode 0666: uid %d could not connect: %r"
              % (NOBODY, r.stderr))
    finally:
        stop(p)


def main():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("SKIP: needs root and setpriv (clients as uid 65534)")
        sys.exit(77)
    for case in (case_group, case_world):
        tmp = tempfile.mkdtemp(prefix="kvpool-sg-")
        os.chmod(tmp, 0o755)
        try:
            case(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if bad:
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
