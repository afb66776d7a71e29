# SPDX-License-Identifier: MIT
"""Attention that reads kvpool pages where they lie: no gather, no copy.

The pool is page-major: a frame holds every layer's K and V for
``page_tokens`` tokens, so one layer's K is not one contiguous tensor. A
layer cache (:meth:`kvpool.Client.layer`) is the strided view ``[frames, 2,
page_tokens, kv_heads, head_dim]``; the kernel here takes its strides and
reads each key token's ``head_dim`` elements from the frame that holds it,
as FlashInfer's paged kernels take a page stride.

**Tables** (one forward, built once, used by every layer). A forward of
``rows`` batch rows of ``n`` new tokens each is a list of *launches*; each
launch is ``groups`` groups, and a group is

* ``qidx[g, :R]``: the batch rows whose queries read the group's keys
  (``-1`` pads), so rows sharing a cascade level (a system prompt) are
  one group and its pages are read once for all of them;
* ``tok[g, :lens[g]]``: the group's key tokens as *flat slots*
  ``frame * page_tokens + slot`` (any page table, any level boundaries,
  mid-page ends included, become one list);
* ``past[g]``: how many of those keys precede every query; key ``t`` is
  visible to new token ``i`` when ``t < past[g] + i + 1``. A cascade level
  has ``past = lens`` (all of it precedes); a row's own launch appends the
  forward's new tokens (written to the pool first) after its past, which
  makes them causal.

Every launch writes a partial state ``(out, lse)`` per split of its keys
into one buffer ``[splits, rows, n, Hq, D]`` (fp32, natural log), and one
merge by log-sum-exp (FlashInfer's ``merge_state``, natural logarithm)
gives the result ``[rows, n, Hq, D]`` in the query dtype. Splits give a
decode step over a 32k context enough programs to fill the GPU (flash
decoding); their number depends only on the table's capacity, so a CUDA
graph captured for a capacity replays for any length up to it.

GQA: query head ``h`` reads KV head ``h // (Hq // Hkv)`` (transformers'
``repeat_kv`` order). fp32 runs the dot products in IEEE fp32 (no TF32),
so fp32 outputs follow the reference to rounding; bf16/fp16 accumulate in
fp32 as FlashAttention does.

:func:`attend` runs the Triton kernels on CUDA where Triton imports, and
:func:`attend_reference` (torch, any device) everywhere else: the same
tables, the same semantics, the oracle the GPU test compares against.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import torch

try:  # Triton ships with CUDA builds of torch; Debian's CPU torch has none.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None

__all__ = ["Launch", "Tables", "attend", "attend_plan", "attend_reference", "available",
           "build_tables", "plan_tables"]

_LN2 = math.log(2.0)
_LOG2E = 1.0 / _LN2
#: the fewest key tokens a split reads (below this, a split costs more in
#: launch and merge than it saves)
MIN_SPLIT = 256
#: programs a launch aims for (about two per SM of an H100/H200)
TARGET_PROGRAMS = 264


def available(device: Any) -> bool:
    """True where :func:`attend` runs the Triton kernels (a CUDA device and
    an importable Triton)."""
    return triton is not None and torch.device(device).type == "cuda"


def _pow2_at_least(x: int, lo: int) -> int:
    return max(lo, 1 << max(0, int(x) - 1).bit_length())


class Launch:
    """One kernel launch's tables (see the module doc): ``qidx [G, R]``,
    ``tok [G, cap]``, ``lens [G]``, ``past [G]`` (int32, on the device).
    ``cap`` (the token capacity) fixes the splits, so a graph captured for
    it replays for any lengths up to it."""

    __slots__ = ("qidx", "tok", "lens", "past", "cap", "max_len")

    def __init__(self, qidx: torch.Tensor, tok: torch.Tensor, lens: torch.Tensor,
                 past: torch.Tensor, max_len: int) -> None:
        self.qidx, self.tok, self.lens, self.past = qidx, tok, lens, past
        self.cap = int(tok.shape[1])
        self.max_len = int(max_len)

    @property
    def groups(self) -> int:
        return int(self.qidx.shape[0])

    @property
    def rows_per_group(self) -> int:
        return int(self.qidx.shape[1])

    def shape_key(self) -> Tuple[int, int, int]:
        return (self.groups, self.rows_per_group, self.cap)

    def copy_from(self, other: "Launch") -> None:
        """Refill these (static) tables with ``other``'s, whose capacity is
        at most ours: a graph replay's inputs."""
        if other.shape_key()[:2] != self.shape_key()[:2] or other.max_len > self.cap:
            raise ValueError(f"Launch.copy_from: {other.shape_key()} into {self.shape_key()}")
        self.qidx.copy_(other.qidx, non_blocking=True)
        self.tok[:, :other.cap].copy_(other.tok, non_blocking=True)
        self.lens.copy_(other.lens, non_blocking=True)
        self.past.copy_(other.past, non_blocking=True)
        self.max_len = other.max_len

    def with_capacity(self, cap: int) -> "Launch":
        """A copy whose token tables hold ``cap`` tokens (a graph's static
        tables, sized by bucket)."""
        tok = torch.zeros(self.groups, cap, dtype=torch.int32, device=self.tok.device)
        tok[:, :self.cap] = self.tok
        return Launch(self.qidx.clone(), tok, self.lens.clone(), self.past.clone(),
                      self.max_len)


