#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvpoold as a systemd service, without a running systemd.

1. notify: the test is the service manager. It binds a datagram socket,
   starts kvpoold --foreground with NOTIFY_SOCKET and WATCHDOG_USEC=200000,
   and checks what arrives: READY=1 with a STATUS= line naming the socket,
   only once kvpoold answers (kvctl stats works right after it), WATCHDOG=1
   pings about every 100 ms, then STOPPING=1 on SIGTERM and exit 0.
2. journal: with JOURNAL_STREAM naming its stderr, every log line starts
   with a syslog priority ("<6>info: ..."); a start-up error is "<3>error:".
3. socket activation: systemd-socket-activate --seqpacket listens and starts
   kvpoold on the first connection with the socket passed (LISTEN_FDS);
   kvctl stats through it works, the log says the socket was passed, and at
   SIGTERM kvpoold leaves the socket file (the service manager's) in place.
4. the units: systemd-analyze verify on kvpoold.service (ExecStart pointed
   at the built kvpoold) and kvpoold.socket prints nothing, and
   systemd-analyze security rates the service's sandbox 4.0 or better.

Usage: test_systemd.py KVPOOLD KVCTL UNIT_DIR. Exit 77 (skip) only where a
systemd tool is missing (Debian's systemd package has both).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

KVPOOLD, KVCTL, UNIT_DIR = sys.argv[1:4]
BASE = ["--foreground", "--backend=shm", "--device_mem=4M", "--host_mem=4M"]
STARTED = []  # every process started, killed at the end if still running


def start(*args, **kw):
    p = subprocess.Popen(*args, **kw)
    STARTED.append(p)
    return p


def fail(msg, log=None):
    print("FAIL: " + msg, file=sys.stderr)
    if log and os.path.exists(log):
        print("--- kvpoold log:\n" + open(log, errors="replace").read(), file=sys.stderr)
    sys.exit(1)


def wait_socket(sock, step):
    """Up to 100 steps of step seconds for kvpoold's socket file."""
    for _ in range(100):
        if os.path.exists(sock):
            return
        time.sleep(step)


def kvctl_stats(sock):
    return subprocess.run([KVCTL, "--socket", sock, "stats"], capture_output=True,
                          text=True, timeout=20)


def test_notify(tmp):
    ns = os.path.join(tmp, "notify")
    mgr = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    mgr.bind(ns)
    sock, log = os.path.join(tmp, "n.sock"), os.path.join(tmp, "n.log")
    env = dict(os.environ, NOTIFY_SOCKET=ns, WATCHDOG_USEC="200000")
    env.pop("JOURNAL_STREAM", None)
    with open(log, "w") as lf:
        p = start([KVPOOLD, *BASE, "--socket=" + sock], stderr=lf,
                  stdout=lf, env=env)
    msgs, ready_at = [], None
    mgr.settimeout(0.05)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            m = mgr.recv(4096).decode()
        except socket.timeout:
            if ready_at and time.monotonic() - ready_at > 1.2:
                break
            continue
        msgs.append((time.monotonic(), m))
        if "READY=1" in m and not ready_at:
            ready_at = time.monotonic()
            # Ready means serving: a client gets in at once.
            r = kvctl_stats(sock)
            if r.returncode != 0:
                p.kill()
                fail("kvctl stats right after READY=1: " + r.stderr, log)
    if not ready_at:
        p.kill()
        fail("no READY=1 within 10 s; got %r" % [m for _, m in msgs], log)
    ready = next(m for _, m in msgs if "READY=1" in m)
    if "STATUS=serving " + sock not in ready or "client(s)" not in ready:
        fail("READY=1 came without a STATUS= naming the socket: %r" % ready, log)
    pings = [t for t, m in msgs if m.strip() == "WATCHDOG=1"]
    if len(pings) < 4:
        fail("%d WATCHDOG=1 in about 1.2 s with WATCHDOG_USEC=200000 (want a "
             "ping every 100 ms)" % len(pings), log)
    # The median gap, not the largest: a loaded test machine may hold the
    # process off the CPU for a while, which says nothing about kvpoold.
    gaps = sorted(b - a for a, b in zip(pings, pings[1:]))
    median = gaps[len(gaps) // 2]
    if not 0.07 <= median <= 0.15:
        fail("watchdog pings %.0f ms apart (median); want about 100 ms, half "
             "of WATCHDOG_USEC" % (median * 1000), log)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=20)
    rest = []
    mgr.settimeout(0.2)
    try:
        while True:
            rest.append(mgr.recv(4096).decode())
    except socket.timeout:
        pass
    if rc != 0:
        fail("kvpoold exited %d on SIGTERM" % rc, log)
    if not any("STOPPING=1" in m for m in rest):
        fail("no STOPPING=1 at SIGTERM; got %r" % rest, log)
    print("notify: READY=1 %r, %d watchdog pings, STOPPING=1" % (ready, len(pings)))


def journal_env(path):
    st = os.stat(path)
    return dict(os.environ, JOURNAL_STREAM="%d:%d" % (st.st_dev, st.st_ino))


def test_journal(tmp):
    sock, log = os.path.join(tmp, "j.sock"), os.path.join(tmp, "j.log")
    open(log, "w").close()
    env = journal_env(log)
    with open(log, "a") as lf:
        p = start([KVPOOLD, *BASE, "--socket=" + sock], stderr=lf,
                  stdout=lf, env=env)
    wait_socket(sock, 0.1)
    kvctl_stats(sock)
    p.send_signal(signal.SIGTERM)
    if p.wait(timeout=20) != 0:
        fail("kvpoold (journal) did not exit 0", log)
    lines = open(log).read().splitlines()
    if not lines or any(not l.startswith("<6>info: ") and not l.startswith("<4>")
                        and not l.startswith("<3>") for l in lines):
        fail("log lines without a syslog priority prefix: %r" % lines[:5], log)
    if not any(l.startswith("<6>info: serving " + sock) for l in lines):
        fail("no '<6>info: serving' line", log)
    # A start-up error: the socket is taken by a second kvpoold.
    with open(log, "w") as lf:
        p = start([KVPOOLD, *BASE, "--socket=" + sock], stderr=lf,
                  stdout=lf, env=env)
    wait_socket(sock, 0.1)
    log2 = os.path.join(tmp, "j2.log")
    open(log2, "w").close()
    with open(log2, "a") as lf:
        rc = subprocess.run([KVPOOLD, *BASE, "--socket=" + sock], stderr=lf,
                            stdout=lf, env=journal_env(log2), timeout=20).returncode
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=20)
    err = [l for l in open(log2).read().splitlines() if "another kvpoold" in l]
    if rc == 0 or len(err) != 1 or not err[0].startswith("<3>error: "):
        fail("a second kvpoold on the socket: exit %d, want one '<3>error: another "
             "kvpoold ...' line" % rc, log2)
    print("journal: %d lines prefixed, start-up error %r" % (len(lines), err[0]))


def test_activation(tmp):
    tool = shutil.which("systemd-socket-activate")
    if not tool:
        print("SKIP: systemd-socket-activate not found (Debian's systemd package)")
        sys.exit(77)
    sock, log = os.path.join(tmp, "a.sock"), os.path.join(tmp, "a.log")
    with open(log, "w") as lf:
        p = start([tool, "--seqpacket", "-l", sock, KVPOOLD, *BASE,
                   "--socket=" + sock], stderr=lf, stdout=lf)
    wait_socket(sock, 0.05)
    r = kvctl_stats(sock)
    if r.returncode != 0 or "device" not in r.stdout:
        p.kill()
        fail("kvctl stats through the activated socket: %s %s" % (r.stdout, r.stderr), log)
    if "passed by the service manager" not in open(log).read():
        p.kill()
        fail("kvpoold did not say it took the passed socket", log)
    p.send_signal(signal.SIGTERM)  # the tool exec'd kvpoold: the same pid
    if p.wait(timeout=20) != 0:
        fail("activated kvpoold did not exit 0 on SIGTERM", log)
    if not os.path.exists(sock):
        fail("kvpoold removed the socket file the service manager owns", log)
    print("activation: served on the passed socket, left it in place")


def test_units(tmp):
    tool = shutil.which("systemd-analyze")
    if not tool:
        print("SKIP: systemd-analyze not found (Debian's systemd package)")
        sys.exit(77)
    d = os.path.join(tmp, "units")
    os.mkdir(d)
    svc = open(os.path.join(UNIT_DIR, "kvpoold.service")).read()
    # verify checks that ExecStart's binary exists: point it at this build's.
    exec_line = [l for l in svc.splitlines() if l.startswith("ExecStart=")][0]
    path = exec_line.split("=", 1)[1].split()[0]
    svc = svc.replace(path, os.path.abspath(KVPOOLD))
    open(os.path.join(d, "kvpoold.service"), "w").write(svc)
    shutil.copy(os.path.join(UNIT_DIR, "kvpoold.socket"), d)
    r = subprocess.run([tool, "verify", "--man=no", "kvpoold.service", "kvpoold.socket"],
                       cwd=d, capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
        fail("systemd-analyze verify: exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
    r = subprocess.run([tool, "security", "--offline=yes", "--threshold=40",
                        "kvpoold.service"], cwd=d, capture_output=True, text=True,
                       timeout=60)
    level = [l for l in r.stdout.splitlines() if "Overall exposure level" in l]
    if r.returncode != 0 or not level:
        fail("systemd-analyze security: exit %d (over 4.0?)\n%s" % (r.returncode,
             "\n".join(level) or r.stdout[-2000:] + r.stderr))
    print("units: verify clean; " + level[0].split("→")[-1].strip())


def main():
    tmp = tempfile.mkdtemp(prefix="kvpool-systemd-")
    try:
        test_notify(tmp)
        test_journal(tmp)
        test_units(tmp)
        test_activation(tmp)
    finally:
        for p in STARTED:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
