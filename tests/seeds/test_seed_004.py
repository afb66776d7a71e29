# SPDX-License-Identifier: MIT
"""Seed 004 (shared/seeds/004_*.txt): a KV cache manager with prefix
caching, run as its Go code is used, with kvpool.kvcache as the package and
kvpoold as the block pool. The seed has no example of its own; its API is
driven the way its inference engine drives it: AllocateRequest, K/V of the
uncached tokens written through GetBlockForWrite, CommitTokens, then per
generated token AppendToken, write, CommitTokens(1); GetComputedBlocks and
GetRequest / NumComputedTokens read it back, FreeRequest ends it, Stats and
Usage report. Only the model and the tokenizer are swapped, for the CPU
stand-ins (kvpool.tiny's TinyDecoder, a byte tokenizer); the greedy tokens
must be the model's recomputed from scratch, so every cached K/V block read
back is checked by the model itself.

Each test starts its own kvpoold (the file is independent of the other
seeds' tests). Run by ctest as test_seed_004.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List

import pytest
import torch

import kvpool
from kvpool import errors
from kvpool.kvcache import KVCacheManager, ManagerConfig, NewKVCacheManager
from kvpool.tiny import LAYOUT, ByteTokenizer, TinyDecoder

SRC = Path(os.environ.get("KVPOOL_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def _kvpoold() -> str:
    if os.environ.get("KVPOOLD"):
        return os.environ["KVPOOLD"]
    for p in sorted(glob.glob(str(SRC / "build*" / "kvpoold"))):
        if os.access(p, os.X_OK):
            return p
    pytest.skip("no kvpoold: build it or set $KVPOOLD")


def _pdeathsig() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Kvpoold:
    def __init__(self, *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvpool-seed004-")
        self.sock = os.path.join(self.dir, "kvpoold.sock")
        self.log = os.path.join(self.dir, "kvpoold.log")
        self.proc = subprocess.Popen(
            [_kvpoold(), f"--socket={self.sock}", "--backend=shm", "--foreground",
             f"--layout={LAYOUT}", "--device_mem=4M", "--host_mem=0", *extra],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig)
        deadline = time.monotonic() + 10
        while True:
            assert self.proc.poll() is None, open(self.log).read()
            try:
                kvpool.connect(self.sock, "ready").close()
                return
            except kvpool.KvpoolError:
                assert time.monotonic() < deadline, open(self.log).read()
                time.sleep(0.02)

    def log_text(self) -> str:
        return open(self.log).read()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture
def kvpoold_004() -> Iterator[_Kvpoold]:
    d = _Kvpoold("--log_level=debug")
    yield d
    d.stop()


@pytest.fixture
def model() -> TinyDecoder:
    return TinyDecoder(vocab=ByteTokenizer.vocab_size)


# ------------------------------------------------------------ the engine

def _past(mgr: KVCacheManager, rid: str, n: int):
    """K/V of positions [0, n) of request rid: the computed blocks whole, the
    rest from the block they are in (as a Go engine gathers them)."""
    P = mgr.BlockSize()
    cfg = mgr.Config()

    def past(layer: int):
        ks, vs = [], []
        for blk in mgr.GetComputedBlocks(rid, layer):
            ks.append(blk.k.clone())
            vs.append(blk.v.clone())
        have = sum(k.shape[0] for k in ks)
        for pos in range(have, n):
            blk = mgr.GetBlockForWrite(rid, layer, pos)
            ks.append(blk.k[pos % P][None].clone())
            vs.append(blk.v[pos % P][None].clone())
        k = torch.cat(ks)[:n].view(n, cfg.num_kv_heads, cfg.head_dim)
        v = torch.cat(vs)[:n].view(n, cfg.num_kv_heads, cfg.head_dim)
        return k, v
    return past


def _writer(mgr: KVCacheManager, rid: str, pos0: int):
    P = mgr.BlockSize()

    def on_kv(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for i in range(k.shape[0]):
            blk = mgr.GetBlockForWrite(rid, layer, pos0 + i)
            assert blk is not None, f"no block for position {pos0 + i}"
            blk.k[(pos0 + i) % P] = k[i].reshape(-1)
            blk.v[(pos0 + i) % P] = v[i].reshape(-1)
    return on_kv


def generate(mgr: KVCacheManager, model: TinyDecoder, rid: str, prompt: List[int],
             steps: int) -> List[int]:
    """The seed's call order: allocate, compute the uncached tail, commit;
    then append, compute, commit per token."""
    cached = mgr.AllocateRequest(rid, prompt)
    assert mgr.NumComputedTokens(rid) == cached
    tail = torch.tensor(prompt[cached:])
    logits = model(tail, cached, _past(mgr, rid, cached) if cached else None,
                   _writer(mgr, rid, cached))
    mgr.CommitTokens(rid, len(prompt) - cached)
    out = []
    for _ in range(steps):
        tok = int(logits[-1].argmax())
        out.append(tok)
        n = mgr.NumComputedTokens(rid)
        mgr.AppendToken(rid, tok)
        logits = model(torch.tensor([tok]), n, _past(mgr, rid, n), _writer(mgr, rid, n))
        mgr.CommitTokens(rid, 1)
    return out


PROMPT = ByteTokenizer().encode("The quick brown fox jumps over the lazy dog")  # 43


def test_seed_004_two_requests_share_a_prefix(kvpoold_004, model):
    want = model.greedy(PROMPT, 6)
    cfg = ManagerConfig(num_layers=2, num_kv_heads=2, head_dim=16, block_size=16,
                        max_seq_len=256, enable_caching=True, max_num_requests=4)
    mgr = NewKVCacheManager(cfg, socket=kvpoold_004.sock)
    assert mgr.BlockSize() == 16 and mgr.Config().max_seq_len == 256

    assert generate(mgr, model, "req-1", PROMPT, 6) == want
    r1 = mgr.GetRequest("req-1")
    assert r1.token_ids == PROMPT + want
    assert r1.num_computed_tokens == len(PROMPT) + 6 == mgr.NumComputedTokens("req-1")
    assert r1.num_cached_tokens == 0
    assert len(r1.block_ids) == 2 and r1.block_ids[0] == r1.block_ids[1]
    assert len(r1.block_ids[0]) == (len(PROMPT) + 6 + 15) // 16
    assert r1.published_blocks == (len(PROMPT) + 6) // 16

    # The same prompt again: its full blocks are found, computed by req-1.
    s0 = mgr.Stats()
    cached = mgr.AllocateRequest("req-2", PROMPT)
    assert cached == 32
    blocks2 = mgr.GetComputedBlocks("req-2", 1)
    assert [b.block_id for b in blocks2] == r1.block_ids[1][:2]
    for b1, b2 in zip(mgr.GetComputedBlocks("req-1", 1), blocks2):
        assert torch.equal(b1.k, b2.k) and torch.equal(b1.v, b2.v)
    s1 = mgr.Stats()
    assert s1.hit_tokens - s0.hit_tokens == 32 and s1.requests == 2
    mgr.FreeRequest("req-2")
    assert mgr.GetRequest("req-2") is None and mgr.NumComputedTokens("req-2") == 0
    assert mgr.GetComputedBlocks("req-2", 0) == []

    # And through the whole call order: the cached K/V give the same tokens.
    assert generate(mgr, model, "req-3", PROMPT, 6) == want
    assert mgr.GetRequest("req-3").num_cached_tokens == 32
    assert 0 < mgr.Usage() <= 1
    assert mgr.Stats().hit_rate > 0

    # The seed's errors.
    with pytest.raises(errors.KvpoolError, match="request req-1 already exists") as e:
        mgr.AllocateRequest("req-1", PROMPT)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(errors.NotFoundError, match="request nope not found"):
        mgr.AppendToken("nope", 1)
    mgr.CommitTokens("nope", 1)                 # ignored, as in the seed
    mgr.FreeRequest("nope")
    assert mgr.GetBlockForWrite("req-1", 5, 0) is None
    assert mgr.GetBlockForWrite("req-1", 0, 10_000) is None

    # kvpoold's per-request line, seed 004's format, for each allocation.
    log = kvpoold_004.log_text()
    assert f"kv_cache request={mgr.GetRequest('req-1').seq_id} prompt_tokens=43 " \
           "cached_tokens=0 new_tokens=43 blocks=3" in log
    assert f"kv_cache request={mgr.GetRequest('req-3').seq_id} prompt_tokens=43 " \
           "cached_tokens=32 new_tokens=11 blocks=3" in log
    mgr.Free()


def test_seed_004_limits_and_caching_off(kvpoold_004, model):
    want = model.greedy(PROMPT, 3)
    with kvpool.connect(kvpoold_004.sock) as c:
        mgr = KVCacheManager(ManagerConfig(max_seq_len=50, max_num_requests=2), c)
        # MaxSeqLen, MaxNumRequests: refused, nothing made.
        with pytest.raises(errors.TooBigError, match="51 tokens but max_seq_len is 50"):
            mgr.allocate_request("long", list(range(51)))
        assert mgr.get_request("long") is None
        mgr.allocate_request("a", PROMPT)
        mgr.allocate_request("b", PROMPT[:20])
        with pytest.raises(errors.KvpoolError, match="max_num_requests is 2") as e:
            mgr.allocate_request("c", PROMPT)
        assert e.value.errno == errno.ENOSPC
        mgr.free()
        assert c.stats()["seqs"] == 0

        # Written whole, committed in parts, as the seed allows: the K/V
        # stays (kvpoold gives uncommitted slots back at a commit).
        mgr = KVCacheManager(ManagerConfig(), c)
        cached = mgr.allocate_request(7, PROMPT)
        assert cached == 0
        kv = {}
        write = _writer(mgr, 7, 0)

        def on_kv(layer, k, v):
            kv[layer] = (k.clone(), v.clone())
            write(layer, k, v)
        model(torch.tensor(PROMPT), 0, None, on_kv)
        # Another process allocates between the commit and the new
        # reservation: the slots given back go to it.
        other = kvpool.connect(kvpoold_004.sock, "other")
        real_extend = c.seq_extend
        held = []

        def racing_extend(seq, n_new, tokens=None):
            held.append(other.seq_alloc(999, list(range(100, 140))))
            return real_extend(seq, n_new, tokens)
        c.seq_extend = racing_extend
        mgr.commit_tokens(7, 20)
        del c.seq_extend
        assert held and held[0].indices[0] not in c.seq_info(7)["pages"]
        held.clear()
        other.close()
        assert mgr.num_computed_tokens(7) == 20
        assert mgr.get_request(7).reserved_tokens == 23
        mgr.commit_tokens(7, 23)
        assert mgr.get_request(7).num_computed_tokens == 43
        for layer in range(2):
            for pos in range(43):
                blk = mgr.get_block_for_write(7, layer, pos)
                assert torch.equal(blk.k[pos % 16], kv[layer][0][pos].reshape(-1)), pos
                assert torch.equal(blk.v[pos % 16], kv[layer][1][pos].reshape(-1)), pos
        with pytest.raises(errors.InvalidArgumentError, match="0 are allocated"):
            mgr.commit_tokens(7, 1)
        mgr.free()

        # EnableCaching off: nothing found, nothing published, same tokens.
        pages0 = c.stats()["prefix_pages"]
        mgr = KVCacheManager(ManagerConfig(enable_caching=False), c)
        assert generate(mgr, model, "x", PROMPT, 3) == want
        assert generate(mgr, model, "y", PROMPT, 3) == want
        assert mgr.get_request("y").num_cached_tokens == 0
        assert mgr.get_request("y").token_ids == PROMPT + want
        assert mgr.get_request("y").published_blocks == 0
        assert c.stats()["prefix_pages"] == pages0
        mgr.free()


def test_seed_004_kvpoold_tenant_settings(model):
    """kvpool.conf's prefix_caching, max_seq_tokens and max_seqs hold for
    every process of the tenant: the manager reports them as the seed's
    errors would."""
    d = _Kvpoold("--prefix_caching=no", "--max_seq_tokens=64", "--max_seqs=2")
    try:
        mgr = KVCacheManager(ManagerConfig(), socket=d.sock)
        want = model.greedy(PROMPT, 2)
        assert generate(mgr, model, "r1", PROMPT, 2) == want
        assert generate(mgr, model, "r2", PROMPT, 2) == want
        assert mgr.get_request("r2").num_cached_tokens == 0  # caching off
        info = mgr._client.seq_info(mgr.get_request("r2").seq_id)
        assert not info["flags"] & kvpool._kvpool.SEQ_CACHING
        with pytest.raises(errors.KvpoolError, match="max_seqs is 2"):
            mgr.allocate_request("r3", PROMPT)
        mgr.free_request("r2")
        with pytest.raises(errors.TooBigError, match="max_seq_tokens is 64"):
            mgr.allocate_request("r3", list(range(65)))
        with pytest.raises(errors.TooBigError, match="max_seq_tokens is 64"):
            for t in range(30):
                mgr.append_token("r1", t)
                mgr.commit_tokens("r1", 1)
        mgr.free()
    finally:
        d.stop()