class Tables:
    """Every launch of one forward, plus the rows and new tokens they serve
    and the page size their flat slots use."""

    __slots__ = ("launches", "rows", "n", "page_tokens")

    def __init__(self, launches: List[Launch], rows: int, n: int, page_tokens: int) -> None:
        self.launches, self.rows, self.n = launches, int(rows), int(n)
        self.page_tokens = int(page_tokens)

    def key(self) -> Tuple[Any, ...]:
        """What a CUDA graph of a forward over these tables depends on: the
        launches' shapes and capacities, never their pages or lengths."""
        return (self.rows, self.n, tuple(l.shape_key() for l in self.launches))

    def bucket_key(self, lo: int = MIN_SPLIT) -> Tuple[Any, ...]:
        """:meth:`key` of :meth:`bucketed` (without making the copy)."""
        return (self.rows, self.n, tuple((l.groups, l.rows_per_group,
                                          _pow2_at_least(l.max_len, lo))
                                         for l in self.launches))

    def bucketed(self, lo: int = MIN_SPLIT) -> "Tables":
        """The same tables with each capacity rounded up to a power of two
        (at least ``lo``): one graph per bucket of context lengths."""
        return Tables([l.with_capacity(_pow2_at_least(l.max_len, lo)) for l in self.launches],
                      self.rows, self.n, self.page_tokens)

    def copy_from(self, other: "Tables") -> None:
        for a, b in zip(self.launches, other.launches):
            a.copy_from(b)


