# SPDX-License-Identifier: MIT
"""A tensor-parallel pool from Python (issue 31): kvpoold on shm with
``devices = 0,1`` and ``tp = 2``, rank 0 in this process and rank 1 in a
forked one. Each rank's Client has the rank layout (kv_heads / 2) and its
own tier as torch tensors; rank 0 prepares, rank 1 joins by ``lease.id``,
each appends its own heads, the commits are pending until the last rank's;
after an offload, an eviction of the device copy and another user's garbage
in the freed frames, each rank reads its own heads back through the onloaded
page table. A release by rank 1 ends the group: rank 0's commit raises
StaleLeaseError naming rank 1."""
from __future__ import annotations

import multiprocessing as mp

import pytest

from conftest import Daemon

torch = pytest.importorskip("torch")
import kvpool  # noqa: E402

USER, OTHER = 7, 8
N = 32


def kv_of(rank: int, salt: float, layout: dict, n: int) -> "torch.Tensor":
    """Rank rank's K/V of n tokens: [n, layers, 2, kv_heads, head_dim]."""
    shape = (n, layout["layers"], 2, layout["kv_heads"], layout["head_dim"])
    return (torch.arange(torch.Size(shape).numel(), dtype=torch.float32)
            .reshape(shape) + 1000.0 * rank + salt)


def check_view(c: "kvpool.Client", lease: "kvpool.Lease", rank: int,
               salt: float = 0.5) -> None:
    """Rank rank's heads of the lease's committed tokens, through the layer
    views of this rank's own tier."""
    want = kv_of(rank, salt, c.layout, lease.len)
    for layer in range(c.layout["layers"]):
        k, v = lease.gather(layer, lease.len)
        assert k.shape == (lease.len, 1, c.layout["head_dim"])  # kv_heads / tp
        assert torch.equal(k, want[:, layer, 0]), f"rank {rank} layer {layer} K"
        assert torch.equal(v, want[:, layer, 1]), f"rank {rank} layer {layer} V"


def rank1(sock: str, conn, pool: int = 0) -> None:
    """Rank 1: does what rank 0 sends, answers ("ok", value) or ("err", type, msg)."""
    c = kvpool.connect(sock, "rank1", rank=1, pool=pool)
    leases = {}
    while True:
        op, *a = conn.recv()
        try:
            if op == "quit":
                break
            if op == "attach":
                r = (c.tp, c.rank, c.layout["kv_heads"], tuple(c.layer(0).shape))
            elif op == "join":
                lease = c.join(a[0])
                leases[a[0]] = lease
                r = (lease.id, list(lease.indices), lease.len, lease.n_new, lease.user)
            elif op == "prepare":
                c.prepare(USER, 0, N)
                r = None
            elif op == "append":
                lease = leases[a[0]]
                lease.append(kv_of(1, a[1], c.layout, lease.n_new))
                r = None
            elif op == "commit":
                r = leases[a[0]].commit()
            elif op == "release":
                leases.pop(a[0]).release()
                r = None
            elif op == "check":
                check_view(c, leases[a[0]], 1, *a[1:])
                r = None
            conn.send(("ok", r))
        except Exception as e:  # noqa: BLE001 - sent back to the test
            conn.send(("err", type(e).__name__, str(e)))
    c.close()


@pytest.fixture
def tp_daemon():
    d = Daemon(extra=["--devices=0,1", "--tp=2"], device_mem="32K", host_mem="128K")
    yield d
    d.stop()


@pytest.fixture
def rank1_proc(tp_daemon):
    """Rank 1 in a forked process on tp_daemon: ask(op, ...) -> its answer."""
    ask, stop = start_rank1(tp_daemon.sock)
    yield ask
    stop()


def fork_peer(target, args: tuple, name: str):
    """Fork a rank process running target(*args, conn); (ask, stop, process):
    ask(*msg) sends a request and waits up to 20 s for its answer, stop()
    asks it to quit, then kills it if it has not."""
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=target, args=(*args, there), daemon=True)
    child.start()

    def ask(*msg):
        here.send(msg)
        assert here.poll(20), f"{name} did not answer {msg}"
        return here.recv()

    def stop():
        if child.is_alive():
            here.send(("quit",))
            child.join(10)
        if child.is_alive():
            child.kill()

    return ask, stop, child


def start_rank1(sock: str, pool: int = 0):
    """Fork rank 1 (of pool) on sock; (ask, stop)."""
    ask, stop, _ = fork_peer(lambda s, c: rank1(s, c, pool), (sock,), "rank 1")
    return ask, stop


def test_tp2_demotion_keeps_each_ranks_heads():
    """Six users of two pages each through a device tier of four frames,
    the reclaimer on: demotions (the striped pipelined copies) and onloads
    keep each rank's heads of every user in its own pool."""
    d = Daemon(extra=["--devices=0,1", "--tp=2", "--reclaim=yes"], device_mem="32K",
               host_mem="256K")
    ask, stop = start_rank1(d.sock)
    try:
        c = kvpool.connect(d.sock, "rank0", rank=0)
        users = range(100, 106)
        for u in users:
            lease = c.prepare(u, 0, N)
            assert ask("join", lease.id)[0] == "ok"
            lease.append(kv_of(0, float(u), c.layout, N))
            assert ask("append", lease.id, float(u)) == ("ok", None)
            lease.commit()
            assert ask("commit", lease.id)[0] == "ok"
            lease.release()
            assert ask("release", lease.id) == ("ok", None)
        for u in reversed(users):
            r = c.prepare(u, N, 0)
            assert ask("join", r.id)[0] == "ok"
            check_view(c, r, 0, float(u))
            assert ask("check", r.id, float(u)) == ("ok", None)
            assert ask("release", r.id) == ("ok", None)
            r.release()
        st = c.stats()
        assert st["device"]["frames_total"] == 4
        # The pages went down by demotion (the reclaimer or a prepare), and
        # came back by onloads: both through the striped copies.
        assert st["demoted_pages"] > 0 and st["onloaded_pages"] > 0, st
        c.close()
    finally:
        stop()
        d.stop()


