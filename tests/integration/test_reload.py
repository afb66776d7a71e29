#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""SIGHUP and kvctl reload: kvpoold re-reads its --config while serving.

A kvpoold on a kvpool.conf; the file is rewritten and kvpoold told:
 1. SIGHUP: max_chunks and chunk_memory_ratio reach the engine (the Python
    client's chunk_limits() reads the configured limits back), allow_uids
    lets uid 65534 in (refused before), log_level=debug is logged,
    max_clients_per_uid takes effect (logged), and device_mem, which sizes
    the pool, is refused with a line naming it;
 2. kvctl reload as an admin does the same; as uid 65534 it is refused
    naming admin_uids;
 3. a file that no longer parses changes nothing: the log (a file, log =
    FILE, not standard error) names the bad key and kvpoold keeps serving;
    kvctl reload of that file exits 1 naming it too, and a refused key
    (device_mem) makes kvctl reload exit 1 naming the key;
 4. SIGTERM still exits 0;
 5. under journald (JOURNAL_STREAM naming standard error) a fatal start-up
    error carries its syslog priority ("<3>"), so `journalctl -p warning`
    shows it.

Usage: test_reload.py KVPOOLD KVCTL PYTHON_BUILD_DIR.
Exit 77 (skip) when not root (uid 65534 needs setpriv as root).
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KVPOOLD, KVCTL, PYDIR = sys.argv[1:4]
LAYOUT = "layers=2,kv_heads=2,head_dim=8,dtype=fp32,page_tokens=16"


def fail(msg, log=None):
    print("FAIL: " + msg, file=sys.stderr)
    if log and os.path.exists(log):
        print("--- kvpoold log:\n" + open(log).read(), file=sys.stderr)
    sys.exit(1)


def conf(path, sock, **kv):
    base = dict(socket=sock, backend="shm", device_mem="4M", host_mem="4M",
                layout=LAYOUT, socket_mode="0666", allow_uids="0",
                max_chunks="10", chunk_memory_ratio="0.5", log_level="info",
                log=os.path.join(os.path.dirname(path), "log"))
    base.update(kv)
    with open(path, "w") as f:
        f.write("# test_reload\n")
        for k, v in base.items():
            f.write("%s = %s\n" % (k, v))


def kvctl(sock, *args, uid=None):
    cmd = [KVCTL, "--socket", sock, *args]
    if uid is not None:
        cmd = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20)


