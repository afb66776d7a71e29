# SPDX-License-Identifier: MIT
"""kvpoold against a hostile Redis Cluster store node (issue 25, item 2).

The node is a fake one on 127.0.0.1, a thread of this test speaking just
enough RESP: CLUSTER SLOTS gives it every slot, and every GET gets the
attack: a value of a valid length whose bytes trickle in (one each
100 ms), "$65536" then a trickle (longer than any value of the layout),
a 4 GiB bulk then 1.5 GiB streamed, or an array of 2147483647 elements
then 100k of them. kvpoold runs with remote_timeout_ms=300; a prepare of
a prompt nobody cached asks the store for its pages. Each must:
 - return within the timeout and some slack, the pages misses;
 - leave kvpoold's peak RSS less than 100 MB above where it was;
 - have the node counted (kvpool_remote_node_timeouts_total or
   kvpool_remote_node_bad_replies_total), marked down and named in a
   warning of the log;
 - and the daemon goes on serving: the next prepare does not wait on it.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

import kvpool
from remote_fixtures import metrics
from conftest import Daemon

TIMEOUT_MS = 300
SLACK_S = 1.2        # a loaded 2-core CI machine
PAGE_TOKENS = 16     # conftest's LAYOUT


class HostileNode:
    """A fake store node owning every slot; each GET gets `attack`."""

    def __init__(self, attack: str) -> None:
        self.attack = attack
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.port = self.lsock.getsockname()[1]
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._serve, daemon=True)
        self.th.start()

    def close(self) -> None:
        self.stop.set()
        self.lsock.close()

    def _serve(self) -> None:
        self.lsock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                continue
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        try:
            while not self.stop.is_set():
                data = conn.recv(1 << 16)
                if not data:
                    return
                if b"SLOTS" in data:
                    host = b"127.0.0.1"
                    conn.sendall(b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$%d\r\n%s\r\n:%d\r\n"
                                 % (len(host), host, self.port))
                elif b"GET" in data:
                    self._attack(conn)
                    return
                else:
                    conn.sendall(b"+OK\r\n" * data.count(b"\r\n*"))
        except OSError:
            pass  # the daemon closed it: what it should do
        finally:
            conn.close()

    def _trickle(self, conn: socket.socket) -> None:
        for _ in range(100):    # 10 s at most: far past the timeout
            if self.stop.is_set():
                return
            conn.sendall(b"x")
            time.sleep(0.1)

    def _attack(self, conn: socket.socket) -> None:
        if self.attack == "trickle":
            conn.sendall(b"$100\r\n")
            self._trickle(conn)
        elif self.attack == "trickle64k":
            conn.sendall(b"$65536\r\n")
            self._trickle(conn)
        elif self.attack == "bulk4g":
            conn.sendall(b"$4294967296\r\n")
            junk = b"x" * (1 << 16)
            for _ in range(24576):      # 1.5 GiB
                conn.sendall(junk)
        elif self.attack == "array2g":
            conn.sendall(b"*2147483647\r\n")
            for _ in range(100):
                conn.sendall(b":1\r\n" * 1000)


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def prepare_seconds(c, seq: int, base: int) -> float:
    """A prepare of 4 full pages nobody cached (the store is asked for
    them), then the pages written and committed; its seconds."""
    toks = [base + i for i in range(4 * PAGE_TOKENS)]
    t0 = time.monotonic()
    with c.seq_alloc(seq, toks) as lease:
        dt = time.monotonic() - t0
        assert lease.len == 0, "pages came back from a hostile node"
        lease.append(torch.randn(lease.n_new, 2, 2, 2, 16))
        lease.commit()
    c.seq_free(seq)
    return dt


# attack -> the counter it must move
ATTACKS = {
    "trickle": "timeouts",
    "trickle64k": "bad_replies",   # 65536 > the layout's largest value
    "bulk4g": "bad_replies",
    "array2g": "bad_replies",
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_hostile_store_node_holds_nothing(attack):
    node = HostileNode(attack)
    d = None
    try:
        try:
            d = Daemon(extra=[f"--remote=redis-cluster://127.0.0.1:{node.port}",
                              f"--remote_timeout_ms={TIMEOUT_MS}",
                              "--metrics=127.0.0.1:0"])
        except RuntimeError as e:
            if "hiredis" in str(e):
                pytest.skip(f"kvpoold has no remote tier: {e}")
            raise
        rss0 = peak_rss(d.proc.pid)
        with kvpool.connect(d.sock, "hostile") as c:
            dt = prepare_seconds(c, 1, 1000)
            assert dt < TIMEOUT_MS / 1000 + SLACK_S, \
                f"{attack}: the prepare waited {dt:.1f} s on the node (timeout {TIMEOUT_MS} ms)"
            grew = peak_rss(d.proc.pid) - rss0
            assert grew < 100 << 20, f"{attack}: kvpoold grew by {grew >> 20} MB"
            m = metrics(d)
            node_label = f'{{node="127.0.0.1:{node.port}"}}'
            assert m["kvpool_remote_node_up" + node_label] == 0
            want = ATTACKS[attack]
            assert m[f"kvpool_remote_node_{want}_total" + node_label] == 1, m
            other = "bad_replies" if want == "timeouts" else "timeouts"
            assert m[f"kvpool_remote_node_{other}_total" + node_label] == 0
            # The log says which node and why.
            said = "did not answer a batch whole" if want == "timeouts" else "sent a reply past the limits"
            deadline = time.monotonic() + 5
            while f"store node 127.0.0.1:{node.port} {said}" not in open(d.log).read():
                assert time.monotonic() < deadline, \
                    f"{attack}: no warning in the log: {open(d.log).read()[-1500:]}"
                time.sleep(0.05)
            # It goes on serving: the node is down, not waited on.
            dt = prepare_seconds(c, 2, 5000)
            assert dt < 0.25, f"{attack}: the next prepare waited {dt:.2f} s"
        assert d.proc.poll() is None
    finally:
        node.close()
        if d:
            d.stop()