# ---------------------------------------------------------------- tables
def _level_slots(pages: torch.Tensor, length: int, P: int) -> torch.Tensor:
    """The first ``length`` tokens of a page table as flat slots (int64)."""
    if length <= 0:
        return torch.zeros(0, dtype=torch.int64)
    need = (length + P - 1) // P
    t = torch.arange(need * P, dtype=torch.int64)[:length]
    return pages[:need].to(torch.int64)[t // P] * P + t % P


def _pad_rows(rows: Sequence[torch.Tensor], cap: int) -> torch.Tensor:
    out = torch.zeros(len(rows), max(cap, 1), dtype=torch.int32)
    for i, r in enumerate(rows):
        out[i, :r.numel()] = r.to(torch.int32)
    return out


def build_tables(levels: Sequence[Any], rows: int, n: int, page_tokens: int,
                 store: Tuple[torch.Tensor, torch.Tensor], device: Any,
                 share_min_rows: int = 2) -> Tables:
    """Tables for a forward over :class:`kvpool.cascade.Level` s that stores
    its new tokens (see the module doc). A level whose group of at least
    ``share_min_rows`` rows shares it gets a launch of its own (its pages
    read once for the group); every other level is appended to its rows'
    own key list, followed by the new tokens' slots (``store``: frames,
    slots ``[rows * n]``, written before attention), which the rule ``t <
    past + i + 1`` makes causal."""
    P = int(page_tokens)
    device = torch.device(device)
    shared, own = [], []
    for lv in levels:
        rg = lv.row_group.cpu()
        counts = torch.bincount(rg, minlength=lv.ngroups) if rg.numel() else rg
        if rows > 1 and rg.numel() and int(counts.max()) >= share_min_rows:
            shared.append(lv)
        else:
            own.append(lv)
    launches: List[Launch] = []
    for lv in shared:
        pages, lengths, rg = lv.pages.cpu(), lv.lengths.cpu(), lv.row_group.cpu()
        G = lv.ngroups
        members = [torch.nonzero(rg == g).reshape(-1) for g in range(G)]
        R = max(int(m.numel()) for m in members)
        qidx = torch.full((G, R), -1, dtype=torch.int32)
        for g, m in enumerate(members):
            qidx[g, :m.numel()] = m.to(torch.int32)
        toks = [_level_slots(pages[g], int(lengths[g]), P) for g in range(G)]
        mx = max((int(t.numel()) for t in toks), default=0)
        lens = lengths.to(torch.int32)
        launches.append(Launch(qidx.to(device, non_blocking=True),
                               _pad_rows(toks, mx).to(device, non_blocking=True),
                               lens.to(device, non_blocking=True),
                               lens.to(device, non_blocking=True), mx))
    per_row: List[List[torch.Tensor]] = [[] for _ in range(rows)]
    for lv in own:
        pages, lengths, rg = lv.pages.cpu(), lv.lengths.cpu(), lv.row_group.cpu()
        cache = {}
        for b in range(rows):
            g = int(rg[b])
            if g not in cache:
                cache[g] = _level_slots(pages[g], int(lengths[g]), P)
            per_row[b].append(cache[g])
    past = torch.tensor([sum(int(t.numel()) for t in r) for r in per_row], dtype=torch.int32)
    frames, slots = store
    new = (frames.reshape(rows, n).cpu().to(torch.int64) * P +
           slots.reshape(rows, n).cpu().to(torch.int64))
    for b in range(rows):
        per_row[b].append(new[b])
    toks = [torch.cat(r) if r else torch.zeros(0, dtype=torch.int64) for r in per_row]
    lens = torch.tensor([int(t.numel()) for t in toks], dtype=torch.int32)
    mx = int(lens.max())
    launches.append(Launch(torch.arange(rows, dtype=torch.int32)[:, None].to(device),
                               _pad_rows(toks, mx).to(device, non_blocking=True),
                               lens.to(device, non_blocking=True),
                               past.to(device, non_blocking=True), mx))
    return Tables(launches, rows, n, P)


# ---------------------------------------------------------------- reference
def _launch_reference(q: torch.Tensor, cache: torch.Tensor, L: Launch, P: int,
                      scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """One launch in torch: out [B, n, Hq, D], lse [B, n, Hq] (fp32; rows the
    launch does not serve get lse -inf)."""
    B, n, Hq, D = q.shape
    Hkv = cache.shape[-2]
    rep = Hq // Hkv
    out = torch.zeros(B, n, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, n, Hq), float("-inf"), dtype=torch.float32, device=q.device)
    qidx, tok = L.qidx.cpu(), L.tok.cpu().to(torch.int64)
    lens, past = L.lens.cpu(), L.past.cpu()
    for g in range(L.groups):
        ln = int(lens[g])
        if ln == 0:
            continue
        t = tok[g, :ln].to(cache.device)
        K = cache[t // P, 0, t % P].float().repeat_interleave(rep, 1)     # [ln, Hq, D]
        V = cache[t // P, 1, t % P].float().repeat_interleave(rep, 1)
        for b in qidx[g].tolist():
            if b < 0:
                continue
            s = torch.einsum("nhd,thd->hnt", q[b].float(), K) * scale        # [Hq, n, ln]
            vis = torch.arange(ln, device=q.device)[None, :] < \
                (int(past[g]) + torch.arange(n, device=q.device)[:, None] + 1)
            s = s.masked_fill(~vis[None], float("-inf"))
            l_ = torch.logsumexp(s, -1)                                       # [Hq, n]
            l0 = torch.where(torch.isinf(l_), torch.zeros_like(l_), l_)
            p = torch.exp(s - l0[..., None])
            out[b] = torch.einsum("hnt,thd->nhd", p, V)
            lse[b] = l_.transpose(0, 1)
    return out, lse


def _merge_reference(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    m = lses.max(0).values
    m0 = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lses - m0)
    den = w.sum(0)
    return (outs * w[..., None]).sum(0) / torch.where(den > 0, den, torch.ones_like(den))[..., None]


def attend_reference(q: torch.Tensor, cache: torch.Tensor, tables: Tables,
                     scale: float) -> torch.Tensor:
    """:func:`attend` in plain torch (any device): q ``[B, n, Hq, D]``, a layer
    cache ``[frames, 2, P, Hkv, D]``; returns ``[B, n, Hq, D]`` in q's
    dtype."""
    parts = [_launch_reference(q, cache, L, tables.page_tokens, scale)
             for L in tables.launches]
    outs = torch.stack([o for o, _ in parts])
    lses = torch.stack([l for _, l in parts])
    return _merge_reference(outs, lses).to(q.dtype)


# ---------------------------------------------------------------- kernels
if triton is not None:
    @triton.jit
    def _paged_kernel(Q, QIDX, TOK, LENS, PAST, CACHE, OUT, LSE,
                      qk_scale, split_tokens, N, R, split0,
                      s_qb, s_qt, s_qh, s_ig, s_tg,
                      s_cf, s_ckv, s_ct, s_ch,
                      s_os, s_ob, s_ot, s_oh, s_ls, s_lb, s_lt,
                      HKV: tl.constexpr, REP: tl.constexpr, PAGE: tl.constexpr,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      IEEE: tl.constexpr):
        # Program (split, query block, group x kv head): the query rows of
        # one group and one KV head -- R rows x N tokens x REP heads,
        # flattened -- against the group's keys of one split.
        split = tl.program_id(0)
        mb = tl.program_id(1)
        gh = tl.program_id(2)
        g = gh // HKV
        h = gh % HKV
        r = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        rig = r // (N * REP)
        tk = (r // REP) % N
        hq = h * REP + r % REP
        rok = rig < R
        brow = tl.load(QIDX + g * s_ig + rig, mask=rok, other=-1)
        rok = rok & (brow >= 0)
        brow = tl.maximum(brow, 0)
        d = tl.arange(0, D)
        q = tl.load(Q + brow[:, None] * s_qb + tk[:, None] * s_qt + hq[:, None] * s_qh +
                    d[None, :], mask=rok[:, None], other=0.0)
        ln = tl.load(LENS + g)
        past = tl.load(PAST + g)
        start = split * split_tokens
        end = tl.minimum(start + split_tokens, ln)
        lim = tl.minimum(past + tk + 1, ln)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for t0 in range(start, end, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            tm = t < end
            fs = tl.load(TOK + g * s_tg + t, mask=tm, other=0)
            off = (fs // PAGE).to(tl.int64) * s_cf + (fs % PAGE) * s_ct + h * s_ch
            k = tl.load(CACHE + off[:, None] + d[None, :], mask=tm[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where((t[None, :] < lim[:, None]) & tm[None, :], s * qk_scale,
                         float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(CACHE + s_ckv + off[:, None] + d[None, :], mask=tm[:, None],
                        other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        ok = l_i > 0
        l_safe = tl.where(ok, l_i, 1.0)
        o = acc / l_safe[:, None]
        # the state in natural log, as the merge (and cascade.merge_state) use
        lse = tl.where(ok, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        sp = split0 + split
        tl.store(OUT + sp * s_os + brow[:, None] * s_ob + tk[:, None] * s_ot +
                 hq[:, None] * s_oh + d[None, :], o, mask=rok[:, None])
        tl.store(LSE + sp * s_ls + brow * s_lb + tk * s_lt + hq, lse, mask=rok)

    @triton.jit
    def _merge_kernel(OUT, LSE, RES, S, s_os, s_ls, D: tl.constexpr, BLOCK_S: tl.constexpr):
        # Program: one (row, token, head); the log-sum-exp merge of its S
        # partial states into the result, in the result's dtype.
        i = tl.program_id(0)
        s = tl.arange(0, BLOCK_S)
        sm = s < S
        lse = tl.load(LSE + s * s_ls + i, mask=sm, other=float("-inf"))
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        w = tl.where(sm, tl.exp(lse - m), 0.0)
        den = tl.sum(w, 0)
        d = tl.arange(0, D)
        o = tl.load(OUT + s[:, None] * s_os + i * D + d[None, :], mask=sm[:, None], other=0.0)
        res = tl.sum(o * w[:, None], 0) / tl.where(den > 0, den, 1.0)
        tl.store(RES + i * D + d, res.to(RES.dtype.element_ty))


def _splits(L: Launch, blocks_m: int, hkv: int, block_n: int) -> Tuple[int, int]:
    """(splits, tokens per split) for a launch of capacity L.cap: enough
    programs to fill the GPU, no split under MIN_SPLIT tokens."""
    cap = max(L.cap, 1)
    per = max(1, blocks_m * L.groups * hkv)
    want = max(1, -(-TARGET_PROGRAMS // per))
    most = max(1, -(-cap // MIN_SPLIT))
    s = min(want, most)
    tokens = -(-cap // s)
    tokens = -(-tokens // block_n) * block_n
    return -(-cap // tokens), tokens


def attend(q: torch.Tensor, cache: torch.Tensor, tables: Tables,
           scale: Optional[float] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of ``q`` ``[B, n, Hq, D]`` (after RoPE; the new tokens' K/V
    already in their pool slots where ``tables`` lists them) over one layer
    cache ``[frames, 2, page_tokens, Hkv, D]`` (the strided view
    :meth:`kvpool.Client.layer` returns: pages read where they lie).
    Returns ``[B, n, Hq, D]`` in q's dtype (into ``out`` when given)."""
    B, n, Hq, D = q.shape
    Hkv = int(cache.shape[-2])
    if scale is None:
        scale = D ** -0.5
    if not available(q.device):
        r = attend_reference(q, cache, tables, scale)
        if out is not None:
            out.copy_(r)
            return out
        return r
    if Hq % Hkv or cache.stride(-1) != 1 or D & (D - 1) or D < 16:
        raise ValueError(f"paged attention: q {tuple(q.shape)} over a cache "
                         f"{tuple(cache.shape)} strides {cache.stride()} (needs Hq a multiple "
                         "of Hkv, head_dim a power of two >= 16, contiguous head_dim)")
    if cache.dtype != q.dtype:
        q = q.to(cache.dtype)
    rep = Hq // Hkv
    ieee = cache.dtype == torch.float32
    block_n = 32 if ieee else 64
    plans = []
    total = 0
    for L in tables.launches:
        M = L.rows_per_group * n * rep
        block_m = min(64, _pow2_at_least(M, 16))
        blocks_m = -(-M // block_m)
        S, per = _splits(L, blocks_m, Hkv, block_n)
        plans.append((L, block_m, blocks_m, S, per, total))
        total += S
    part = torch.empty(total, B, n, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(total, B, n, Hq, dtype=torch.float32, device=q.device)
    # The merge writes [B, n, Hq, D] densely: an ``out`` of other strides
    # (a transposed view, empty_like of one) gets the result through a
    # copy, never written in the wrong order.
    res = out if out is not None and out.is_contiguous() and out.dtype == q.dtype \
        else torch.empty(B, n, Hq, D, dtype=q.dtype, device=q.device)
    sq = q.stride()
    for L, block_m, blocks_m, S, per, split0 in plans:
        grid = (S, blocks_m, L.groups * Hkv)
        _paged_kernel[grid](
            q, L.qidx, L.tok, L.lens, L.past, cache, part, lse,
            scale * _LOG2E, per, n, L.rows_per_group, split0,
            sq[0], sq[1], sq[2], L.qidx.stride(0), L.tok.stride(0),
            cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3),
            part.stride(0), part.stride(1), part.stride(2), part.stride(3),
            lse.stride(0), lse.stride(1), lse.stride(2),
            HKV=Hkv, REP=rep, PAGE=int(cache.shape[2]), D=D, BLOCK_M=block_m,
            BLOCK_N=block_n, IEEE=ieee, num_warps=4, num_stages=2)
    _merge_kernel[(B * n * Hq,)](part, lse, res, total, part.stride(0), lse.stride(0),
                                 D=D, BLOCK_S=_pow2_at_least(total, 2))
    if out is not None and res is not out:
        out.copy_(res)
        return out
    return res


# ---------------------------------------------------------------- plans
def plan_tables(plan: Any) -> Tables:
    """The tables of a :class:`kvpool.cascade.Plan` that stores its new
    tokens, built on first use and kept on the plan (one build per forward,
    used by every layer)."""
    t = getattr(plan, "_kvpool_tables", None)
    if t is None:
        if plan.store is None:
            raise ValueError("paged attention needs a plan that stores its new tokens "
                             "(Plan(..., store=...)); use Plan.attend for one that does not")
        t = plan._kvpool_tables = build_tables(plan.levels, plan.rows, plan.n,
                                               int(plan.cache(0).shape[2]), plan.store,
                                               plan.device)
    return t


def attend_plan(plan: Any, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: Optional[float] = None) -> torch.Tensor:
    """What :meth:`kvpool.cascade.Plan.attend` computes, on the paged kernel:
    q ``[rows, Hq, n, D]``, k/v ``[rows, Hkv, n, D]`` (as transformers'
    attention interface passes them). Writes k, v to the plan's slots (the
    lease checks first, once per forward), then attends every level's pages
    and the new tokens in place. Returns ``[rows, n, Hq, D]``."""
    plan.write(layer, k, v)
    qq = q.transpose(1, 2)
    if qq.stride(-1) != 1:
        qq = qq.contiguous()
    if scale is None and getattr(plan, "scale", None) is not None:
        scale = plan.scale
    return attend(qq, plan.cache(layer), plan_tables(plan), scale=scale)