def wait_log(log, text, count=1, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if open(log).read().count(text) >= count:
            return
        time.sleep(0.05)
    fail("no %d x %r in the log" % (count, text), log)


def limits(sock):
    """The configured chunk limits, through the Python client (None when the
    package was not built)."""
    sys.path.insert(0, PYDIR)
    try:
        import kvpool
    except ImportError:
        return None
    c = kvpool.connect(sock)
    try:
        lim = c.chunk_limits()
        return lim["config_max_chunks"], round(lim["config_memory_ratio"], 3)
    finally:
        c.close()


def journald_priority(tmp):
    """5. A start-up error with standard error being the journal's stream
    (JOURNAL_STREAM = its device:inode, as systemd sets it) starts with its
    priority, <3> (err)."""
    path = os.path.join(tmp, "journal")
    with open(path, "w") as f:
        st = os.fstat(f.fileno())
        env = dict(os.environ, JOURNAL_STREAM="%d:%d" % (st.st_dev, st.st_ino))
        rc = subprocess.run([KVPOOLD, "--foreground", "--no_such_flag=1"],
                            stdout=f, stderr=f, env=env, timeout=20).returncode
    text = open(path).read()
    if rc == 0 or not text.startswith("<3>") or "no_such_flag" not in text:
        fail("a start-up error under journald: exit %d, %r (want non-zero, "
             "\"<3>\" first, naming no_such_flag)" % (rc, text))


def main():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("SKIP: needs root and setpriv (a client as uid 65534)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="kvpool-reload-")
    os.chmod(tmp, 0o755)
    sock, cfg, log, err = (os.path.join(tmp, n)
                           for n in ("s.sock", "kvpool.conf", "log", "stderr"))
    conf(cfg, sock)
    open(log, "w").close()
    with open(err, "w") as ef:
        p = subprocess.Popen([KVPOOLD, "--config=" + cfg, "--foreground"],
                             stdout=ef, stderr=ef)
    try:
        wait_log(log, "info: serving ")
        before = limits(sock)
        if before not in (None, (10, 0.5)):
            fail("chunk limits at start: %r, want (10, 0.5)" % (before,), log)
        if kvctl(sock, "stats", uid=65534).returncode == 0:
            fail("uid 65534 attached before allow_uids named it", log)

        # 1. SIGHUP
        conf(cfg, sock, max_chunks="20", chunk_memory_ratio="0.25",
             allow_uids="0,65534", log_level="debug", device_mem="8M",
             max_clients_per_uid="7")
        p.send_signal(signal.SIGHUP)
        wait_log(log, "reload: done")
        text = open(log).read()
        for want in ("reload: tenant default: max_tokens_per_user 0, max_chunks 20, "
                     "chunk_memory_ratio 0.25",
                     "reload: allow_uids: 0 -> 0,65534",
                     "reload: log_level debug",
                     "reload: attached clients: at most 7 per uid",
                     "warning: reload: refused key device_mem: it changed",
                     "reload: done, 1 key refused"):
            if want not in text:
                fail("after SIGHUP the log lacks %r" % want, log)
        after = limits(sock)
        if after not in (None, (20, 0.25)):
            fail("chunk limits after SIGHUP: %r, want (20, 0.25)" % (after,), log)
        r = kvctl(sock, "stats", uid=65534)
        if r.returncode != 0:
            fail("uid 65534 not let in after allow_uids was reloaded: " + r.stderr, log)

        # 2. kvctl reload: an admin's works, uid 65534's is refused.
        conf(cfg, sock, max_chunks="30", chunk_memory_ratio="0.25",
             allow_uids="0,65534", log_level="debug", max_clients_per_uid="7")
        r = kvctl(sock, "reload")
        if r.returncode != 0 or "reload: done" not in r.stdout:
            fail("kvctl reload as root: %d %s %s" % (r.returncode, r.stdout, r.stderr), log)
        wait_log(log, "reload: done", 2)
        if "max_chunks 30" not in open(log).read():
            fail("kvctl reload did not apply max_chunks = 30", log)
        if limits(sock) not in (None, (30, 0.25)):
            fail("chunk limits after kvctl reload are not (30, 0.25)", log)
        r = kvctl(sock, "reload", uid=65534)
        if r.returncode != 1 or "admin" not in r.stderr:
            fail("kvctl reload as uid 65534: exit %d, %r (want 1 naming admin)"
                 % (r.returncode, r.stderr), log)

        # 3. A broken file: nothing changes, kvpoold serves on.
        with open(cfg, "a") as f:
            f.write("no_such_key = 1\n")
        p.send_signal(signal.SIGHUP)
        wait_log(log, "reload: the settings could not be read")
        if "no_such_key" not in open(log).read():
            fail("the log file does not name the bad key of a failed reload", log)
        if kvctl(sock, "stats").returncode != 0:
            fail("kvpoold stopped serving after a bad reload", log)
        if limits(sock) not in (None, (30, 0.25)):
            fail("a bad reload changed the chunk limits", log)
        r = kvctl(sock, "reload")
        if r.returncode != 1 or "no_such_key" not in r.stderr:
            fail("kvctl reload of a broken file: exit %d, %r (want 1 naming "
                 "no_such_key)" % (r.returncode, r.stderr), log)
        conf(cfg, sock, max_chunks="30", chunk_memory_ratio="0.25",
             allow_uids="0,65534", log_level="debug", device_mem="16M")
        r = kvctl(sock, "reload")
        if r.returncode != 1 or "device_mem" not in r.stderr:
            fail("kvctl reload of a changed device_mem: exit %d, %r (want 1 "
                 "naming device_mem)" % (r.returncode, r.stderr), log)

        # 4.
        p.send_signal(signal.SIGTERM)
        if p.wait(timeout=20) != 0:
            fail("kvpoold did not exit 0 after the reloads", log)
        journald_priority(tmp)
        print("PASS (%s)" % ("chunk limits checked through the Python client"
                             if after else "no Python package: limits checked in the log"))
    finally:
        if p.poll() is None:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
