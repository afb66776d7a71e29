# SPDX-License-Identifier: MIT
"""kvpool.paged_attention: attention over pool pages where they lie.

On every machine: the tables (flat slots, shared launches, the causal rule
for the new tokens) and the torch reference equal kvpool.cascade's
level-by-level attention -- the oracle -- on a page-major pool (a layer
cache is a strided view, as Client.layer gives it), with shared levels,
mid-page ends, GQA, decode and prefill; and ChunkedLLM on TinyDecoder
attending through them (kvpool.paged_attention.attend_plan, the function
HFAdapter's fast path calls) generates the greedy tokens of one full
prefill, a batch sharing a system reading it in one launch.

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


# ---------------------------------------------------------------- ChunkedLLM
# The tables as ChunkedLLM's forwards make them (lease stores, compose's CSR
# levels, prefill pieces, a sequence's own level, batches sharing a system):
# TinyDecoder through attend_plan generates the greedy tokens of one full
# prefill, exactly as through Plan.attend.
@pytest.fixture(scope="module")
def paged_llm():
    from conftest import Daemon
    from kvpool.llm import ChunkedLLM
    from kvpool.tiny import tiny_llm_parts
    d = Daemon(device_mem="16M", host_mem="4M")
    model, adapter, tok = tiny_llm_parts(paged=True)
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=d.sock) as m:
        m.model = model
        yield m
    d.stop()


def test_chunked_llm_on_paged_tables(paged_llm) -> None:
    from test_llm import DOCS, GREEDY, QUERIES, SYSTEM, expect_same, toks
    llm = paged_llm
    llm.prefill_chunk = 37                       # prefill pieces over the fill lease
    s = llm.register_chunk(SYSTEM * 2, "system_prompt")
    c = [llm.register_chunk(d, "context") for d in DOCS]
    q = [llm.register_chunk(x, "query") for x in QUERIES]
    out = llm.generate_from_chunks(s, [c[1], c[2]], q[0], GREEDY)
    expect_same(llm.model, toks(llm, SYSTEM * 2, DOCS[1], DOCS[2], QUERIES[0]),
                out["token_ids"], "one composition")
    reqs = [{"system_chunk_id": s, "context_chunk_ids": [c[0]], "query_chunk_id": q[0]},
            {"system_chunk_id": s, "context_chunk_ids": [c[1]], "query_chunk_id": q[1]},
            {"system_chunk_id": s, "context_chunk_ids": [c[2], c[0]], "query_chunk_id": q[1]}]
    outs = llm.batch_generate_from_chunks(reqs, GREEDY)
    texts = [[DOCS[0], QUERIES[0]], [DOCS[1], QUERIES[1]], [DOCS[2], DOCS[0], QUERIES[1]]]
    for o, t in zip(outs, texts):
        expect_same(llm.model, toks(llm, SYSTEM * 2, *t), o["token_ids"], f"batch row {t}")
    # the standard form: a private sequence, then a decode over it
    o = llm.generate(prompt=SYSTEM + QUERIES[1], sampling_params=dict(GREEDY, max_tokens=9))
    expect_same(llm.model, toks(llm, SYSTEM + QUERIES[1]), o["token_ids"], "generate(prompt)")


def test_batch_decode_reads_the_shared_system_once(paged_llm) -> None:
    """A decode step of a batch sharing a system chunk: the system's level
    is one launch whose group holds every row."""
    from kvpool.cascade import Plan
    llm = paged_llm
    s = llm.register_chunk(SYSTEM_FOR_SHARING, "system_prompt")
    qs = [llm.register_chunk(f"question {i}?", "query") for i in range(3)]
    reqs = [{"system_chunk_id": s, "context_chunk_ids": [], "query_chunk_id": x} for x in qs]
    seen = []
    orig = Plan.__init__

    def spy(self, *a, **kw):
        orig(self, *a, **kw)
        seen.append(self)
    Plan.__init__ = spy
    try:
        llm.batch_generate_from_chunks(reqs, {"temperature": 0, "max_tokens": 3,
                                              "ignore_eos": True})
    finally:
        Plan.__init__ = orig
    decode = [p for p in seen if p.rows == 3 and p.n == 1 and p.store is not None]
    assert decode, [(p.rows, p.n) for p in seen]
    launches = pa.plan_tables(decode[-1]).launches
    assert launches[0].rows_per_group == 3 and launches[0].groups == 1
    assert int(launches[0].lens[0]) >= len(SYSTEM_FOR_SHARING)


SYSTEM_FOR_SHARING = "A system prompt long enough to span several pages of the pool. " * 3


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


def _capture(fn) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of fn, the way kvpool.hf_llm.HFAdapter makes one: the
    warm-up and the capture on one side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        fn()
    torch.cuda.synchronize()
    return g


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
    g = _capture(lambda: pa.attend(static_q, pool.layer(0), static_t, out=out))
    errs = []
    for i, (tables, q) in enumerate(plans):
        want = pa.attend(q, pool.layer(0), tables)
        ref = pa.attend_reference(q, pool.layer(0), tables, D ** -0.5)
        # the bucketed tables eagerly (no graph), then the graph's replay
        bucket = tables.bucketed()
        eager = pa.attend(q, pool.layer(0), bucket)
        static_t.copy_from(tables)
        static_q.copy_(q)
        g.replay()
        torch.cuda.synchronize()
        for what, got in (("eager", want), ("eager bucketed", eager), ("graph", out)):
            diff = (got.float() - ref.float()).abs()
            if diff.max().item() > 1e-2:
                bad = (diff.amax(dim=-1) > 1e-2).nonzero().tolist()
                errs.append(f"case {i} ({tables.launches[0].max_len} tokens): {what} "
                            f"max diff {diff.max().item():.3g} at [b, t, h] {bad[:6]}")
    assert not errs, "\n".join(errs)


@gpu
def test_out_of_any_strides_gets_the_result() -> None:
    """attend(out=...) with an out that is not dense [B, n, Hq, D] (empty_like
    of a transposed query): the H200 runs of 2026-11-28 found the merge
    writing such an out in dense order, right only at [0, 0, 0] -- what
    the graph tests, which pass one, took for stale replays."""
    pool = Pool(128, dtype=torch.float32, device="cuda")
    levels, store, q, k, v = _case(pool, 1, 4, 0, [100], 4, device="cuda", seed=3)
    plan = Plan(lambda i: pool.layer(i), 1, 4, levels, store=store)
    plan.write(0, k, v)
    tables = pa.build_tables(levels, 1, 4, P, plan.store, "cuda")
    qq = q.transpose(1, 2)
    want = pa.attend_reference(qq, pool.layer(0), tables, D ** -0.5)
    out = torch.empty_like(qq)
    assert not out.is_contiguous()
    got = pa.attend(qq, pool.layer(0), tables, out=out)
    assert got is out
    assert (out - want).abs().max().item() <= 1e-4


@gpu
def test_graph_replay_runs_the_kernels() -> None:
    """A replay recomputes: the output is zeroed between capture and replay,
    the inputs changed in place, and the replay must write the new answer
    (a kernel launched outside the capture stream would run once, eagerly,
    during the capture, and leave the graph without it)."""
    pool = Pool(256, dtype=torch.float32, device="cuda")
    levels, store, q, k, v = _case(pool, 1, 4, 0, [300], 4, device="cuda", seed=7)
    plan = Plan(lambda i: pool.layer(i), 1, 4, levels, store=store)
    plan.write(0, k, v)
    tables = pa.build_tables(levels, 1, 4, P, plan.store, "cuda")
    static_q = q.transpose(1, 2).clone()
    out = torch.empty_like(static_q)
    g = _capture(lambda: pa.attend(static_q, pool.layer(0), tables, out=out))
    first = out.clone()
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert out.abs().max().item() > 0, "the replay wrote nothing: the kernels are not in the graph"
    assert (out - first).abs().max().item() <= 1e-5
    static_q.mul_(-1.0)
    g.replay()
    want = pa.attend(static_q, pool.layer(0), tables)
    torch.cuda.synchronize()
    assert (out - want).abs().max().item() <= 1e-5, "the replay did not read the new inputs"


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__] + sys.argv[1:]))
