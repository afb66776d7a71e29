# SPDX-License-Identifier: MIT
"""Sequences in a tensor-parallel pool from Python (issue 31): kvpoold on shm
with ``devices = 0,1`` and ``tp = 2``. Rank 0 (this process) allocates and
extends a sequence, rank 1 (a forked process) joins each write lease by
``lease.id`` with ``Client.join(id, seq=...)``; each appends its own heads;
rank 0's ``commit()`` is pending (1) until rank 1's (0). Both read the same
frames back (seq_info, prefix_lookup), each its own heads. Rank 1's
seq_alloc / seq_extend are refused; rank 1 killed mid-write drops the new
tokens (the sequence as before, no frame or lease left)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import Daemon

torch = pytest.importorskip("torch")
import kvpool  # noqa: E402
from test_tp import fork_peer  # noqa: E402  (shared with test_tp)

SEQ = 41
PROMPT = list(range(300, 320))   # 20 tokens: one full page and a partial


def kv_of(rank: int, layout: dict, first: int, n: int) -> "torch.Tensor":
    """Rank rank's K/V of tokens [first, first + n):
    [n, layers, 2, kv_heads, head_dim]."""
    shape = (first + n, layout["layers"], 2, layout["kv_heads"], layout["head_dim"])
    return (torch.arange(torch.Size(shape).numel(), dtype=torch.float32)
            .reshape(shape) + 1000.0 * rank)[first:]


def check_frames(c: "kvpool.Client", frames: list, rank: int, n: int) -> None:
    """Rank rank's heads of tokens [0, n) through frames, in its own pool."""
    P = c.layout["page_tokens"]
    want = kv_of(rank, c.layout, 0, n)
    for i in range(n):
        page = c.page(frames[i // P])       # [layers, 2, P, kv_heads, head_dim]
        assert torch.equal(page[:, :, i % P], want[i]), f"rank {rank} token {i}"


def peer(sock: str, conn) -> None:
    """Rank 1: does what the test sends, answers ("ok", value) or
    ("err", type, msg)."""
    c = kvpool.connect(sock, "s1", rank=1)
    lease = None
    while True:
        op, *a = conn.recv()
        try:
            if op == "quit":
                break
            if op == "alloc":
                c.seq_alloc(SEQ + 1, PROMPT)
                r = None
            elif op == "extend":
                c.seq_extend(SEQ, 2)
                r = None
            elif op == "join":
                lease = c.join(a[0], seq=SEQ)
                r = (lease.kind, lease.seq, lease.len, list(lease.indices))
            elif op == "append":
                lease.append(kv_of(1, c.layout, lease.len, lease.n_new))
                r = None
            elif op == "commit":
                r = lease.commit()
            elif op == "release":
                lease.release()
                r = None
            elif op == "read":
                info = c.seq_info(SEQ)
                frames = list(info["pages"])
                check_frames(c, frames, 1, info["computed"])
                r = (info["computed"], frames)
            elif op == "lookup":
                r = list(c.prefix_lookup(PROMPT)["indices"])
            conn.send(("ok", r))
        except Exception as e:  # noqa: BLE001 - sent back to the test
            conn.send(("err", type(e).__name__, str(e)))
    c.close()


def start_peer(sock: str):
    """Fork rank 1; (ask, stop, process)."""
    return fork_peer(peer, (sock,), "s1")


def write_lease(c) -> int:
    """The sequence's write lease; seq_info raises RuntimeError when the
    sequence changed between its two reads (the daemon rolling the write
    back as we look): asked again."""
    for _ in range(100):
        try:
            return c.seq_info(SEQ)["write_lease"]
        except RuntimeError:
            time.sleep(0.005)
    raise AssertionError("seq_info kept changing")


@pytest.fixture
def tp_daemon():
    d = Daemon(extra=["--devices=0,1", "--tp=2"], device_mem="32K", host_mem="128K")
    yield d
    d.stop()


def group_write(c, s1, lease) -> None:
    """Both ranks write lease's new tokens; rank 0 commits first."""
    before = c.seq_info(SEQ)["computed"]
    assert s1("join", lease.id) == ("ok", ("seq", SEQ, lease.len, list(lease.indices)))
    lease.append(kv_of(0, c.layout, lease.len, lease.n_new))
    assert s1("append") == ("ok", None)
    assert lease.commit() == 1                   # pending: rank 1 has not
    assert c.seq_info(SEQ)["computed"] == before
    assert s1("commit") == ("ok", 0)
    assert c.seq_info(SEQ)["computed"] == lease.len + lease.n_new


def test_tp2_sequence_written_by_the_group(tp_daemon):
    s1, stop, _ = start_peer(tp_daemon.sock)
    try:
        c = kvpool.connect(tp_daemon.sock, "rank0", rank=0)
        status, err, msg = s1("alloc")
        assert (status, err) == ("err", "InvalidArgumentError")
        assert "rank 0 allocates, creates and extends sequences; join its " \
               "write lease" in msg
        lease = c.seq_alloc(SEQ, PROMPT)
        with pytest.raises(kvpool.InvalidArgumentError, match="rank 0 of a tensor-parallel"):
            c.join(lease.id)
        group_write(c, s1, lease)
        status, err, msg = s1("extend")
        assert (status, err) == ("err", "InvalidArgumentError")
        ext = c.seq_extend(SEQ, 6)
        group_write(c, s1, ext)

        # The same frames for both ranks, each its own heads in them.
        info = c.seq_info(SEQ)
        assert info["computed"] == 26
        frames = list(info["pages"])
        check_frames(c, frames, 0, 26)
        assert s1("read") == ("ok", (26, frames))
        assert s1("lookup") == ("ok", list(c.prefix_lookup(PROMPT)["indices"]))
        assert s1("release") == ("ok", None)
        ext.release()
        c.seq_free(SEQ)
        c.close()
    finally:
        stop()


def test_tp2_sequence_write_dropped_when_a_rank_dies(tp_daemon):
    s1, stop, child = start_peer(tp_daemon.sock)
    try:
        c = kvpool.connect(tp_daemon.sock, "rank0", rank=0)
        lease = c.seq_alloc(SEQ, PROMPT)
        group_write(c, s1, lease)
        used = c.stats()["device"]["frames_used"]
        ext = c.seq_extend(SEQ, 16)                  # a page more
        assert s1("join", ext.id)[0] == "ok"
        ext.append(kv_of(0, c.layout, ext.len, ext.n_new))
        assert s1("append") == ("ok", None)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and write_lease(c):
            time.sleep(0.005)
        with pytest.raises(kvpool.StaleLeaseError,
                           match="rank 1's client died.*the sequence kept only"):
            ext.commit()
        ext.release()
        info = c.seq_info(SEQ)
        assert (info["tokens"], info["computed"], info["write_lease"]) == (20, 20, 0)
        check_frames(c, list(info["pages"]), 0, 20)
        st = c.stats()
        assert st["device"]["frames_used"] == used, st["device"]
        assert st["leases"] == 0, st
        c.seq_free(SEQ)
        st = c.stats()
        assert st["device"]["frames_used"] == st["prefix_idle_pages"], st
        c.close()
    finally:
        stop()
