# SPDX-License-Identifier: MIT
"""Cascade attention over kvpool pages, in torch (CPU or CUDA).

One :class:`Plan` describes one model forward over ``rows`` batch rows of
``n`` new tokens each:

* **past levels** (:class:`Level`): each level splits the rows into groups;
  the rows of a group attend to the same KV tokens, read from pool pages
  through a page table (a CSR set as ``Client.compose(...).levels`` gives it,
  or a lease's page table). A level shared by every row (the system prompt
  of a batch) is attended once for all of them: the queries of a group are
  stacked, not the keys repeated.
* **destination slots** (optional): where the new tokens' K/V go in the pool
  (the fill lease of a chunk entry, a sequence's write lease); ``attend``
  writes them for its layer before it computes. Given as leases
  (``store=[(lease, first), ...]``, one per row) the library checks them
  before the first write of the forward (``Lease._check_write``: every
  check of kvp_append -- open, this client's, not committed, within the
  lease's new tokens -- for exactly the slots the plan writes, nothing
  written), so a lease that is no longer this client's writes nothing and
  raises :class:`kvpool.StaleLeaseError`; the writes themselves are then
  one indexed store per layer into those slots, which a CUDA graph can
  replay (HFAdapter checks again before each replay). One check per row
  and forward instead of a library append per row and layer: the query
  of a cached prompt was 2-3x slower through 32 layers' appends (bench/
  results/raw-2026-11-28-gpu3). Given
  as raw ``(frames, slots)`` tensors they are written with torch indexing
  and checked by nothing: that form is for memory the caller owns outright
  (plain tensors, a CUDA graph replaying a plan whose leases were checked
  when it was made), never for pool pages a lease is supposed to guard.
* :meth:`Plan.attend` ``(layer, q [B, Hq, n, D], k [B, Hkv, n, D], v)`` ->
  ``[B, n, Hq, D]``: attention of the new tokens over every past level
  (non-causal: all of a level's tokens precede the new ones) and over the new
  tokens themselves (causal), each as ``(out, lse)`` in fp32, merged by
  log-sum-exp exactly as FlashInfer's ``merge_state`` does (with natural
  logarithms here, where FlashInfer keeps log2). GQA inside: query head ``h``
  reads KV head ``h // (Hq // Hkv)`` (``repeat_interleave`` order, as
  transformers' ``repeat_kv``).

The page-table work (which frames, which token of a group is real, which
rows belong to which group) is done once per Plan, i.e. once per forward,
not per layer. Per layer a level costs one page gather from the pool
(``cache[pages]``: whole pages, one index per page) and two matmuls; very
long keys or queries are tiled so that no score tensor exceeds
``max_score_elems`` elements (a 32k-token prefill fits).

A page table's tokens start at slot 0 of its first page (every chunk entry,
sequence and lease table does): token ``t`` of a group is slot ``t %
page_tokens`` of page ``t // page_tokens``.

Layer caches are what :meth:`kvpool.Client.layer` returns: ``[frames, 2,
page_tokens, kv_heads, head_dim]`` (FlashInfer's NHD paged layout), K at
index 0 and V at 1.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch

__all__ = ["Level", "Plan", "merge_state", "attention_reference"]

_NEG_INF = float("-inf")

CacheSource = Union[Sequence[torch.Tensor], Callable[[int], torch.Tensor]]


def _i64(x: Any, device: Any = None) -> torch.Tensor:
    if torch.is_tensor(x):
        t = x.to(dtype=torch.int64)
    elif isinstance(x, int):
        t = torch.tensor(x, dtype=torch.int64)
    else:
        t = torch.as_tensor(list(x) if not isinstance(x, (bytes, bytearray)) else x,
                            dtype=torch.int64)
    return t.to(device) if device is not None else t


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor,
                s_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention states over disjoint key sets: ``v``
    ``[..., D]`` the softmax-weighted values, ``s`` ``[...]`` their
    log-sum-exp of the scores (natural log). Returns ``(v, s)`` of the union,
    as FlashInfer's ``merge_state`` (which uses log2). A state with ``s =
    -inf`` (no keys) contributes nothing; two of them give ``v = 0, s =
    -inf``."""
    m = torch.maximum(s_a, s_b)
    m0 = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a = torch.exp(s_a - m0)
    w_b = torch.exp(s_b - m0)
    den = w_a + w_b
    v = (v_a * w_a.unsqueeze(-1) + v_b * w_b.unsqueeze(-1)) / \
        torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    return v, m0 + torch.log(den)


