# SPDX-License-Identifier: MIT
"""An HSTU ranking model in torch whose history K/V live in kvpool pages.

The architecture is the public HSTU one (Zhai et al., "Actions Speak Louder
than Words", 2024; NVIDIA recsys-examples' examples/hstu inference layer),
written here from that description, with random weights from a seed:

per layer, on the jagged tokens of a batch (users' tokens concatenated,
``offsets`` says where each user's begin)::

    x̂          = layer_norm(x)
    u, v, q, k = split(silu(x̂ @ W_uvqk + b))               # 4 x [n, heads * dim]
    a[i, j]    = silu(alpha * q_i·k_j + rab_pos(p_i - p_j) + rab_time(t_i - t_j))
                 / max_seq_len                              # pointwise, not softmax
    o_i        = sum_j mask(i, j) * a[i, j] * v_j
    x          = x + (layer_norm(o) * u) @ W_proj

mask: the history is causal (token i sees tokens j <= i); each candidate
sees the whole history and itself, no other candidate (the anchor's
``num_targets`` with target_group_size 1). So a history token's K/V depend
only on the tokens before it and can be cached; candidates are never cached.
The division by the fixed ``max_seq_len`` (HSTU's scaling_seqlen) keeps a
token's output independent of how many tokens follow it in the batch.

Tokens of a request (WORKLOADS.md): 6 contextual tokens, then item and
action tokens interleaved (2 per interaction), then the candidates.
Positions are a token's index in the user's sequence; candidates all take
position ``history_len`` and the request's time. The ranking head scores
each candidate's final output (layer norm, then an MLP) -- one logit each.

Cached forward (the seed's call order, through kvpool.hstu.KVCacheManager):
``rank_cached`` computes only the new history tokens and the candidates;
per layer it appends the new K/V with ``mgr.append_kvcache`` and reads the
cached history's K/V through the page table (``kv_indices``/``kv_indptr``
of the metadata) from ``mgr.get_kvcache_table(layer)``. ``rank`` without a
manager recomputes everything: the same code with nothing cached, the
reference the cached scores must equal.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ContinuityError, PoolFullError

N_CONTEXT = 6          # contextual tokens at the start of a history
ACTION_VOCAB = 256     # action_weights bitmask (8 bits)
CONTEXT_VOCAB = 64     # per contextual feature


@dataclass(frozen=True)
class HSTUConfig:
    """Model shapes. ``anchor()`` is the recsys-examples benchmark's;
    ``cpu()`` a small one for tests and CPU runs."""

    layers: int = 8
    hidden: int = 1024
    heads: int = 4
    head_dim: int = 256
    max_seq_len: int = 4096       # history tokens (contextual + items + actions)
    candidates: int = 256
    page_tokens: int = 32
    item_rows: int = 65536        # item ids are hashed into this many rows
    pos_buckets: int = 4096       # relative position bias: distances 0..buckets-1
    time_buckets: int = 64        # relative time bias: log-spaced |dt| buckets
    mlp_hidden: int = 512
    seed: int = 0
    eps: float = 1e-6

    @staticmethod
    def anchor() -> "HSTUConfig":
        return HSTUConfig()

    @staticmethod
    def cpu() -> "HSTUConfig":
        return HSTUConfig(layers=2, hidden=64, heads=2, head_dim=32, max_seq_len=256,
                          candidates=16, page_tokens=8, item_rows=4096, pos_buckets=256,
                          time_buckets=32, mlp_hidden=32)

    def layout(self, dtype: str = "fp32") -> str:
        """The kvpoold --layout holding this model's K/V."""
        return (f"layers={self.layers},kv_heads={self.heads},head_dim={self.head_dim},"
                f"dtype={dtype},page_tokens={self.page_tokens}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Request:
    """One ranking request: a user's history (items, actions, times in ms,
    the 6 contextual feature values) and the candidates to score.

    ``key`` names the cached history (the user, or user and day when
    histories do not cross days). ``history_tokens`` is 6 + 2 * items."""

    key: int
    items: Sequence[int]
    actions: Sequence[int]
    times_ms: Sequence[int]
    context: Sequence[int]
    candidates: Sequence[int]
    now_ms: int

    @property
    def history_tokens(self) -> int:
        return N_CONTEXT + 2 * len(self.items)


def _time_bucket(dt_ms: torch.Tensor, buckets: int) -> torch.Tensor:
    """|dt| in seconds, log-spaced into ``buckets`` (0 for the same second)."""
    s = dt_ms.abs().to(torch.float64) / 1000.0
    return torch.clamp(torch.floor(torch.log1p(s) / math.log(2.0)),
                       0, buckets - 1).to(torch.int64)


class HSTULayer(nn.Module):
    """One HSTU layer: uvqk projection, pointwise SiLU attention with
    relative position and time bias, layer norm, gate, output projection."""

    def __init__(self, cfg: HSTUConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden, cfg.heads * cfg.head_dim
        self.cfg = cfg
        self.norm_in = nn.LayerNorm(d, eps=cfg.eps)
        self.uvqk = nn.Linear(d, 4 * hd, bias=True)
        self.norm_out = nn.LayerNorm(hd, eps=cfg.eps)
        self.proj = nn.Linear(hd, d, bias=False)
        self.rab_pos = nn.Parameter(torch.zeros(cfg.heads, cfg.pos_buckets))
        self.rab_time = nn.Parameter(torch.zeros(cfg.heads, cfg.time_buckets))
        self.alpha = 1.0 / math.sqrt(cfg.head_dim)

    def uvqk_split(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        c = self.cfg
        h = F.silu(self.uvqk(self.norm_in(x)))
        u, v, q, k = h.split(c.heads * c.head_dim, dim=-1)
        shape = (-1, c.heads, c.head_dim)
        return u, v.reshape(shape), q.reshape(shape), k.reshape(shape)

    def attend(self, q: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor,
               g: "_Geometry", k_cand: torch.Tensor, v_cand: torch.Tensor) -> torch.Tensor:
        """One user's attention. q: [n_new + n_cand, H, D] (new history tokens,
        then candidates); k_hist/v_hist: [T, H, D], the whole history (cached
        and new); g: the user's bias buckets and mask (the same in every
        layer). Returns [nq, H*D]."""
        c = self.cfg
        nq, n_new = q.shape[0], g.n_new
        s = torch.einsum("qhd,khd->hqk", q, k_hist) * self.alpha
        s = s + self.rab_pos[:, g.dist] + self.rab_time[:, g.tbucket]
        a = F.silu(s) / c.max_seq_len * g.mask.to(s.dtype)
        out = torch.einsum("hqk,khd->qhd", a, v_hist)
        if nq > n_new:
            # Each candidate also sees itself (and no other candidate).
            sc = (q[n_new:] * k_cand).sum(-1) * self.alpha          # [nc, H]
            rb = self.rab_pos[:, 0] + self.rab_time[:, 0]           # distance 0, dt 0
            ac = F.silu(sc + rb[None, :]) / c.max_seq_len
            out[n_new:] = out[n_new:] + ac[..., None] * v_cand
        return out.reshape(nq, -1)

    def finish(self, x: torch.Tensor, o: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.norm_out(o) * u)


@dataclass
class _Batch:
    """The jagged batch of the new tokens: per user, new history tokens then
    candidates (``offsets``), and each user's whole-history positions/times."""

    x: torch.Tensor                 # [nnz, hidden]
    offsets: List[int]              # [B + 1] into x
    n_new: List[int]                # new history tokens per user
    n_cand: List[int]
    cached: List[int]               # history tokens already cached per user
    pos: List[torch.Tensor]         # per user: positions of all T + candidates
    times: List[torch.Tensor]       # per user: times of all T + candidates


@dataclass
class _Geometry:
    """One user's attention geometry, shared by every layer: the relative
    position and time buckets of each (query, key) pair, the mask (history
    queries causal, candidates see the whole history), and where the cached
    tokens lie in the pages (frames, slots)."""

    n_new: int
    dist: torch.Tensor              # [nq, T] int64
    tbucket: torch.Tensor           # [nq, T] int64
    mask: torch.Tensor              # [nq, T] bool
    frames: Optional[torch.Tensor]  # [cached] int64
    slots: Optional[torch.Tensor]


def _geometry(cfg: HSTUConfig, b: "_Batch", i: int, meta, page_device) -> _Geometry:
    new, nc, c = b.n_new[i], b.n_cand[i], b.cached[i]
    T = c + new
    p, t = b.pos[i], b.times[i]
    qpos = torch.cat([p[c:T], p[T:T + nc]])
    qt = torch.cat([t[c:T], t[T:T + nc]])
    dist = torch.clamp(qpos[:, None] - p[None, :T], 0, cfg.pos_buckets - 1)
    tb = _time_bucket(qt[:, None] - t[None, :T], cfg.time_buckets)
    mask = p[None, :T] <= qpos[:, None]
    mask[new:] = True
    frames = slots = None
    if c:
        # Page-table positions of the cached tokens: kv_indices[kv_indptr[i]:].
        P = cfg.page_tokens
        lo, hi = int(meta.kv_indptr[i]), int(meta.kv_indptr[i + 1])
        pages = meta.kv_indices[lo:hi].to(device=page_device, dtype=torch.int64)
        pos = torch.arange(c, device=page_device)
        frames, slots = pages[pos // P], pos % P
    return _Geometry(new, dist, tb, mask, frames, slots)


class HSTURanker(nn.Module):
    """Embeddings, ``layers`` HSTU layers and a ranking head (see the
    module docstring). Weights are drawn from ``cfg.seed``."""

    def __init__(self, cfg: HSTUConfig) -> None:
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        d = cfg.hidden
        self.item_emb = nn.Embedding(cfg.item_rows, d)
        self.action_emb = nn.Embedding(ACTION_VOCAB, d)
        self.context_emb = nn.Embedding(N_CONTEXT * CONTEXT_VOCAB, d)
        self.layers = nn.ModuleList(HSTULayer(cfg) for _ in range(cfg.layers))
        self.head_norm = nn.LayerNorm(d, eps=cfg.eps)
        self.head = nn.Sequential(nn.Linear(d, cfg.mlp_hidden), nn.SiLU(),
                                  nn.Linear(cfg.mlp_hidden, 1))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    continue   # layer norms keep weight 1, bias 0
                if name.endswith("bias") or "rab_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
                elif p.dim() == 2 and "emb" not in name:
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
                else:
                    p.copy_(torch.randn(p.shape, generator=g))
        self.eval()

    # ------------------------------------------------------------ inputs
    def history_embeddings(self, r: Request, first: int, n: int,
                           device: torch.device) -> torch.Tensor:
        """Embeddings of history tokens [first, first + n) of a request:
        contextual tokens, then item and action tokens interleaved."""
        d = self.cfg.hidden
        T = r.history_tokens
        out = torch.empty(T, d, device=device, dtype=self.item_emb.weight.dtype)
        ctx = torch.tensor([t * CONTEXT_VOCAB + int(r.context[t]) % CONTEXT_VOCAB
                            for t in range(N_CONTEXT)], dtype=torch.int64, device=device)
        out[:N_CONTEXT] = self.context_emb(ctx)
        e0, e1 = max(0, (first - N_CONTEXT) // 2), max(0, (first + n - N_CONTEXT + 1) // 2)
        if e1 > e0:
            items = torch.tensor(list(r.items[e0:e1]), dtype=torch.int64, device=device)
            acts = torch.tensor(list(r.actions[e0:e1]), dtype=torch.int64, device=device)
            lo = N_CONTEXT + 2 * e0
            out[lo:lo + 2 * (e1 - e0):2] = self.item_emb(items % self.cfg.item_rows)
            out[lo + 1:lo + 2 * (e1 - e0):2] = self.action_emb(acts % ACTION_VOCAB)
        return out[first:first + n]

    def positions(self, r: Request, device: torch.device
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Positions and times (ms) of the history's tokens and the candidates."""
        T, C = r.history_tokens, len(r.candidates)
        t0 = int(r.times_ms[0]) if len(r.times_ms) else int(r.now_ms)
        times = [t0] * N_CONTEXT
        for t in r.times_ms:
            times += [int(t), int(t)]
        times += [int(r.now_ms)] * C
        pos = list(range(T)) + [T] * C
        return (torch.tensor(pos, dtype=torch.int64, device=device),
                torch.tensor(times, dtype=torch.int64, device=device))

    def _batch(self, reqs: Sequence[Request], cached: Sequence[int],
               device: torch.device) -> _Batch:
        xs, offsets, n_new, n_cand, pos, times = [], [0], [], [], [], []
        for r, c in zip(reqs, cached):
            T = r.history_tokens
            if not 0 <= c <= T:
                raise ValueError(f"user {r.key}: {c} tokens cached, the history has {T}")
            new = T - c
            xs.append(self.history_embeddings(r, c, new, device))
            cand = torch.tensor([int(i) % self.cfg.item_rows for i in r.candidates],
                                dtype=torch.int64, device=device)
            xs.append(self.item_emb(cand))
            n_new.append(new)
            n_cand.append(len(r.candidates))
            offsets.append(offsets[-1] + new + len(r.candidates))
            p, t = self.positions(r, device)
            pos.append(p)
            times.append(t)
        return _Batch(torch.cat(xs), offsets, n_new, n_cand, list(cached), pos, times)

    # ------------------------------------------------------------ forward
    def _forward(self, b: _Batch, mgr=None, meta=None) -> List[torch.Tensor]:
        x = b.x
        page_dev = mgr.get_kvcache_table(0).device if mgr is not None else x.device
        geo = [_geometry(self.cfg, b, i, meta, page_dev) for i in range(len(b.n_new))]
        for li, layer in enumerate(self.layers):
            u, v, q, k = layer.uvqk_split(x)
            if mgr is not None:
                # The new history tokens' K/V (candidates are not cached),
                # users in batch order: the example's append_kvcache.
                idx = torch.cat([torch.arange(b.offsets[i], b.offsets[i] + b.n_new[i],
                                              device=x.device)
                                 for i in range(len(b.n_new))])
                mgr.append_kvcache(li, k.index_select(0, idx), v.index_select(0, idx), meta)
                table = mgr.get_kvcache_table(li)
            outs = []
            for i, g in enumerate(geo):
                lo, new, nc = b.offsets[i], b.n_new[i], b.n_cand[i]
                kn, vn = k[lo:lo + new], v[lo:lo + new]
                if g.frames is not None:
                    # The cached history, read through the page table.
                    kc = table[g.frames, 0, g.slots].to(device=kn.device, dtype=kn.dtype)
                    vc = table[g.frames, 1, g.slots].to(device=vn.device, dtype=vn.dtype)
                    kh, vh = torch.cat([kc, kn]), torch.cat([vc, vn])
                else:
                    kh, vh = kn, vn
                outs.append(layer.attend(q[lo:lo + new + nc], kh, vh, g,
                                         k[lo + new:lo + new + nc],
                                         v[lo + new:lo + new + nc]))
            x = layer.finish(x, torch.cat(outs), u)
        scores = []
        for i in range(len(b.n_new)):
            lo = b.offsets[i] + b.n_new[i]
            cand = x[lo:lo + b.n_cand[i]]
            scores.append(self.head(self.head_norm(cand)).squeeze(-1))
        return scores

    @torch.no_grad()
    def rank(self, reqs: Sequence[Request], device: Optional[torch.device] = None
             ) -> List[torch.Tensor]:
        """Scores of every request's candidates, recomputing the whole
        history (no cache): the reference."""
        dev = device or self.item_emb.weight.device
        return self._forward(self._batch(reqs, [0] * len(reqs), dev))

    @staticmethod
    def _cached_prefix(mgr, reqs: Sequence[Request]) -> List[int]:
        """get_batch_kvdata_info: the tokens of each request's history that
        are cached. A cache that is not a prefix of the history (it starts
        past 0, or holds more than the request sends) is evicted: 0."""
        starts, lens = mgr.get_batch_kvdata_info([r.key for r in reqs])
        cached = []
        for r, s, n in zip(reqs, starts.tolist(), lens.tolist()):
            if n and (s != 0 or n > r.history_tokens):
                mgr.evict_kv_cache([r.key])
                n = 0
            cached.append(n)
        return cached

    @torch.no_grad()
    def rank_cached(self, mgr, reqs: Sequence[Request], offload: bool = True,
                    retries: int = 50) -> Tuple[List[torch.Tensor], List[int]]:
        """Scores through a kvpool.hstu.KVCacheManager, in seed 002's call
        order: get_batch_kvdata_info, prepare_kv_cache from the cached end
        for the new history tokens, get_cache_metadata, per layer
        append_kvcache + attention over the page table, offload_kv_cache
        (the example offloads after the forward). Returns the scores and
        the tokens each request found cached.

        A cache that holds more of the history than the request sends (the
        request's history was cut, or a later one ran first) cannot serve
        it: that user's cache is evicted and the history recomputed (a miss).
        A prepare that fails because another process evicted a history
        between info and prepare (ContinuityError) or pins the whole device
        tier (PoolFullError) is retried from info, ``retries`` times."""
        dev = self.item_emb.weight.device
        keys = [r.key for r in reqs]
        if len(set(keys)) != len(keys):
            raise ValueError("rank_cached: a user appears twice in the batch")
        for attempt in range(retries + 1):
            cached = self._cached_prefix(mgr, reqs)
            news = [r.history_tokens - c for r, c in zip(reqs, cached)]
            try:
                mgr.prepare_kv_cache(keys, cached, news)
                break
            except (ContinuityError, PoolFullError):
                # Another pipeline's allocation evicted a history between
                # info and prepare, or its leases pin the tier for now:
                # ask again (the seed's info -> prepare order).
                if attempt == retries:
                    raise
                time.sleep(0.001 * (attempt + 1))
        meta = mgr.get_cache_metadata(keys)
        scores = self._forward(self._batch(reqs, cached, dev), mgr, meta)
        if offload:
            mgr.offload_kv_cache(keys)
        else:
            mgr.commit_kv_cache(keys)
        return scores, cached

