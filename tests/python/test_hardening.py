# SPDX-License-Identifier: MIT
"""The binding trusts nothing it is given (issue 25, items 4 and 5).

* appends read only torch tensors (within their real storage), DLPack
  capsules and buffers; an object that merely has data_ptr() and a shape is
  a TypeError, and a tensor whose storage is smaller than its shape claims
  is refused, nothing written;
* every integer argument is range-checked: 2**64 + 2 is not token 2, 2**32
  + 1 tokens is not 1 token, user 2**64 + u is not user u;
* no raw-pointer entry point is reachable from Python;
* a Client inherited across os.fork() raises in the child (nothing reaches
  the daemon), and the parent goes on as before.
"""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch

import kvpool

SHAPE = (2, 2, 2, 16)   # [layers, 2, kv_heads, head_dim] of the tests' layout


def _tier_bytes(client) -> bytes:
    return bytes(np.asarray(client.tier_view()).tobytes())


class FakeTensor:
    """What the old Lease.append took for a tensor: data_ptr() and a shape
    it was asked to believe."""

    def __init__(self, real: torch.Tensor, n: int) -> None:
        self._real = real
        self.shape = (n, *SHAPE)
        self.dtype = torch.float32
        self.device = torch.device("cpu")
        self.is_cuda = False

    def data_ptr(self) -> int:
        return self._real.data_ptr()

    def is_contiguous(self) -> bool:
        return True


def test_an_object_with_data_ptr_is_not_a_tensor(client, user):
    small = torch.full((1, *SHAPE), 7.0)
    with client.prepare(user, 0, 16) as lease:
        before = _tier_bytes(client)
        with pytest.raises(TypeError, match="torch tensor.*DLPack.*buffer"):
            lease.append(FakeTensor(small, 16))       # 16 tokens claimed, 1 there
        with pytest.raises(TypeError, match="torch tensor"):
            lease.append([[0.0] * 64] * 16)
        assert _tier_bytes(client) == before
    assert client.info(user).len == 0


def test_a_tensor_is_read_only_within_its_storage(client, user):
    kv = torch.randn(8, *SHAPE)
    kv.storage().resize_(kv[:1].numel())             # the shape still says 8 tokens
    assert kv.shape[0] == 8
    with client.prepare(user, 0, 8) as lease:
        before = _tier_bytes(client)
        with pytest.raises(ValueError, match="storage"):
            lease.append(kv)
        k = torch.randn(8, 2, 16)
        k.storage().resize_(32)                          # one token of 8
        with pytest.raises(ValueError, match="storage"):
            lease.append_layer(0, k, k)
        with pytest.raises(ValueError, match="storage"):
            lease.append_layers([k, k], [k, k])
        assert _tier_bytes(client) == before


class Liar(torch.Tensor):
    """A tensor subclass that lies about where and how big it is."""

    def data_ptr(self) -> int:
        return 8

    @property
    def shape(self) -> torch.Size:
        return torch.Size([16, *SHAPE])


def test_a_tensor_subclass_cannot_lie(client, user):
    real = torch.randn(1, *SHAPE)
    liar = real.clone().as_subclass(Liar)
    with client.prepare(user, 0, 16) as lease:
        lease.append(liar)                       # torch's own view: 1 token, its real bytes
        with pytest.raises(IndexError):
            lease.append(liar, first=16)         # 1 token past the 16 reserved
        lease.commit(1)
    with client.prepare(user, 1, 0) as lease:
        k, v = lease.gather(0, 1)
    assert torch.equal(k, real[:, 0, 0]) and torch.equal(v, real[:, 0, 1])


def test_a_tensor_that_requires_grad_is_read(client, user):
    kv = torch.randn(2, *SHAPE, requires_grad=True)
    with client.prepare(user, 0, 2) as lease:
        lease.append(kv)
        lease.commit()
    with client.prepare(user, 2, 0) as lease:
        k, _ = lease.gather(1, 2)
    assert torch.equal(k, kv.detach()[:, 1, 0])


def test_tensors_capsules_and_buffers_are_taken(client, user):
    kv = torch.randn(6, *SHAPE)
    with client.prepare(user, 0, 6) as lease:
        lease.append(kv[:2])                                        # torch
        lease.append(torch.utils.dlpack.to_dlpack(kv[2:4].clone()), first=2)  # capsule
        lease.append(kv[4:].numpy(), first=4)                       # buffer
        lease.commit()
    with client.prepare(user, 6, 0) as lease:
        k, v = lease.gather(1, 6)
    assert torch.equal(k, kv[:, 1, 0]) and torch.equal(v, kv[:, 1, 1])