def test_tp2_history_moves_to_another_tp_pool():
    """kvctl move between two tensor-parallel pools (devices 0,1,2,3, tp 2):
    each rank's heads land in the same rank of the other pool (the striped
    copy_peer, rank r to rank r), at the frames of one new page table, and
    the first pool keeps nothing."""
    import subprocess
    from conftest import _find
    d = Daemon(extra=["--devices=0,1,2,3", "--tp=2"], device_mem="64K", host_mem="256K")
    ask0, stop0 = start_rank1(d.sock, pool=0)
    ask1, stop1 = start_rank1(d.sock, pool=1)
    try:
        c0 = kvpool.connect(d.sock, "rank0-pool0", rank=0, pool=0)
        c1 = kvpool.connect(d.sock, "rank0-pool1", rank=0, pool=1)
        lease = c0.prepare(USER, 0, N)
        assert ask0("join", lease.id)[0] == "ok"
        lease.append(kv_of(0, 0.5, c0.layout, N))
        assert ask0("append", lease.id, 0.5) == ("ok", None)
        assert lease.commit() == 1                     # pending: rank 1's is the last
        assert ask0("commit", lease.id) == ("ok", 0)
        lease.release()
        assert ask0("release", lease.id) == ("ok", None)
        r = subprocess.run([_find("kvctl"), "--socket", d.sock, "move", "--user", str(USER),
                            "--from", "0", "--to", "1"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        assert c0.info(USER).len == 0
        info = c1.info(USER)
        assert info.len == N
        back = c1.prepare(USER, info.start + info.len, 0)
        assert ask1("join", back.id)[0] == "ok"
        check_view(c1, back, 0)
        assert ask1("check", back.id) == ("ok", None)
        assert ask1("release", back.id) == ("ok", None)
        back.release()
        c0.close()
        c1.close()
    finally:
        stop0()
        stop1()
        d.stop()


def test_tp2_group_lease(tp_daemon, rank1_proc):
    ask = rank1_proc
    c = kvpool.connect(tp_daemon.sock, "rank0", rank=0)
    # The attach: each rank's layout holds kv_heads / tp heads.
    assert (c.tp, c.rank, c.layout["kv_heads"]) == (2, 0, 1)
    assert c.layer(0).shape == (4, 2, 16, 1, 16)
    assert ask("attach") == ("ok", (2, 1, 1, (4, 2, 16, 1, 16)))
    with pytest.raises(kvpool.InvalidArgumentError, match="ranks 0 to 1"):
        kvpool.connect(tp_daemon.sock, "rank2", rank=2)

    # Rank 0 prepares, rank 1 joins by id: one page table.
    lease = c.prepare(USER, 0, N)
    ok, (lid, idx, ln, n_new, user) = ask("join", lease.id)
    assert (lid, idx, ln, n_new, user) == (lease.id, list(lease.indices), 0, N, USER)
    status, err, msg = ask("prepare")
    assert (status, err) == ("err", "InvalidArgumentError")
    assert "rank 0 prepares; join its lease with kvp_lease_join" in msg
    with pytest.raises(kvpool.InvalidArgumentError, match="rank 0 of a tensor-parallel"):
        c.join(lease.id)
    assert ask("join", lease.id)[:2] == ("err", "AlreadyError")

    # Each rank its own heads; the commit waits for the last rank.
    lease.append(kv_of(0, 0.5, c.layout, N))
    assert ask("append", lease.id, 0.5) == ("ok", None)
    assert lease.commit() == 1  # pending
    assert c.info(USER).len == 0
    assert ask("commit", lease.id) == ("ok", 0)
    assert c.info(USER).len == N
    lease.release()
    assert ask("release", lease.id) == ("ok", None)

    # Offload, drop the device copy, garbage into the frames, onload.
    assert c.offload(USER) == 2
    assert c.evict(USER, kvpool.SEL_DEVICE) == 2
    g = c.prepare(OTHER, 0, 4 * 16)
    assert ask("join", g.id)[0] == "ok"
    g.append(kv_of(0, -7.0, c.layout, 64))
    assert ask("append", g.id, -7.0) == ("ok", None)
    assert g.commit() == 1 and ask("commit", g.id) == ("ok", 0)
    g.release()
    assert ask("release", g.id) == ("ok", None)
    r = c.prepare(USER, N, 0)
    assert r.onloaded_pages == 2
    assert ask("join", r.id)[0] == "ok"
    check_view(c, r, 0)
    assert ask("check", r.id) == ("ok", None)
    assert ask("release", r.id) == ("ok", None)
    r.release()

    # A release by rank 1 before the group committed ends it for both.
    w = c.prepare(USER, N, 16)
    assert ask("join", w.id)[0] == "ok"
    assert ask("release", w.id) == ("ok", None)
    with pytest.raises(kvpool.StaleLeaseError, match="rank 1's client released it"):
        w.commit()
    assert c.info(USER).len == N
    c.close()
