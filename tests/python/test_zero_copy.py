# SPDX-License-Identifier: MIT
"""The device tier as tensors without a copy: writes through a view are what
the library and another process read; views keep the mapping alive after
close(), never a hole; new exports of a closed client raise."""
from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest
import torch

import kvpool
from conftest import run_py


def _memfd_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:" in line)


def test_layer_view_is_flashinfer_nhd_with_page_stride(client):
    L = client.layout
    t = client.layer(1)
    e = L["elem_bytes"]
    assert tuple(t.shape) == (client.device_frames, 2, 16, 2, 16)
    assert t.stride() == (L["page_bytes"] // e, L["kv_stride"] // e,
                          L["token_stride"] // e, L["head_stride"] // e, 1)
    tier = client.tier()
    assert t.data_ptr() == tier.data_ptr() + L["layer_stride"]
    assert torch.equal(tier[:, 1], t) is not None  # same memory, same values
    tier[3, 1, 0, 2, 1, 5] = 42.0
    assert t[3, 0, 2, 1, 5].item() == 42.0


def test_append_lands_where_the_views_say(client, user):
    """kvp_append (C) writes, the tensor view reads the same bytes at the
    lease's frame/slot."""
    kv = torch.randn(20, 2, 2, 2, 16)
    with client.prepare(user, 0, 20) as lease:
        lease.append(kv)
        frames, slots = lease.slots()
        for layer in range(2):
            cache = client.layer(layer)
            assert torch.equal(cache[frames, 0, slots], kv[:, layer, 0])
            assert torch.equal(cache[frames, 1, slots], kv[:, layer, 1])
        page0 = lease.page(0)
        assert torch.equal(page0[0, 0, :16], kv[:16, 0, 0])
        lease.commit()


def test_write_through_view_is_read_by_another_process(client, user, daemon):
    """append_layer writes with torch ops straight into the pool; another
    process, attached on its own, reads the committed tokens back."""
    kv = torch.arange(24 * 2 * 2 * 2 * 16, dtype=torch.float32).reshape(24, 2, 2, 2, 16)
    with client.prepare(user, 0, 24) as lease:
        for layer in range(2):
            lease.append_layer(layer, kv[:, layer, 0], kv[:, layer, 1])
        lease.commit()
    np.save(os.path.join(daemon.dir, f"kv{user}.npy"), kv.numpy())
    code = (
        "import sys, numpy as np, torch, kvpool\n"
        "user, path = int(sys.argv[1]), sys.argv[2]\n"
        "want = torch.from_numpy(np.load(path))\n"
        "with kvpool.connect() as c:\n"
        "    n = c.info(user).len\n"
        "    assert n == 24, n\n"
        "    with c.prepare(user, n, 0) as lease:\n"
        "        for layer in range(2):\n"
        "            k, v = lease.gather(layer, n)\n"
        "            assert torch.equal(k, want[:, layer, 0]) and torch.equal(v, want[:, layer, 1])\n"
        "print('ok')\n")
    script = os.path.join(daemon.dir, "reader.py")
    with open(script, "w") as f:
        f.write(code)
    r = run_py(script, str(user), os.path.join(daemon.dir, f"kv{user}.npy"), env=daemon.env())
    assert r.stdout.strip() == "ok"


def test_numpy_buffer_protocol_and_dlpack_share_memory(client):
    v = client.page_view(5)
    arr = np.asarray(v)
    assert arr.shape == (2, 2, 16, 2, 16) and arr.dtype == np.float32
    t = torch.utils.dlpack.from_dlpack(client.page_view(5))
    arr[1, 1, 15, 1, 15] = 7.5
    assert t[1, 1, 15, 1, 15].item() == 7.5
    m = memoryview(client.layer_view(0))
    assert m.ndim == 5 and m.format == "f" and not m.readonly
    assert not hasattr(v, "__cuda_array_interface__")  # host memory: not CUDA
    assert v.__dlpack_device__() == (1, 0)
    cap = v.__dlpack__(max_version=(1, 0))  # DLPack 1.x capsule, unconsumed
    del cap


def test_views_are_bounds_checked(client):
    with pytest.raises(IndexError):
        client._view(0, (client.device_frames + 1, 8192 // 4), (8192 // 4, 1))
    with pytest.raises(IndexError):
        client.page_view(client.device_frames)
    with pytest.raises(IndexError):
        client.layer_view(2)


def test_views_keep_the_mapping_alive_after_close(daemon, user):
    before = _memfd_maps()
    c = kvpool.connect(daemon.sock)
    mapped = _memfd_maps()
    assert mapped > before
    kv = torch.full((4, 2, 2, 2, 16), 3.0)
    lease = c.prepare(user, 0, 4)
    lease.append(kv)
    lease.commit()
    tensor = c.layer(0)
    arr = np.asarray(c.page_view(int(lease.indices[0])))
    view = c.tier_view()
    frame = int(lease.indices[0])
    c.close()
    # Closed: no calls, no new exports; the leases are released at once.
    with pytest.raises(kvpool.ClientClosedError):
        c.info(user)
    with pytest.raises(kvpool.ClientClosedError):
        view.__dlpack__()
    with pytest.raises(kvpool.ClientClosedError):
        memoryview(view)
    with pytest.raises(kvpool.ClientClosedError):
        c.layer(1)
    with pytest.raises(kvpool.StaleLeaseError):
        lease.append(kv)
    lease.release()  # harmless
    with kvpool.connect(daemon.sock) as other:
        assert other.info(user).leases == 0 and other.info(user).len == 4
    # ... but what was exported still reads (and writes) mapped memory.
    assert c.attached and _memfd_maps() == mapped
    assert tensor[frame, 0, 0, 0, 0].item() == 3.0 and arr[0, 0, 0, 0, 0] == 3.0
    tensor[frame, 0, 0, 0, 0] = 4.0
    del tensor, arr, view, lease
    gc.collect()
    assert not c.attached  # the last view went: unmapped, detached
    assert _memfd_maps() == before


def test_dropping_an_unclosed_client_detaches(daemon):
    before = _memfd_maps()
    c = kvpool.connect(daemon.sock)
    t = c.layer(0)
    del c
    gc.collect()
    assert _memfd_maps() > before  # the tensor holds it
    del t
    gc.collect()
    assert _memfd_maps() == before


@pytest.mark.skipif(not hasattr(torch, "from_dlpack"), reason="torch without from_dlpack")
def test_torch_from_dlpack_protocol(client):
    t = torch.from_dlpack(client.layer_view(1))
    assert t.device.type == "cpu" and t.dtype == torch.float32
