# SPDX-License-Identifier: MIT
"""One kvpoold, two pools (``devices = 0,1`` on the shm backend: two GPUs'
pools without a GPU), driven from Python (issue 31):

- ``Client.move`` moves a user's history from pool 0 to pool 1: the tokens
  read back through pool 1's view as they were appended through pool 0's,
  pool 0 keeps nothing, and moving it again from pool 0 is NotFoundError;
- ``Client.chunk_copy`` copies a chunk into pool 1: the same id, the same
  bytes through pool 1's view, pool 0 keeps it, a second copy copies
  nothing, an unknown chunk is NotFoundError and a pool the daemon does not
  serve InvalidArgumentError;
- both pools share one host tier: pages offloaded through either come out
  of the same frames (the stats' host free frames fall for both).
"""
from __future__ import annotations

import pytest
import torch

import kvpool
from conftest import Daemon

USER = 4101


@pytest.fixture(scope="module")
def pools():
    d = Daemon(extra=["--devices=0,1"], device_mem="256K", host_mem="256K")
    c0 = kvpool.connect(d.sock, "pools-0", pool=0)
    c1 = kvpool.connect(d.sock, "pools-1", pool=1)
    try:
        yield c0, c1
    finally:
        c0.close()
        c1.close()
        d.stop()


def test_move_a_history_to_the_other_pool(pools):
    c0, c1 = pools
    kv = torch.randn(20, 2, 2, 2, 16)
    with c0.prepare(USER, 0, 20) as lease:
        lease.append(kv)
        lease.commit()
    assert c0.move(USER, 0, 1) == 2
    assert c0.info(USER).len == 0
    info = c1.info(USER)
    assert (info.start, info.len) == (0, 20)
    with c1.prepare(USER, 20, 0) as back:
        k, v = back.gather(1, 20)
        assert torch.equal(k, kv[:, 1, 0]) and torch.equal(v, kv[:, 1, 1])
    with pytest.raises(kvpool.NotFoundError):
        c0.move(USER, 0, 1)
    with pytest.raises(kvpool.InvalidArgumentError, match="both pool 1"):
        c1.move(USER, 1, 1)
    c1.evict(USER)


def test_chunk_copy_to_the_other_pool(pools):
    c0, c1 = pools
    toks = list(range(700, 740))
    kv = torch.randn(40, 2, 2, 2, 16)
    reg = c0.chunk_register(toks, "system", {"copied": "yes"})
    assert reg["created"]
    with reg["lease"] as fill:
        fill.append(kv)
    with pytest.raises(kvpool.NotFoundError):
        c1.chunk_get(reg["id"])
    assert c0.chunk_copy(reg["id"], 0, 1) == 3
    info = c1.chunk_get(reg["name"])
    assert info["state"] == "ready" and info["root"] == reg["id"]
    with c1.chunk_acquire(reg["id"]) as rd:
        k, v = rd.gather(0, 40)
        assert torch.equal(k, kv[:, 0, 0]) and torch.equal(v, kv[:, 0, 1])
    with c0.chunk_acquire(reg["id"]) as rd:           # pool 0 keeps it
        assert torch.equal(rd.gather(1, 40)[0], kv[:, 1, 0])
    assert c1.chunk_copy(reg["name"], 0, 1) == 0      # there already
    with pytest.raises(kvpool.NotFoundError):
        c0.chunk_copy("ab" * 32, 0, 1)
    with pytest.raises(kvpool.InvalidArgumentError, match="does not exist"):
        c0.chunk_copy(reg["id"], 0, 3)
    for c in (c0, c1):
        c.chunk_delete(reg["name"])


def test_the_pools_share_one_host_tier(pools):
    c0, c1 = pools
    free = [c.stats()["host"]["frames_free"] for c in (c0, c1)]
    assert free[0] == free[1]
    kv = torch.randn(32, 2, 2, 2, 16)
    for c, u in ((c0, USER + 1), (c1, USER + 2)):
        with c.prepare(u, 0, 32) as lease:
            lease.append(kv)
            lease.commit()
        assert c.offload(u) == 2
    after = [c.stats()["host"]["frames_free"] for c in (c0, c1)]
    assert after[0] == after[1] == free[0] - 4
    for c, u in ((c0, USER + 1), (c1, USER + 2)):
        c.evict(u)
