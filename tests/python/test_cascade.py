# SPDX-License-Identifier: MIT
"""kvpool.cascade: cascade attention over paged KV equals attention over the
concatenated sequence (fp32 within 1e-5, bf16 within 1e-2), with several
levels, groups shared by several rows, empty groups, GQA, partial last pages,
destination slots and tiling. No daemon: the caches are plain tensors in the
pool's layer layout [frames, 2, page_tokens, kv_heads, head_dim]."""
from __future__ import annotations

from typing import List, Tuple

import pytest
import torch

from kvpool.cascade import Level, Plan, attention_reference, merge_state

P, HKV, D, FRAMES, LAYERS = 4, 2, 16, 96, 2


def _bf16_ok() -> bool:
    try:
        a = torch.ones(2, 2, dtype=torch.bfloat16)
        return bool((a @ a).float().sum() == 8)
    except RuntimeError:
        return False


class Pool:
    """Random layer caches and a frame allocator."""

    def __init__(self, dtype=torch.float32, seed=0, device="cpu") -> None:
        g = torch.Generator().manual_seed(seed)
        self.caches = [torch.randn(FRAMES, 2, P, HKV, D, generator=g).to(dtype).to(device)
                       for _ in range(LAYERS)]
        self.free = torch.randperm(FRAMES, generator=g).tolist()

    def table(self, tokens: int) -> List[int]:
        n = (tokens + P - 1) // P
        out, self.free = self.free[:n], self.free[n:]
        return out

    def kv(self, layer: int, table: List[int], tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """[HKV, tokens, D] K and V of a table's first tokens."""
        c = self.caches[layer]
        pos = torch.arange(tokens)
        fr = torch.tensor(table, dtype=torch.int64)[pos // P]
        k = c[fr.to(c.device), 0, (pos % P).to(c.device)]
        v = c[fr.to(c.device), 1, (pos % P).to(c.device)]
        return k.transpose(0, 1), v.transpose(0, 1)


def _csr(groups, qo_len=1):
    """compose-style int32 CSR dict from [(table, tokens, rows)]."""
    qo, kvp, idx, last = [0], [0], [], []
    for table, tokens, rows in groups:
        npages = (tokens + P - 1) // P
        idx += table[:npages]
        kvp.append(kvp[-1] + npages)
        last.append(0 if tokens == 0 else tokens - (npages - 1) * P)
        qo.append(qo[-1] + rows * qo_len)
    t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    return {"ngroups": len(groups), "qo_indptr": t(qo), "kv_indptr": t(kvp),
            "kv_indices": t(idx), "kv_last_page_len": t(last)}


def _scenario(pool: Pool):
    """4 rows; level 0: rows 0-2 share a 10-token system, row 3 has 7 tokens;
    level 1: per-row contexts (one empty); level 2: rows 1 and 2 share a
    query-level group, rows 0 and 3 their own (partial pages everywhere)."""
    spec = [
        [(10, 3), (7, 1)],
        [(5, 1), (0, 1), (9, 1), (4, 1)],
        [(3, 1), (6, 2), (1, 1)],
    ]
    levels, per_row = [], [[] for _ in range(4)]
    for lv in spec:
        groups, row = [], 0
        for tokens, rows in lv:
            table = pool.table(max(tokens, 1))
            groups.append((table, tokens, rows))
            for r in range(row, row + rows):
                per_row[r].append((table, tokens))
            row += rows
        levels.append(groups)
    return levels, per_row


def _reference(pool: Pool, layer, q, k, v, per_row):
    outs = []
    for b in range(q.shape[0]):
        ks, vs = [], []
        for table, tokens in per_row[b]:
            pk, pv = pool.kv(layer, table, tokens)
            ks.append(pk)
            vs.append(pv)
        K = torch.cat(ks + [k[b]], 1)
        V = torch.cat(vs + [v[b]], 1)
        past = K.shape[1] - k.shape[2]
        outs.append(attention_reference(q[b].float(), K.float(), V.float(), past))
    return torch.stack(outs)


def _run(dtype, hq, n, tol, device="cpu", csr=True, max_elems=1 << 26, seed=0):
    pool = Pool(dtype, seed, device)
    levels, per_row = _scenario(pool)
    B = 4
    if csr:
        lvs = [Level.from_csr(_csr(g, qo_len=n), P, rows=B, qo_len=n) for g in levels]
    else:
        lvs = [Level.from_tables(g, P) for g in levels]
    # destination: each row's n new tokens in a table of its own
    dst = [(pool.table(n), 0, n) for _ in range(B)]
    store = Plan.slots_of(dst, P)
    plan = Plan(pool.caches, B, n, lvs, store=store, max_score_elems=max_elems)
    g = torch.Generator().manual_seed(seed + 1)
    worst = 0.0
    for layer in range(LAYERS):
        q = torch.randn(B, hq, n, D, generator=g).to(dtype).to(device)
        k = torch.randn(B, HKV, n, D, generator=g).to(dtype).to(device)
        v = torch.randn(B, HKV, n, D, generator=g).to(dtype).to(device)
        out = plan.attend(layer, q, k, v)
        assert out.shape == (B, n, hq, D) and out.dtype == dtype
        ref = _reference(pool, layer, q, k, v, per_row)
        err = float((out.float() - ref.float()).abs().max())
        worst = max(worst, err)
        assert err <= tol, f"layer {layer}: max error {err}"
        # the new tokens were stored where the plan said
        for b, (table, _, _) in enumerate(dst):
            sk, sv = pool.kv(layer, table, n)
            assert torch.equal(sk, k[b]) and torch.equal(sv, v[b])
    return worst


@pytest.mark.parametrize("hq", [2, 4, 8])
@pytest.mark.parametrize("n", [1, 3, 7])
def test_cascade_equals_concatenated_fp32(hq, n):
    assert _run(torch.float32, hq, n, 1e-5) <= 1e-5


def test_cascade_from_tables_equals_from_csr():
    a = _run(torch.float32, 4, 3, 1e-5, csr=True)
    b = _run(torch.float32, 4, 3, 1e-5, csr=False)
    assert a <= 1e-5 and b <= 1e-5


def test_cascade_tiled_equals_untiled():
    # A score budget of 64 elements forces query and key tiles everywhere.
    assert _run(torch.float32, 4, 7, 1e-5, max_elems=64) <= 1e-5


@pytest.mark.skipif(not _bf16_ok(), reason="bf16 matmul not supported by this torch on CPU")
def test_cascade_bf16():
    assert _run(torch.bfloat16, 4, 3, 1e-2) <= 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cascade_cuda():
    assert _run(torch.float32, 4, 3, 1e-5, device="cuda") <= 1e-5
    assert _run(torch.bfloat16, 8, 5, 1e-2, device="cuda") <= 1e-2


def test_long_prefill_no_past():
    """One row, 300 new tokens, no past levels: causal attention (tiled)."""
    pool = Pool()
    n = 300
    table = pool.table(n)
    plan = Plan(pool.caches, 1, n, [], store=Plan.slots_of([(table, 0, n)], P),
                max_score_elems=4096)
    q, k, v = torch.randn(1, 4, n, D), torch.randn(1, HKV, n, D), torch.randn(1, HKV, n, D)
    out = plan.attend(1, q, k, v)
    ref = attention_reference(q[0], k[0], v[0], 0)
    assert float((out[0] - ref).abs().max()) <= 1e-5


def test_trimmed_and_with_lengths():
    pool = Pool()
    table = pool.table(11)
    lv = Level.from_tables([(table, 11, 1)], P)
    assert lv.trimmed(1).lengths.tolist() == [10]
    assert lv.with_lengths(5).lengths.tolist() == [5]
    q, k, v = torch.randn(1, 4, 1, D), torch.randn(1, HKV, 1, D), torch.randn(1, HKV, 1, D)
    out = Plan(pool.caches, 1, 1, [lv.trimmed(1)]).attend(0, q, k, v)
    pk, pv = pool.kv(0, table, 10)
    ref = attention_reference(q[0], torch.cat([pk, k[0]], 1), torch.cat([pv, v[0]], 1), 10)
    assert float((out[0] - ref).abs().max()) <= 1e-5


def test_merge_state_semantics():
    va, vb = torch.randn(3, 5), torch.randn(3, 5)
    sa, sb = torch.randn(3), torch.randn(3)
    v, s = merge_state(va, sa, vb, sb)
    wa, wb = sa.exp(), sb.exp()
    assert torch.allclose(v, (va * wa[:, None] + vb * wb[:, None]) / (wa + wb)[:, None],
                          atol=1e-6)
    assert torch.allclose(s, torch.logaddexp(sa, sb), atol=1e-6)
    ninf = torch.full((3,), float("-inf"))
    v2, s2 = merge_state(va, sa, vb, ninf)
    assert torch.equal(v2, va) and torch.allclose(s2, sa)
    v3, s3 = merge_state(va, ninf, vb, ninf)
    assert torch.equal(v3, torch.zeros_like(va)) and bool(torch.isinf(s3).all())


def test_plan_checks_shapes():
    pool = Pool()
    lv = Level.from_tables([(pool.table(4), 4, 2)], P)
    with pytest.raises(ValueError):
        Plan(pool.caches, 3, 1, [lv])
    plan = Plan(pool.caches, 2, 1, [lv])
    with pytest.raises(ValueError):
        plan.attend(0, torch.randn(2, 3, 1, D), torch.randn(2, 2, 1, D),
                    torch.randn(2, 2, 1, D))
    with pytest.raises(ValueError):
        Level.from_csr(_csr([(pool.table(4), 4, 2)], qo_len=1), P, rows=2, qo_len=3)


def test_a_stale_lease_writes_nothing(client, user):
    """With ``store=[(lease, first), ...]`` a plan writes its new tokens
    through libkvpool (Lease.append_layer: kvp_append_layer_async), so the
    library's lease checks cover it: through a good lease the K/V land where
    the lease says; once the lease is no longer the client's (released by id
    behind the plan's back, as a lease the daemon ended), write() and
    attend() raise StaleLeaseError and not one byte of the pool changes."""
    import kvpool
    L = client.layout
    H, Dh, n = L["kv_heads"], L["head_dim"], 5
    lease = client.prepare(user, 0, 2 * n)
    plan = Plan(client.layer, 1, n, [], store=[(lease, 0)])
    k, v = torch.randn(1, H, n, Dh), torch.randn(1, H, n, Dh)
    plan.write(0, k, v)
    gk, gv = lease.gather(0, n)                          # [n, H, D] from the pages
    assert torch.equal(gk, k[0].transpose(0, 1)) and torch.equal(gv, v[0].transpose(0, 1))
    assert plan.store is not None and plan.store[0].numel() == n    # the slots, for readers
    kvpool.Client.release(client, lease.id)              # the library forgets the lease
    later = Plan(client.layer, 1, n, [], store=[(lease, n)])
    before = client.tier().clone()
    with pytest.raises(kvpool.StaleLeaseError):
        later.write(1, k, v)
    with pytest.raises(kvpool.StaleLeaseError):
        later.attend(1, torch.randn(1, 2 * H, n, Dh), k, v)
    assert torch.equal(client.tier(), before), "a stale lease wrote into the pool"
    with pytest.raises(ValueError, match="rows"):
        Plan(client.layer, 2, n, [], store=[(lease, 0)])
