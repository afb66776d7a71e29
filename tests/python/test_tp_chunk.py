# SPDX-License-Identifier: MIT
"""Chunks in a tensor-parallel pool from Python (issue 31, item 5): kvpoold
on shm with ``devices = 0,1`` and ``tp = 2``. Rank 0 (this process)
registers a chunk, rank 1 (a forked process) joins its fill lease by
``lease.id`` with ``Client.join``; each appends its own heads; rank 0's
``seal()`` is pending (1) until rank 1's (0). Another pair of rank
processes then acquires the chunk and each reads its own rank's heads.
Rank 1 registering is refused; rank 1 killed mid-fill abandons the chunk
(not published, no frame left)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import Daemon

torch = pytest.importorskip("torch")
import kvpool  # noqa: E402
from test_tp import check_view, fork_peer, kv_of  # noqa: E402  (shared with test_tp)

N = 32


def peer(sock: str, name: str, rank: int, conn) -> None:
    """A rank process: does what the test sends, answers ("ok", value) or
    ("err", type, msg)."""
    c = kvpool.connect(sock, name, rank=rank)
    leases = {}
    while True:
        op, *a = conn.recv()
        try:
            if op == "quit":
                break
            if op == "register":
                c.chunk_register(a[0], "system")
                r = None
            elif op == "join":
                lease = c.join(a[0])
                leases[a[0]] = lease
                r = (lease.id, list(lease.indices), lease.n_new)
            elif op == "append":
                lease = leases[a[0]]
                lease.append(kv_of(rank, a[1], c.layout, lease.n_new))
                r = None
            elif op == "seal":
                r = leases.pop(a[0]).seal()
            elif op == "read":
                with c.chunk_acquire(a[0]) as lease:
                    check_view(c, lease, rank, a[1])
                    r = list(lease.indices)
            conn.send(("ok", r))
        except Exception as e:  # noqa: BLE001 - sent back to the test
            conn.send(("err", type(e).__name__, str(e)))
    c.close()


def start_peer(sock: str, name: str, rank: int):
    """Fork a rank process; (ask, stop, process)."""
    return fork_peer(peer, (sock, name, rank), name)


@pytest.fixture
def tp_daemon():
    d = Daemon(extra=["--devices=0,1", "--tp=2"], device_mem="32K", host_mem="128K")
    yield d
    d.stop()


def test_tp2_chunk_filled_by_the_group_read_by_another(tp_daemon):
    sock = tp_daemon.sock
    f1, stop_f1, _ = start_peer(sock, "f1", 1)
    r0, stop_r0, _ = start_peer(sock, "r0", 0)
    r1, stop_r1, _ = start_peer(sock, "r1", 1)
    try:
        c = kvpool.connect(sock, "rank0", rank=0)
        toks = list(range(100, 100 + N))
        reg = c.chunk_register(toks, "system")
        assert reg["created"]
        fill = reg["lease"]
        status, err, msg = f1("register", toks)
        assert (status, err) == ("err", "InvalidArgumentError")
        assert "rank 0 registers chunks; join its fill lease" in msg
        with pytest.raises(kvpool.InvalidArgumentError, match="rank 0 of a tensor-parallel"):
            c.join(fill.id)

        # Rank 1 joins by id: the same page table; each its own heads.
        assert f1("join", fill.id) == ("ok", (fill.id, list(fill.indices), N))
        assert f1("join", fill.id)[:2] == ("err", "AlreadyError")
        fill.append(kv_of(0, 0.25, c.layout, N))
        assert f1("append", fill.id, 0.25) == ("ok", None)
        assert fill.seal() == 1  # pending: rank 1 has not sealed
        assert c.chunk_entry(reg["id"])["state"] == "filling"
        assert r0("read", reg["id"], 0.25)[:2] == ("err", "NotReadyError")
        assert f1("seal", fill.id) == ("ok", 0)
        assert c.chunk_entry(reg["id"])["state"] == "ready"

        # Another group reads it: the same frames, each rank's own heads.
        ok0, idx0 = r0("read", reg["id"], 0.25)
        ok1, idx1 = r1("read", reg["id"], 0.25)
        assert (ok0, ok1) == ("ok", "ok") and idx0 == idx1, (idx0, idx1)
        c.close()
    finally:
        stop_f1()
        stop_r0()
        stop_r1()


def test_tp2_chunk_abandoned_when_a_rank_dies(tp_daemon):
    sock = tp_daemon.sock
    f1, stop_f1, child = start_peer(sock, "f1", 1)
    try:
        c = kvpool.connect(sock, "rank0", rank=0)
        reg = c.chunk_register(list(range(500, 520)), "system")
        fill = reg["lease"]
        assert f1("join", fill.id)[0] == "ok"
        fill.append(kv_of(0, 1.0, c.layout, 20))
        assert f1("append", fill.id, 1.0) == ("ok", None)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        # The daemon abandons the chunk when it sees the death.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                c.chunk_entry(reg["id"])
            except kvpool.NotFoundError:
                break
            time.sleep(0.005)
        with pytest.raises(kvpool.StaleLeaseError,
                           match="rank 1's client died.*the chunk was not published"):
            fill.seal()
        with pytest.raises(kvpool.NotFoundError):
            c.chunk_entry(reg["id"])
        fill.release()
        st = c.stats()
        assert st["device"]["frames_used"] == 0, st["device"]
        assert st["leases"] == 0, st
        c.close()
    finally:
        stop_f1()