def _softmax_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """q [X, H, r, Q, D] (already scaled), k/v [X, H, 1, T, D], mask
    broadcastable to [X, H, r, Q, T] (True = attend) or None.
    Returns out [X, H, r, Q, D], lse [X, H, r, Q]."""
    s = torch.matmul(q, k.transpose(-1, -2))
    if mask is not None:
        s = s.masked_fill(~mask, _NEG_INF)
    lse = torch.logsumexp(s, dim=-1)
    lse0 = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - lse0.unsqueeze(-1))
    return torch.matmul(p, v), lse


def _attend_tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask_fn: Callable[[int, int, int, int], Optional[torch.Tensor]],
                  max_elems: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Blocked attention: q [X, H, r, Q, D], k/v [X, H, 1, T, D]; mask_fn(q0,
    q1, k0, k1) -> mask for that tile (broadcastable to [X, H, r, q1-q0,
    k1-k0]) or None. Key tiles are merged by log-sum-exp."""
    X, H, r, Q, _ = q.shape
    T = k.shape[-2]
    per_qk = max(1, X * H * r)
    if per_qk * Q * max(T, 1) <= max_elems:
        return _softmax_block(q, k, v, mask_fn(0, Q, 0, T))
    # Keys in tiles of kt, queries in tiles of qt, kt * qt * per_qk <= max_elems.
    kt = max(1, min(T, max_elems // (per_qk * min(Q, 256))))
    qt = max(1, min(Q, max_elems // (per_qk * kt)))
    outs, lses = [], []
    for q0 in range(0, Q, qt):
        q1 = min(Q, q0 + qt)
        o = lse = None
        for k0 in range(0, T, kt):
            k1 = min(T, k0 + kt)
            ob, lb = _softmax_block(q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :],
                                    mask_fn(q0, q1, k0, k1))
            if o is None:
                o, lse = ob, lb
            else:
                o, lse = merge_state(o, lse, ob, lb)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


class Level:
    """One past level of a :class:`Plan`: ``ngroups`` groups, each a page
    table and a token count; every row belongs to one group.

    pages: ``[ngroups, max_pages]`` int64 frame numbers (padding: any valid
    frame, masked by the lengths); lengths: ``[ngroups]`` tokens of each
    group (0: an empty group, which contributes nothing); row_group:
    ``[rows]`` the group of each row (rows of a group need not be adjacent).
    Build one with :meth:`from_csr` (compose's tables), :meth:`from_tables`
    (lease page tables) or the constructor; it may be reused by many Plans
    (a decode loop keeps the chain's levels and makes a Plan per step).
    """

    __slots__ = ("pages", "lengths", "row_group", "page_tokens", "keep_kv", "_prep")

    def __init__(self, pages: torch.Tensor, lengths: torch.Tensor, row_group: torch.Tensor,
                 page_tokens: int, keep_kv: bool = False) -> None:
        self.pages = pages.to(torch.int64)
        self.lengths = lengths.to(torch.int64)
        self.row_group = row_group.to(torch.int64)
        self.page_tokens = int(page_tokens)
        #: keep each layer's gathered K/V for the next Plans over this level (a
        #: decode loop over an unchanging chain: one gather per layer for the
        #: whole generation, at the cost of a copy of the level's KV)
        self.keep_kv = bool(keep_kv)
        self._prep: dict = {}
        if self.pages.dim() != 2 or self.pages.shape[0] != self.lengths.shape[0]:
            raise ValueError(f"Level: pages {tuple(self.pages.shape)} for "
                             f"{self.lengths.shape[0]} groups")

    @property
    def ngroups(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def rows(self) -> int:
        return int(self.row_group.shape[0])

    def __repr__(self) -> str:
        return (f"Level(groups={self.ngroups}, rows={self.rows}, "
                f"tokens={self.lengths.tolist()})")

    def to(self, device: Any) -> "Level":
        return Level(self.pages.to(device), self.lengths.to(device),
                     self.row_group.to(device), self.page_tokens, self.keep_kv)

    def prepared(self, rows: int, device: Any) -> "_Prepared":
        """The per-forward indices on device (made once per level)."""
        key = (rows, str(device))
        p = self._prep.get(key)
        if p is None:
            p = self._prep[key] = _Prepared(self, rows, torch.device(device))
        return p

    def drop_kv(self) -> None:
        """Forget kept K/V (keep_kv) and prepared indices."""
        self._prep.clear()

    # ------------------------------------------------------------ builders
    @classmethod
    def from_csr(cls, level: Any, page_tokens: int, rows: Optional[int] = None,
                 qo_len: int = 1, device: Any = None) -> "Level":
        """From one level of FlashInfer's cascade CSR tables (a dict with
        ``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``,
        as :attr:`kvpool.Composition.levels` gives it). ``qo_indptr`` counts
        query rows in units of ``qo_len`` (the compose request's qo_len): a
        group of ``(qo_indptr[g+1] - qo_indptr[g]) / qo_len`` rows."""
        qo = _i64(level["qo_indptr"])
        kv_indptr = _i64(level["kv_indptr"])
        kv_indices = _i64(level["kv_indices"])
        last = _i64(level["kv_last_page_len"])
        G = int(kv_indptr.shape[0]) - 1
        if G < 0:
            raise ValueError("from_csr: empty kv_indptr")
        counts = qo[1:] - qo[:-1]
        if qo_len != 1:
            if bool((counts % qo_len != 0).any()):
                raise ValueError(f"from_csr: qo_indptr {qo.tolist()} is not in units of "
                                 f"qo_len {qo_len}")
            counts = counts // qo_len
        npages = kv_indptr[1:] - kv_indptr[:-1]
        lengths = torch.where(npages > 0, (npages - 1) * page_tokens + last,
                              torch.zeros_like(npages))
        pmax = int(npages.max()) if G else 0
        if pmax and kv_indices.numel():
            idx = kv_indptr[:-1, None] + torch.arange(pmax, dtype=torch.int64)[None, :]
            valid = torch.arange(pmax, dtype=torch.int64)[None, :] < npages[:, None]
            idx = torch.where(valid, idx, torch.zeros_like(idx))
            pages = torch.where(valid, kv_indices[idx], kv_indices[:1].expand_as(idx))
        else:
            pages = torch.zeros(G, 0, dtype=torch.int64)
        row_group = torch.repeat_interleave(torch.arange(G, dtype=torch.int64), counts)
        if rows is not None and int(row_group.shape[0]) != rows:
            raise ValueError(f"from_csr: qo_indptr {qo.tolist()} (qo_len {qo_len}) gives "
                             f"{row_group.shape[0]} rows, the plan has {rows}")
        lv = cls(pages, lengths, row_group, page_tokens)
        return lv.to(device) if device is not None else lv

    @classmethod
    def from_tables(cls, groups: Sequence[Tuple[Any, int, Any]], page_tokens: int,
                    device: Any = None) -> "Level":
        """From explicit page tables: ``groups`` is a list of ``(pages,
        tokens, rows)``: a page table (frame numbers: a list, an int32
        tensor such as ``Lease.kv_indices()``), how many of its tokens to
        attend (from slot 0 of its first page), and the rows in this group
        (an int: that many rows, following the previous group's; or a list
        of row indices)."""
        G = len(groups)
        tabs = [_i64(p) for p, _, _ in groups]
        lens = torch.tensor([int(t) for _, t, _ in groups], dtype=torch.int64)
        for g, (tab, n) in enumerate(zip(tabs, lens.tolist())):
            if n > tab.numel() * page_tokens:
                raise ValueError(f"from_tables: group {g} has {tab.numel()} pages for "
                                 f"{n} tokens")
        need = [(n + page_tokens - 1) // page_tokens for n in lens.tolist()]
        pmax = max(need) if need else 0
        pages = torch.zeros(G, pmax, dtype=torch.int64)
        for g, (tab, k) in enumerate(zip(tabs, need)):
            if k:
                pages[g, :k] = tab[:k]
                pages[g, k:] = tab[0]
        rg: List[int] = []
        explicit: List[Tuple[int, List[int]]] = []
        for g, (_, _, rows) in enumerate(groups):
            if isinstance(rows, int):
                rg.extend([g] * rows)
            else:
                explicit.append((g, [int(r) for r in rows]))
        if explicit:
            if rg:
                raise ValueError("from_tables: give every group's rows as a count, or every "
                                 "group's as a list")
            nrows = 1 + max((max(r) for _, r in explicit if r), default=-1)
            row_group = torch.full((nrows,), -1, dtype=torch.int64)
            for g, r in explicit:
                row_group[r] = g
            if bool((row_group < 0).any()):
                raise ValueError("from_tables: a row in no group")
        else:
            row_group = torch.tensor(rg, dtype=torch.int64)
        lv = cls(pages, lens, row_group, page_tokens)
        return lv.to(device) if device is not None else lv

    def trimmed(self, n: int = 1) -> "Level":
        """The same level without the last ``n`` tokens of every group (the
        token a forward recomputes when its KV is cached but its logits are
        not)."""
        return Level(self.pages, (self.lengths - n).clamp_min(0), self.row_group,
                     self.page_tokens)

    def with_lengths(self, lengths: Any) -> "Level":
        """The same page tables with other token counts (a decode loop's
        growing sequence level)."""
        ln = _i64(lengths, self.lengths.device)
        if ln.dim() == 0:
            ln = ln.expand(self.ngroups).clone()
        return Level(self.pages, ln, self.row_group, self.page_tokens)


class _Prepared:
    """A level's per-forward indices, computed on the CPU (no device syncs)
    and moved to the device once; cached on the Level for later Plans."""

    __slots__ = ("pages", "kmask", "qidx", "row_group", "row_pos", "identity", "tokens",
                 "empty", "kv")

    def __init__(self, lv: Level, rows: int, device: torch.device) -> None:
        P = lv.page_tokens
        if lv.rows != rows:
            raise ValueError(f"Plan: a level of {lv.rows} rows in a plan of {rows}")
        pages, lengths, rg = lv.pages.cpu(), lv.lengths.cpu(), lv.row_group.cpu()
        G = lv.ngroups
        # only as many pages as the longest group needs
        need = int((lengths.max() + P - 1) // P) if G else 0
        pages = pages[:, :need]
        T = need * P
        self.tokens = T
        self.empty = T == 0
        kmask = torch.arange(T)[None, :] < lengths[:, None]                 # [G, T]
        self.kmask = None if bool(kmask.all()) else kmask.to(device, non_blocking=True)
        counts = torch.bincount(rg, minlength=G)
        R = int(counts.max()) if rows else 0
        order = torch.sort(rg, stable=True).indices
        starts = torch.cumsum(counts, 0) - counts
        pos_sorted = torch.arange(rows) - starts[rg[order]]
        row_pos = torch.empty_like(rg)
        row_pos[order] = pos_sorted
        qidx = torch.zeros(G, max(R, 1), dtype=torch.int64)
        qidx[rg, row_pos] = torch.arange(rows)
        self.identity = G == 1 and R == rows and bool((row_pos == torch.arange(rows)).all())
        self.pages = pages.to(device, non_blocking=True)
        self.qidx = qidx.to(device, non_blocking=True)
        self.row_group = rg.to(device, non_blocking=True)
        self.row_pos = row_pos.to(device, non_blocking=True)
        self.kv: Optional[dict] = {} if lv.keep_kv else None


class Plan:
    """One forward's attention plan over kvpool pages (see the module doc).

    caches: the layer caches, a list indexed by layer (``Client.kv_caches()``)
    or a callable ``layer -> tensor``; each ``[frames, 2, page_tokens,
    kv_heads, head_dim]``. rows, n: the batch rows and new tokens per row of
    the forward. levels: past :class:`Level` s (any order: the merge is
    symmetric). store: None; or one ``(lease, first)`` per row: row b's new
    tokens are the lease's new tokens ``first .. first + n - 1``, written
    through libkvpool (the lease checks apply; :attr:`store` then holds
    their ``(frames, slots)`` too, for readers); or raw ``(frames, slots)``
    int tensors ``[rows, n]`` (``Plan.slots_of``), written with torch
    indexing and checked by nothing (memory the caller owns; see the module
    doc). scale: the softmax scale (default ``head_dim ** -0.5``).
    max_score_elems: the largest score tensor to materialise (tiles beyond).
    """

    def __init__(self, caches: CacheSource, rows: int, n: int,
                 levels: Sequence[Level] = (),
                 store: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                 scale: Optional[float] = None, device: Any = None,
                 max_score_elems: int = 1 << 26) -> None:
        self._caches = caches
        self.rows, self.n = int(rows), int(n)
        self.scale = scale
        self.max_score_elems = int(max_score_elems)
        if device is None:
            device = self.cache(0).device
        self.device = torch.device(device)
        self.levels: List[Level] = list(levels)
        for lv in self.levels:
            if lv.rows != self.rows:
                raise ValueError(f"Plan: a level of {lv.rows} rows in a plan of {self.rows}")
        # The torch path's per-level indices, made on its first use: a
        # forward on kvpool.paged_attention's kernel never needs them.
        self._prep_list: Optional[List[_Prepared]] = None
        self.store = None
        self.leases: Optional[List[Tuple[Any, int]]] = None
        self.checked = False            # leases checked for this forward
        if store is not None and _is_lease_store(store):
            self.leases = [(lease, int(first)) for lease, first in store]
            if len(self.leases) != self.rows:
                raise ValueError(f"Plan: store of {len(self.leases)} leases, the forward "
                                 f"has {self.rows} rows")
            store = Plan.slots_of([(lease.kv_indices(), lease.len + first, self.n)
                                   for lease, first in self.leases],
                                  self.leases[0][0].client.layout["page_tokens"]
                                  if self.leases else 1)
        if store is not None:
            frames, slots = store
            frames = _i64(frames, self.device).reshape(-1)
            slots = _i64(slots, self.device).reshape(-1)
            if frames.numel() != self.rows * self.n or slots.numel() != frames.numel():
                raise ValueError(f"Plan: store for {frames.numel()} tokens, the forward has "
                                 f"{self.rows} x {self.n}")
            self.store = (frames, slots)
        self._causal = torch.ones(self.n, self.n, dtype=torch.bool,
                                  device=self.device).tril_()

    # ------------------------------------------------------------ helpers
    @property
    def _prep(self) -> List[_Prepared]:
        if self._prep_list is None:
            prep = [lv.prepared(self.rows, self.device) for lv in self.levels]
            self._prep_list = [p for p in prep if not p.empty]
        return self._prep_list

    def cache(self, layer: int) -> torch.Tensor:
        c = self._caches
        return c(layer) if callable(c) else c[layer]

    @property
    def past_tokens(self) -> torch.Tensor:
        """``[rows]``: the past tokens each row attends (summed over levels)."""
        tot = torch.zeros(self.rows, dtype=torch.int64)
        for lv in self.levels:
            tot += lv.lengths.cpu()[lv.row_group.cpu()]
        return tot

    @staticmethod
    def slots_of(tables: Sequence[Tuple[Any, int, int]], page_tokens: int,
                 device: Any = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Destination slots ``(frames, slots)`` ``[rows, n]`` from one page
        table per row: ``(pages, first, n)``: the row's new tokens are table
        tokens ``first .. first + n - 1`` (a lease: ``(lease.kv_indices(),
        lease.len + i, n)``)."""
        fr, sl = [], []
        for pages, first, n in tables:
            tab = _i64(pages)
            pos = torch.arange(int(first), int(first) + int(n), dtype=torch.int64)
            if n and int(pos[-1]) >= tab.numel() * page_tokens:
                raise ValueError(f"slots_of: token {int(pos[-1])} is past a table of "
                                 f"{tab.numel()} pages")
            fr.append(tab[pos // page_tokens])
            sl.append(pos % page_tokens)
        frames = torch.stack(fr) if fr else torch.zeros(0, 0, dtype=torch.int64)
        slots = torch.stack(sl) if sl else torch.zeros(0, 0, dtype=torch.int64)
        if device is not None:
            frames, slots = frames.to(device), slots.to(device)
        return frames, slots

    # ------------------------------------------------------------ attention
    def check_writes(self) -> None:
        """Have the library check every row's lease for the slots this plan
        writes (``Lease._check_write(first, n)``: kvp_append's lease checks,
        nothing written); raises StaleLeaseError and friends. ``write`` does
        it before the forward's first write; call it again before writing
        the same plan again (a CUDA graph replay)."""
        for lease, first in self.leases or ():
            lease._check_write(first, self.n)
        self.checked = True

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' K, V (``[rows, Hkv, n, D]``) of ``layer``
        into the plan's pool slots (``attend`` does it first). Lease slots
        are checked by the library first (once per forward)."""
        if self.leases is not None and not self.checked:
            self.check_writes()
        if self.store is None:
            return
        cache = self.cache(layer)
        frames, slots = self.store
        B, H, n, D = k.shape
        kk = k.transpose(1, 2).reshape(B * n, H, D).to(cache.dtype)
        vv = v.transpose(1, 2).reshape(B * n, H, D).to(cache.dtype)
        cache[frames, 0, slots] = kk
        cache[frames, 1, slots] = vv

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: Optional[float] = None) -> torch.Tensor:
        """q ``[rows, Hq, n, D]`` (after RoPE), k/v ``[rows, Hkv, n, D]``.
        Writes k, v to the plan's slots (when it stores), then returns the
        attention of q over every past level and the new tokens (causal),
        merged by log-sum-exp: ``[rows, n, Hq, D]`` in q's dtype."""
        B, Hq, n, D = q.shape
        Hkv = k.shape[1]
        if B != self.rows or n != self.n:
            raise ValueError(f"attend: q {tuple(q.shape)} for a plan of {self.rows} rows "
                             f"x {self.n} tokens")
        if Hq % Hkv:
            raise ValueError(f"attend: {Hq} query heads over {Hkv} KV heads")
        rep = Hq // Hkv
        if scale is None:
            scale = self.scale if self.scale is not None else D ** -0.5
        self.write(layer, k, v)
        qs = q.float() * scale                                   # [B, Hq, n, D]
        # The new tokens, causal: q [B, Hkv, rep, n, D] over k [B, Hkv, 1, n, D].
        qh = qs.reshape(B, Hkv, rep, n, D)
        causal = self._causal

        def causal_mask(q0: int, q1: int, k0: int, k1: int) -> Optional[torch.Tensor]:
            return causal[q0:q1, k0:k1]
        o, lse = _attend_tiled(qh, k.float().unsqueeze(2), v.float().unsqueeze(2),
                               causal_mask, self.max_score_elems)
        # o [B, Hkv, rep, n, D] -> [B, n, Hq, D]; lse [B, Hkv, rep, n] -> [B, n, Hq]
        o = o.reshape(B, Hq, n, D).transpose(1, 2)
        lse = lse.reshape(B, Hq, n).transpose(1, 2)
        if self._prep:
            cache = self.cache(layer)
            qf = qs.transpose(1, 2)                              # [B, n, Hq, D]
            for p in self._prep:
                o2, lse2 = self._past(p, layer, qf, cache, Hkv, rep)
                o, lse = merge_state(o, lse, o2, lse2)
        return o.to(q.dtype)

    def _past(self, p: _Prepared, layer: int, qf: torch.Tensor, cache: torch.Tensor,
              Hkv: int, rep: int) -> Tuple[torch.Tensor, torch.Tensor]:
        B, n, Hq, D = qf.shape
        G, R = p.qidx.shape
        T = p.tokens
        got = p.kv.get(layer) if p.kv is not None else None
        if got is None:
            kv = cache[p.pages]                                  # [G, Pm, 2, P, Hkv, D]
            K = kv[:, :, 0].reshape(G, T, Hkv, D).permute(0, 2, 1, 3).unsqueeze(2)
            V = kv[:, :, 1].reshape(G, T, Hkv, D).permute(0, 2, 1, 3).unsqueeze(2)
            if p.kv is not None:
                K, V = K.contiguous(), V.contiguous()
                p.kv[layer] = (K, V)
        else:
            K, V = got
        K, V = K.float(), V.float()
        if p.identity:
            qg = qf.unsqueeze(0)                                 # [1, B, n, Hq, D]
        else:
            qg = qf[p.qidx]                                      # [G, R, n, Hq, D]
        Rr = qg.shape[1]
        # [G, R*n, Hkv, rep, D] -> [G, Hkv, rep, R*n, D]
        qh = qg.reshape(G, Rr * n, Hkv, rep, D).permute(0, 2, 3, 1, 4)
        kmask = p.kmask[:, None, None, None, :] if p.kmask is not None else None

        def mask(q0: int, q1: int, k0: int, k1: int) -> Optional[torch.Tensor]:
            return kmask[..., k0:k1] if kmask is not None else None
        o, lse = _attend_tiled(qh, K, V, mask, self.max_score_elems)
        # back to [G, R, n, Hq, D] / [G, R, n, Hq]
        o = o.permute(0, 3, 1, 2, 4).reshape(G, Rr, n, Hq, D)
        lse = lse.permute(0, 3, 1, 2).reshape(G, Rr, n, Hq)
        if p.identity:
            return o[0], lse[0]
        return o[p.row_group, p.row_pos], lse[p.row_group, p.row_pos]


def _is_lease_store(store: Any) -> bool:
    """store=[(lease, first), ...] rather than (frames, slots) tensors."""
    if torch.is_tensor(store) or not isinstance(store, (list, tuple)) or not store:
        return isinstance(store, (list, tuple)) and not store
    first = store[0]
    return isinstance(first, (list, tuple)) and len(first) == 2 and \
        hasattr(first[0], "append_layer")


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        past: int = 0, scale: Optional[float] = None) -> torch.Tensor:
    """Plain attention for tests: q ``[Hq, n, D]`` over k/v ``[Hkv, past + n,
    D]`` (the first ``past`` tokens precede the queries, the rest causal),
    GQA by repeat_interleave, fp32 math. Returns ``[n, Hq, D]``."""
    Hq, n, D = q.shape
    rep = Hq // k.shape[0]
    kk = k.float().repeat_interleave(rep, 0)
    vv = v.float().repeat_interleave(rep, 0)
    s = torch.matmul(q.float(), kk.transpose(-1, -2)) * (scale if scale is not None
                                                          else D ** -0.5)
    T = kk.shape[1]
    mask = torch.arange(T, device=q.device)[None, :] > \
        (torch.arange(n, device=q.device)[:, None] + past)
    s = s.masked_fill(mask, _NEG_INF).softmax(-1)
    return torch.matmul(s, vv).transpose(0, 1).to(q.dtype)