def test_the_first_token_is_range_checked(client, user):
    with client.prepare(user, 0, 4) as lease:
        before = _tier_bytes(client)
        for bad in (2**64 + 2, 2**32 + 2, -1):
            with pytest.raises(OverflowError, match=r"first.*0\.\.4294967295"):
                lease.append(torch.ones(1, *SHAPE), first=bad)
            with pytest.raises(OverflowError, match="first"):
                lease.append_layer(0, torch.ones(1, 2, 16), torch.ones(1, 2, 16), first=bad)
        with pytest.raises(OverflowError, match="layer"):
            lease.append_layer(2**64, torch.ones(1, 2, 16), torch.ones(1, 2, 16))
        with pytest.raises(TypeError, match="first"):
            lease.append(torch.ones(1, *SHAPE), first=2.0)
        assert _tier_bytes(client) == before
        with pytest.raises(OverflowError, match="n"):
            lease.commit(2**64 + 1)
    assert client.info(user).len == 0


def test_integer_arguments_do_not_wrap(client, user):
    with client.prepare(user, 0, 4) as lease:
        lease.append(torch.ones(4, *SHAPE))
        with pytest.raises(OverflowError, match="n"):
            kvpool.Client.commit(client, lease.id, 2**32 + 1)   # not 1 token
        assert client.info(user).len == 0
        lease.commit()
    with pytest.raises(OverflowError, match="user"):
        client.evict(2**64 + user)                             # not user `user`
    with pytest.raises(OverflowError, match="user"):
        client.info(2**64 + user)
    with pytest.raises(OverflowError, match="n_new"):
        client.prepare(user + 1, 0, 2**32 + 4)
    with pytest.raises(OverflowError):
        client.queue_prepare(user + 1, 0, 2**32 + 4)
    assert client.info(user).len == 4 and client.info(user + 1).len == 0


def test_no_raw_pointer_entry_points(client, user):
    with client.prepare(user, 0, 1) as lease:
        for name in ("_append_ptr", "_append_layers_ptr", "_append_layer_ptr"):
            assert not hasattr(lease, name), name


def test_a_forked_child_cannot_use_the_parents_client(client, user):
    kv = torch.randn(8, *SHAPE)
    lease = client.prepare(user, 0, 8)
    lease.append(kv[:4])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report each check, never run pytest's teardown
        code = 0
        try:
            os.close(r)
            out = []
            zeros = np.zeros((4, *SHAPE), np.float32)   # no torch op in the child
            for what, call in [("info", lambda: client.info(user)),
                               ("prepare", lambda: client.prepare(user + 1, 0, 4)),
                               ("append", lambda: lease.append(zeros, first=4)),
                               ("commit", lambda: lease.commit(8)),
                               ("release", lambda: lease.release()),
                               ("tier", lambda: client.tier())]:
                try:
                    call()
                    out.append(f"{what}: no error")
                except kvpool.KvpoolError as e:
                    if e.errno != errno.ECHILD or "fork()" not in str(e) \
                            or "kvpool.connect()" not in str(e):
                        out.append(f"{what}: {e.errno} {e}")
            with kvpool.connect(client_sock(), "child") as own:   # its own works
                own.info(user)
            client.close()                                       # harmless
            os.write(w, "\n".join(out).encode())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(w, f"child raised {e!r}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and report == "", report
    # the parent goes on: its lease is intact and writable
    lease.append(kv[4:], first=4)
    assert lease.commit() >= 0
    lease.release()
    with client.prepare(user, 8, 0) as l2:
        k, v = l2.gather(0, 8)
    assert torch.equal(k, kv[:, 0, 0]) and torch.equal(v, kv[:, 0, 1])


def client_sock() -> str:
    return os.environ["KVPOOL_SOCKET"]


def test_hstu_appends_go_through_the_library(daemon, user):
    """kvpool.hstu's append_kvcache writes through each user's lease
    (kvp_append_layer_async): with the lease gone from the library it
    raises StaleLeaseError and the pool's bytes stay as they were."""
    import kvpool.hstu
    u = 900000 + user
    with kvpool.hstu.KVCacheManager(socket=daemon.sock) as mgr:
        mgr.prepare_kv_cache([u], [0], [10])
        meta = mgr.get_cache_metadata([u])
        k = torch.randn(10, 2, 16)
        mgr.append_kvcache(0, k, -k, meta)                   # a good lease: fine
        lease = mgr._leases[u]
        kvpool.Client.release(mgr.client, lease.id)          # the library forgets it
        before = mgr.client.tier().clone()
        with pytest.raises(kvpool.StaleLeaseError):
            mgr.append_kvcache(1, k, -k, meta)
        assert torch.equal(mgr.client.tier(), before)
        mgr._leases.pop(u)


def test_check_write_asks_the_library(client, user):
    """Lease._check_write (for writers that cannot go through the library,
    such as a CUDA graph replaying captured slots) runs the library's lease
    checks: a lease the library no longer holds fails it."""
    lease = client.prepare(user, 0, 4)
    lease._check_write(0, 4)
    with pytest.raises(IndexError):
        lease._check_write(2, 3)
    kvpool.Client.release(client, lease.id)
    with pytest.raises(kvpool.StaleLeaseError):
        lease._check_write(0, 1)
