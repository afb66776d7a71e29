# SPDX-License-Identifier: MIT
"""The binding's CUDA paths on a GPU (ctest label gpu), against a kvpoold
--backend=cuda of the test's own: the tier as a torch tensor through DLPack
(kDLCUDA, no copy), cupy through __cuda_array_interface__ when cupy is
there, appends from CUDA tensors (all layers on a side stream, per layer,
one layer through torch) read back bit for bit, the stale-lease refusal on
the GPU path, and a second process reading what the first wrote.

Skips, saying why, where torch has no CUDA device or no kvpoold is found
(CI has no GPU). As a script (how ctest runs it) a skip is exit status 77."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

torch = pytest.importorskip("torch")

SRC = Path(os.environ.get("KVPOOL_SOURCE_DIR", Path(__file__).resolve().parents[2]))
LAYOUT = "layers=3,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"


def _kvpoold() -> Optional[str]:
    for p in [os.environ.get("KVPOOLD")] + sorted(glob.glob(str(SRC / "build*" / "kvpoold"))):
        if p and os.access(p, os.X_OK):
            return p
    return None


def _why_skip() -> Optional[str]:
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not _kvpoold():
        return "no kvpoold (build it, or set KVPOOLD)"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")


@pytest.fixture(scope="module")
def sock() -> Iterator[str]:
    import kvpool
    d = tempfile.mkdtemp(prefix="kvpool-cuda-")
    s = os.path.join(d, "kvpoold.sock")
    log = open(os.path.join(d, "kvpoold.log"), "w")
    p = subprocess.Popen([_kvpoold(), f"--socket={s}", "--backend=cuda", "--foreground",
                          f"--layout={LAYOUT}", "--device_mem=64M", "--host_mem=16M"],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        assert p.poll() is None, open(log.name).read()[-2000:]
        if os.path.exists(s):
            try:
                kvpool.connect(s, "ready").close()
                break
            except kvpool.KvpoolError:
                pass
        assert time.monotonic() < deadline, open(log.name).read()[-2000:]
        time.sleep(0.05)
    yield s
    p.terminate()
    assert p.wait(timeout=20) == 0, open(log.name).read()[-2000:]


def _kv(n: int, seed: int) -> "torch.Tensor":
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn((n, 3, 2, 2, 64), generator=g, device="cuda").to(torch.bfloat16)


def test_tier_is_a_cuda_tensor_without_a_copy(sock: str) -> None:
    import kvpool
    with kvpool.connect(sock, "tier") as c:
        assert c.cuda_device >= 0 and c.device.type == "cuda"
        t = c.tier()
        assert t.device.type == "cuda" and t.dtype == torch.bfloat16
        v = c.page_view(3)
        assert v.__dlpack_device__()[0] == 2          # kDLCUDA
        a = torch.from_dlpack(c.page_view(3))
        b = torch.from_dlpack(c.page_view(3))
        assert a.data_ptr() == b.data_ptr()          # the same pool memory, twice
        a.fill_(0)
        a[0, 1, 5, 1, 7] = 3.0
        torch.cuda.synchronize()
        assert b[0, 1, 5, 1, 7].item() == 3.0
        cai = v.__cuda_array_interface__
        assert cai["data"][0] == a.data_ptr() and tuple(cai["shape"]) == tuple(a.shape)
        try:
            import cupy
        except ImportError:
            return
        cp = cupy.asarray(c.page_view(3))
        assert cp.shape == tuple(a.shape) and cp.data.ptr == a.data_ptr()


def test_append_from_cuda_tensors_lands_bit_for_bit(sock: str) -> None:
    import kvpool
    kv = _kv(40, 1)
    with kvpool.connect(sock, "writer") as c:
        side = torch.cuda.Stream()
        with c.prepare(11, 0, 40) as lease:
            with torch.cuda.stream(side):             # kvp_append_async on that stream
                lease.append(kv[:16], 0)
            lease.append_layers([kv[16:30, l, 0].contiguous() for l in range(3)],
                                [kv[16:30, l, 1].contiguous() for l in range(3)], 16)
            for l in range(3):                        # the HSTU path: torch indexing
                lease.append_layer(l, kv[30:, l, 0], kv[30:, l, 1], 30)
            lease.commit()
            with pytest.raises(kvpool.StaleLeaseError):
                lease.append(kv[:1], 0)               # committed: no more writes
        with c.prepare(11, 40, 0) as rd:
            for l in range(3):
                k, v = rd.gather(l, 40)
                assert torch.equal(k, kv[:, l, 0]) and torch.equal(v, kv[:, l, 1])


def test_a_second_process_reads_what_the_first_wrote(sock: str) -> None:
    import kvpool
    kv = _kv(24, 2)
    with kvpool.connect(sock, "first") as c, c.prepare(12, 0, 24) as lease:
        lease.append(kv, 0)
        lease.commit()
    path = os.path.join(tempfile.mkdtemp(prefix="kvpool-cuda-"), "kv.pt")
    torch.save(kv.cpu(), path)
    code = ("import sys, torch, kvpool\n"
            "want = torch.load(sys.argv[2]).cuda()\n"
            "with kvpool.connect(sys.argv[1], 'second') as c, c.prepare(12, 24, 0) as rd:\n"
            "    for l in range(3):\n"
            "        k, v = rd.gather(l, 24)\n"
            "        assert torch.equal(k, want[:, l, 0]) and torch.equal(v, want[:, l, 1])\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code, sock, path], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_hstu_manager_on_the_cuda_pool(sock: str) -> None:
    """The HSTU cache manager on a GPU pool: metadata int32 on the model's
    device, per-layer appends of a batch, commit, and the cached K/V read
    back through its page tables; a second prepare continues the histories."""
    import kvpool
    from kvpool.hstu import KVCacheManager
    users, news = [21, 22, 23], [5, 17, 33]
    kv = {u: _kv(n, 100 + u) for u, n in zip(users, news)}
    with kvpool.connect(sock, "hstu") as c, KVCacheManager(c) as m:
        assert m.get_batch_kvdata_info(users)[1].tolist() == [0, 0, 0]
        m.prepare_kv_cache(users, [0, 0, 0], news)
        md = m.get_cache_metadata(users)
        for t in (md.kv_indices, md.kv_indptr, md.kv_last_page_len,
                  md.total_history_lengths, md.total_history_offsets):
            assert t.device.type == "cuda" and t.dtype == torch.int32
        assert md.new_history_nnz == sum(news)
        for layer in range(3):
            k = torch.cat([kv[u][:, layer, 0] for u in users])
            v = torch.cat([kv[u][:, layer, 1] for u in users])
            m.append_kvcache(layer, k, v, md)
        m.commit_kv_cache(users)
        assert [m.get_user_kvdata_info(u) for u in users] == [(0, n) for n in news]
        # Read back through page tables, as an attention kernel would.
        P = m.page_size
        for u, n in zip(users, news):
            with c.prepare(u, n, 0) as rd:
                table = rd.kv_indices(device="cuda").to(torch.int64)
                pos = torch.arange(n, device="cuda")
                for layer in range(3):
                    cache = m.get_kvcache_table(layer)
                    got_k = cache[table[pos // P], 0, pos % P]
                    got_v = cache[table[pos // P], 1, pos % P]
                    assert torch.equal(got_k, kv[u][:, layer, 0])
                    assert torch.equal(got_v, kv[u][:, layer, 1])
        # The next step continues every history from where it ended.
        m.prepare_kv_cache(users, news, [1, 1, 1])
        md2 = m.get_cache_metadata(users)
        assert md2.total_history_lengths.tolist() == [n + 1 for n in news]
        m.commit_kv_cache(users)


if __name__ == "__main__":
    why = _why_skip()
    if why:
        print(f"test_cuda_gpu: skipped: {why}")
        sys.exit(77)
    sys.exit(pytest.main([__file__, "-q"]))
