# SPDX-License-Identifier: MIT
"""kvpool.paged_attention: attention over pool pages where they lie.

On every machine: the tables (flat slots, shared launches, the causal rule
for the new tokens) and the torch reference equal kvpool.cascade's
level-by-level attention -- the oracle -- on a page-major pool (a layer
cache is a strided view, as Client.layer gives it), with shared levels,
mid-page ends, GQA, decode and prefill.

With CUDA and Triton (the device machine; skipped here with the reason):
the Triton kernel equals the reference in fp32 (IEEE dots, 1e-5), bf16 and
fp16, over contexts long enough to split, and a CUDA graph captured for a
bucket of lengths replays for other lengths and pages with the result of an
eager call."""
from __future__ import annotations

import os
import sys
from typing import List, Optional

import pytest
import torch

from kvpool import paged_attention as pa
from kvpool.cascade import Level, Plan

P, HKV, D, LAYERS = 16, 2, 64, 3


def _gpu_skip() -> Optional[str]:
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if pa.triton is None:
        return "Triton does not import"
    return None


class Pool:
    """A page-major pool [frames, layers, 2, P, Hkv, D]; layer caches are
    strided views of it, as kvpool.Client.layer() returns."""

    def __init__(self, frames: int, dtype=torch.float32, device="cpu", seed=0,
                 hkv: int = HKV) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tier = torch.randn(frames, LAYERS, 2, P, hkv, D, generator=g).to(dtype).to(device)
        self.free = torch.randperm(frames, generator=g).tolist()

    def layer(self, i: int) -> torch.Tensor:
        return self.tier[:, i]

    def table(self, tokens: int) -> List[int]:
        n = (tokens + P - 1) // P
        out, self.free = self.free[:n], self.free[n:]
        return out


def _case(pool: Pool, rows: int, n: int, shared: int, own: List[int], hq: int,
          device="cpu", dtype=torch.float32, seed=1):
    """A forward: a level shared by every row (``shared`` tokens; 0: none),
    one own level per row (``own[b]`` tokens, mid-page ends), the new tokens
    written to fresh slots of each row's sequence."""
    g = torch.Generator().manual_seed(seed)
    levels = []
    if shared:
        levels.append(Level.from_tables([(pool.table(shared), shared, rows)], P, device=device))
    if any(own):
        levels.append(Level.from_tables([(pool.table(t), t, 1) for t in own], P, device=device))
    seq = [pool.table(n + 5) for _ in range(rows)]
    store = Plan.slots_of([(s, 3, n) for s in seq], P, device=device)
    q = torch.randn(rows, hq, n, D, generator=g).to(dtype).to(device)
    k = torch.randn(rows, pool.tier.shape[-2], n, D, generator=g).to(dtype).to(device)
    v = torch.randn(rows, pool.tier.shape[-2], n, D, generator=g).to(dtype).to(device)
    return levels, store, q, k, v


CASES = [
    # rows, n, shared, own, hq
    (1, 1, 0, [37], 2),            # decode, one level, mid-page end
    (1, 7, 0, [50], 8),            # a query prefill, GQA 4
    (3, 1, 40, [5, 0, 33], 4),     # batch decode: a shared level, own levels, one empty
    (4, 5, 64, [17, 18, 1, 0], 2),  # batch prefill sharing a system
    (2, 3, 0, [0, 0], 2),          # nothing cached: the new tokens alone
]


@pytest.mark.parametrize("rows,n,shared,own,hq", CASES)
def test_reference_equals_cascade(rows, n, shared, own, hq) -> None:
    pool = Pool(64)
    levels, store, q, k, v = _case(pool, rows, n, shared, own, hq)
    layer = 1
    plan = Plan(lambda i: pool.layer(i), rows, n, levels, store=store)
    want = plan.attend(layer, q, k, v)                           # writes k, v too
    tables = pa.build_tables(plan.levels, rows, n, P, plan.store, "cpu")
    if shared and rows > 1:
        assert tables.launches[0].rows_per_group == rows      # read once for every row
    got = pa.attend_reference(q.transpose(1, 2), pool.layer(layer), tables, D ** -0.5)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    # attend() on the CPU is the reference
    got2 = pa.attend(q.transpose(1, 2), pool.layer(layer), tables)
    assert torch.equal(got2, got)


def test_bucket_key_ignores_pages_and_lengths() -> None:
    pool = Pool(128)
    keys = set()
    for own in ([300], [301], [500]):
        levels, store, *_ = _case(pool, 1, 4, 0, own, 2)
        keys.add(pa.build_tables(levels, 1, 4, P, store, "cpu").bucket_key())
    assert len(keys) == 1, keys
    levels, store, *_ = _case(pool, 1, 4, 0, [700], 2)
    assert pa.build_tables(levels, 1, 4, P, store, "cpu").bucket_key() not in keys


# ---------------------------------------------------------------- GPU
gpu = pytest.mark.skipif(_gpu_skip() is not None, reason=str(_gpu_skip()))


@gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2),
                                       (torch.float16, 5e-3)])
@pytest.mark.parametrize("rows,n,shared,own,hq", CASES + [(1, 32, 0, [3000], 8),
                                                          (2, 1, 2100, [900, 40], 8)])
def test_triton_equals_reference(dtype, tol, rows, n, shared, own, hq) -> None:
    pool = Pool(512, dtype=dtype, device="cuda", hkv=2)
    levels, store, q, k, v = _case(pool, rows, n, shared, own, hq, device="cuda", dtype=dtype)
    plan = Plan(lambda i: pool.layer(i), rows, n, levels, store=store)
    plan.write(0, k, v)
    tables = pa.build_tables(plan.levels, rows, n, P, plan.store, "cuda")
    qq = q.transpose(1, 2)
    got = pa.attend(qq, pool.layer(0), tables)
    want = pa.attend_reference(qq.float(), pool.layer(0).float(), tables, D ** -0.5)
    torch.cuda.synchronize()
    err = (got.float() - want).abs().max().item()
    assert err <= tol, err


@gpu
def test_graph_replays_other_lengths() -> None:
    pool = Pool(1024, dtype=torch.bfloat16, device="cuda")
    hq, n = 4, 8
    cases = [_case(pool, 1, n, 0, [t], hq, device="cuda", dtype=torch.bfloat16, seed=s)
             for s, t in enumerate((600, 1000, 517))]
    plans = []
    for levels, store, q, k, v in cases:
        plan = Plan(lambda i: pool.layer(i), 1, n, levels, store=store)
        plan.write(0, k, v)
        plans.append((pa.build_tables(levels, 1, n, P, plan.store, "cuda"), q.transpose(1, 2)))
    assert len({t.bucket_key() for t, _ in plans}) == 1
    static_t = plans[0][0].bucketed()
    static_q = plans[0][1].clone()
    out = torch.empty_like(static_q)
    pa.attend(static_q, pool.layer(0), static_t, out=out)      # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pa.attend(static_q, pool.layer(0), static_t, out=out)
    for tables, q in plans:
        static_t.copy_from(tables)
        static_q.copy_(q)
        g.replay()
        want = pa.attend(q, pool.layer(0), tables)
        torch.cuda.synchronize()
        assert (out.float() - want.float()).abs().max().item() <= 1e-2


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__] + sys.argv[1:]))
