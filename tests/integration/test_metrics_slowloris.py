#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvpoold --metrics under slowloris (issue 25, item 3): connections that
send a request's header one byte every second or so must not keep
scrapes out.

 1. 24 slow connections from one peer (127.0.0.2): the per-peer cap keeps
    most of them out; 5 scrapes from 127.0.0.1 each succeed within 2 s.
 2. 4 slow connections from each of 24 peers (127.0.0.10-33: 96, past any
    per-peer cap and past the connection limit): 5 scrapes, each within
    2 s.
 3. One slow connection alone is closed by kvpoold within the request
    deadline (3 s) and some slack, though it is never idle as long as the
    idle timeout (10 s); kvpool_metrics_slow_closed_total counts it.

Every loop is bounded; only loopback addresses. Usage:
test_metrics_slowloris.py KVPOOLD. Exit 77 (skip) when 127.0.0.2 cannot be
bound (a loopback without the whole 127/8).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SCRAPE_S = 2.0          # the bound on each scrape
DEADLINE_S = 3.0        # kvpoold's request deadline (kvpoold(8))
SLACK_S = 1.5


def fail(msg: str, log: str) -> None:
    print(f"FAIL: {msg}", file=sys.stderr)
    print("--- kvpoold log:\n" + open(log).read()[-3000:], file=sys.stderr)
    sys.exit(1)


class Slowloris:
    """Connections from src that send 'GET /metrics HTTP/1.1\\r\\n' one
    byte every `every` seconds, never finishing; until stop()."""

    REQ = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200

    def __init__(self, port: int, srcs, per_src: int, every: float = 1.0) -> None:
        self.socks = []
        for src in srcs:
            for _ in range(per_src):
                s = socket.socket()
                s.bind((src, 0))
                s.settimeout(2)
                try:
                    s.connect(("127.0.0.1", port))
                except OSError:
                    s.close()
                    continue
                s.settimeout(None)      # MSG_DONTWAIT below, not a timeout
                self.socks.append(s)
        self.every = every
        self.closed = {}                # sock -> when kvpoold closed it
        self.t0 = time.monotonic()
        self.stopped = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self) -> None:
        """A byte every `every` s; kvpoold's close seen within 0.1 s."""
        sent, next_send = 0, 0.0
        while sent < len(self.REQ) and not self.stopped.wait(0.1):
            now = time.monotonic()
            for s in self.socks:
                if s in self.closed:
                    continue
                try:
                    if s.recv(1, socket.MSG_DONTWAIT) == b"":
                        self.closed[s] = now
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed[s] = now
                    continue
                if now >= next_send:
                    try:
                        s.send(self.REQ[sent:sent + 1])
                    except OSError:
                        self.closed[s] = now
            if now >= next_send:
                sent += 1
                next_send = now + self.every

    def stop(self) -> None:
        self.stopped.set()
        self.th.join()
        for s in self.socks:
            s.close()


def scrape(port: int, src: str = "127.0.0.1") -> float:
    """One whole scrape; its seconds, or an exception."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_S + 3,
                                 source_address=(src, 0))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    s.close()
    if not data.startswith(b"HTTP/1.1 200") or b"kvpool_workers" not in data:
        raise RuntimeError(f"not a scrape: {data[:200]!r}")
    return time.monotonic() - t0


def scrapes(port: int, what: str, log: str) -> None:
    for i in range(5):
        try:
            dt = scrape(port)
        except Exception as e:      # noqa: BLE001 - reported as the failure
            fail(f"{what}: scrape {i} failed: {e}", log)
        if dt > SCRAPE_S:
            fail(f"{what}: scrape {i} took {dt:.1f} s (bound {SCRAPE_S} s)", log)
        time.sleep(0.2)


def metric(port: int, name: str) -> float:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    data = b""
    while chunk := s.recv(1 << 16):
        data += chunk
    s.close()
    m = re.search(rb"^" + re.escape(name.encode()) + rb" (\S+)$", data, re.M)
    return float(m.group(1)) if m else float("nan")


def main() -> None:
    kvpoold = sys.argv[1]
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError:
        print("SKIP: cannot bind 127.0.0.2")
        sys.exit(77)
    d = tempfile.mkdtemp(prefix="kvpool-slowloris-")
    log = os.path.join(d, "log")
    p = subprocess.Popen([kvpoold, "--foreground", "--backend=shm",
                          f"--socket={d}/s.sock", "--device_mem=4M", "--host_mem=4M",
                          "--metrics=127.0.0.1:0"],
                         stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        port = None
        for _ in range(100):
            m = re.search(r"metrics: serving http://127\.0\.0\.1:(\d+)/metrics",
                          open(log).read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.1)
        if not port:
            fail("no 'metrics: serving' line", log)
        scrape(port)

        # 1. One peer, many slow connections.
        sl = Slowloris(port, ["127.0.0.2"], 24)
        time.sleep(0.5)
        scrapes(port, "24 slow connections from one peer", log)
        sl.stop()

        # 2. Many peers, past the per-peer cap and the connection limit.
        sl = Slowloris(port, [f"127.0.0.{i}" for i in range(10, 34)], 4)
        time.sleep(0.5)
        scrapes(port, "96 slow connections from 24 peers", log)
        sl.stop()

        # 3. The deadline: one slow connection, a byte every 0.5 s (never
        # idle for the idle timeout), closed by kvpoold all the same.
        before = metric(port, "kvpool_metrics_slow_closed_total")
        sl = Slowloris(port, ["127.0.0.3"], 1, every=0.5)
        limit = time.monotonic() + DEADLINE_S + SLACK_S + 3
        while not sl.closed and time.monotonic() < limit:
            time.sleep(0.1)
        if not sl.closed:
            fail("a connection sending a byte every 0.5 s was not closed in "
                 f"{DEADLINE_S + SLACK_S + 3:.1f} s", log)
        held = min(sl.closed.values()) - sl.t0
        sl.stop()
        if held > DEADLINE_S + SLACK_S:
            fail(f"the slow connection was closed after {held:.1f} s "
                 f"(deadline {DEADLINE_S} s)", log)
        after = metric(port, "kvpool_metrics_slow_closed_total")
        if not after >= before + 1:
            fail(f"kvpool_metrics_slow_closed_total {before} -> {after} (closed after {held:.1f} s)", log)
        if p.poll() is not None:
            fail(f"kvpoold exited {p.returncode}", log)
        print(f"ok: scrapes served under slowloris; a slow request closed after {held:.1f} s")
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
