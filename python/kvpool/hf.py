# SPDX-License-Identifier: MIT
"""kvpool.hf: a HuggingFace transformers Cache whose K/V live in kvpool pages.

    import kvpool, kvpool.hf

    with kvpool.connect() as c, kvpool.hf.KVPoolCache(c, user=42, config=model.config) as cache:
        out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64)
    # on exit the cache is flushed: the K/V of every token it saw is user 42's
    # kvpool history, which another process continues:
    with kvpool.connect() as c, kvpool.hf.KVPoolCache(c, user=42) as cache:
        cache.get_seq_length()                       # what is cached: out.shape[1] - 1
        model.generate(out, past_key_values=cache, max_new_tokens=64)

The cache is a ``transformers.Cache`` (transformers >= 5) of one
:class:`KVPoolLayer` per model layer. The pool's layout must be the model's
KV geometry: ``layers`` = num_hidden_layers, ``kv_heads`` =
num_key_value_heads, ``head_dim``, and its dtype the model's (bf16 for a bf16
model): K/V are stored bit for bit, never converted. On the cuda backend the
pages are GPU memory mapped in this process, written on the current torch
stream; on the shm backend they are host memory (CPU models). Every write into
the pages goes through libkvpool (:meth:`kvpool.Lease.append` /
``append_layer``: kvp_append*), so the library's lease checks cover the
cache: a lease that is no longer this client's writes nothing and raises
:class:`kvpool.StaleLeaseError`. Reads (loading a cached history,
``mirror=False``'s gathers) index the mapped pages directly.
Where the bytes go (measured by tools/hf_proof.py on an H100, see
bench/results/hf-cache-2026-11-25.md):

* attention reads a mirror of this generation's K/V (``mirror=True``, the
  default): one tensor ``[layers, 2, batch, kv_heads, capacity, head_dim]``,
  grown geometrically, of which each layer's ``keys``/``values`` are
  ``[batch, kv_heads, tokens, head_dim]`` views; an ``update`` is two copies
  into it (where DynamicCache concatenates the whole history). The pages are
  read once, when a cache is opened on a cached history. ``mirror=False``
  keeps no second copy and gathers every layer's K/V from the pages at every
  step (slower).
* ``write="through"`` (default): at the end of every forward (the last
  layer's update) one append (kvp_append) writes the step's K and V of every
  layer into their page slots in the device tier, from a contiguous copy of
  the step's slice of the mirror. A lease reserves ``reserve`` tokens at a time
  (``prepare(user, start+len, reserve)``); it is committed and released when
  full and at :meth:`KVPoolCache.flush`. ``reserve=1`` commits every step.
* ``write="behind"``: a prefill is written at once, decode tokens every
  ``flush_every`` tokens and at flush (one prepare/commit each time).

(A variant that grew each layer's history with ``torch.cat`` as DynamicCache
does and wrote every layer's K/V into the pages in its own update decoded at
0.86x DynamicCache's tokens/s on the H100; this one at 1.04x.)

The history is kvpool's user history (DESIGN.md): ``prepare`` must continue
it exactly, so a cache opened on user U continues U's cached tokens, and a
second writer of U in between makes the next prepare fail with
:class:`kvpool.OverlapError` (nothing is overwritten). One batch row per
user: pass ``user=[u0, u1, ...]`` for a batch (rows of equal length, no
padding). Beam search, cropping below what was committed and sliding-window
layers are not supported (they raise).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from . import _client

try:
    import transformers as _transformers
    from transformers import cache_utils as _cache_utils
except ImportError as _e:  # pragma: no cover - depends on the machine
    raise ImportError("kvpool.hf needs HuggingFace transformers >= 5 "
                      f"(pip install 'transformers>=5'): {_e}") from _e

_tf_version = getattr(_transformers, "__version__", "0")
try:
    _tf_major = int(str(_tf_version).split(".")[0])
except ValueError:  # pragma: no cover
    _tf_major = 0
if _tf_major < 5:
    raise ImportError(f"kvpool.hf needs transformers >= 5; this is {_tf_version}")

_Cache = _cache_utils.Cache
_DynamicLayer = _cache_utils.DynamicLayer

__all__ = ["KVPoolCache", "KVPoolLayer", "load_kv", "cached_length"]


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class KVPoolLayer(_DynamicLayer):
    """One model layer of a :class:`KVPoolCache`: its K/V live in kvpool
    pages (``keys``/``values`` are what attention reads: the mirror, or a
    gather from the pages with ``mirror=False``). Made by KVPoolCache."""

    is_sliding = False
    is_compileable = False

    def __init__(self, cache: "KVPoolCache", layer_idx: int) -> None:
        super().__init__()
        self._kvp = cache
        self.layer_idx = layer_idx
        self._len = 0
        self._kb: Optional[torch.Tensor] = None   # views of the cache's mirror
        self._vb: Optional[torch.Tensor] = None

    def __repr__(self) -> str:
        return f"KVPoolLayer({self.layer_idx}, tokens={self._len})"

    # ------------------------------------------------ the CacheLayerMixin protocol
    def lazy_initialization(self, key_states: torch.Tensor, value_states: Any = None) -> None:
        self._kvp._init_layer(self, key_states)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               *args: Any, **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._kvp._update(self, key_states, value_states)

    def get_seq_length(self) -> int:
        return self._len

    def get_mask_sizes(self, query_length: Any, *args: Any) -> Tuple[int, int]:
        # transformers 5 passes the query length; 4.5x passed cache_position.
        q = query_length.shape[0] if torch.is_tensor(query_length) else int(query_length)
        return self._len + q, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:
        return -1

    def crop(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("crop a KVPoolCache as a whole: cache.crop(n)")

    def reset(self) -> None:
        raise NotImplementedError(
            "a KVPoolCache is a kvpool user history: it is not reset; evict the "
            "user (client.evict(user)) and open a new cache")

    def offload(self) -> None:  # the pool has tiers of its own (client.offload)
        pass

    def prefetch(self) -> None:
        pass

    def reorder_cache(self, beam_idx: Any) -> None:
        raise NotImplementedError("beam search is not supported by KVPoolCache")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("KVPoolCache: one batch row per user; no num_return_sequences > 1")

    def batch_select_indices(self, indices: Any) -> None:
        raise NotImplementedError("KVPoolCache: one batch row per user; rows cannot be dropped")


class KVPoolCache(_Cache):
    """A transformers Cache over kvpool user histories (one user per batch
    row). Pass it as ``past_key_values`` to ``model(...)`` or
    ``model.generate(...)``.

    client: a :class:`kvpool.Client` (or None: connect to ``socket``, and
    close that connection in :meth:`close`). user: the user id (or a list,
    one per batch row). config: the model's config, to check the pool's
    layout against it now rather than at the first forward. write, mirror,
    reserve, flush_every: see the module's doc. capacity: tokens to allocate
    the mirror for up front (0: grown as needed). load: continue the user's
    cached history (default; False requires it to be empty).

    Tokens become the user's kvpool history when committed: when a lease
    fills (write="through"), every ``flush_every`` tokens (write="behind")
    and at :meth:`flush` / :meth:`close` / the end of a ``with`` block.
    Layers must be updated in turn, 0 to layers-1, with the same tokens
    (what a decoder's forward does).
    """

    def __init__(self, client: Optional["_client.Client"] = None,
                 user: Union[int, Sequence[int]] = 0, *, config: Any = None,
                 write: str = "through", mirror: bool = True, reserve: int = 64,
                 flush_every: int = 64, capacity: int = 0, load: bool = True,
                 socket: Optional[str] = None) -> None:
        if write not in ("through", "behind"):
            raise ValueError(f"write must be 'through' or 'behind', not {write!r}")
        if not mirror and write != "through":
            raise ValueError("mirror=False reads K/V from the pages: it needs write='through'")
        if reserve < 1 or flush_every < 1:
            raise ValueError("reserve and flush_every are at least 1")
        self._own = client is None
        if client is None:
            import kvpool  # noqa: PLC0415
            client = kvpool.connect(socket, "kvpool.hf")
        self.client = client
        self.users: List[int] = [int(user)] if isinstance(user, int) else [int(u) for u in user]
        if not self.users:
            raise ValueError("KVPoolCache: no user")
        L = client.layout
        self.num_layers: int = L["layers"]
        self.kv_heads: int = L["kv_heads"]
        self.head_dim: int = L["head_dim"]
        self.page_tokens: int = L["page_tokens"]
        self.dtype: torch.dtype = _client.torch_dtype(L["dtype"])
        self.device: torch.device = client.device
        self.write, self.mirror = write, mirror
        self.reserve, self.flush_every = int(reserve), int(flush_every)
        self._capacity = int(capacity)
        if config is not None:
            self._check_config(config)
        super().__init__(layers=[KVPoolLayer(self, i) for i in range(self.num_layers)])
        # The device tier as rows of one token's K (or V) of one layer,
        # [kv_heads, head_dim]: row ((frame * layers + layer) * 2 + kv) *
        # page_tokens + slot (see _rows).
        self._rows = client.tier().view(-1, self.kv_heads, self.head_dim)
        B = len(self.users)
        self._buf: Optional[torch.Tensor] = None   # the mirror [layers, 2, B, H, cap, D]
        self._len = 0                              # tokens every layer holds
        self._committed = [0] * B                  # tokens in the kvpool history
        self._leases: List[Any] = [None] * B       # write="through": the open lease
        self._lease_base = [0] * B                 # its first token
        self._hist_idx: List[Optional[torch.Tensor]] = [None] * B    # mirror=False: [cap, layers, 2]
        self._closed = False
        if load:
            self._load()
        else:
            for u in self.users:
                if client.info(u).len:
                    raise ValueError(f"user {u} has a cached history (load=False)")

    # ------------------------------------------------------------ public
    def flush(self) -> int:
        """Commit every token the cache holds to the kvpool history (and end
        the open lease). Returns the tokens committed by this call."""
        self._check_open()
        if any(layer._len != self._len for layer in self.layers):
            raise RuntimeError("KVPoolCache.flush() in the middle of a forward "
                               "(not every layer has the last tokens yet)")
        done = 0
        for b in range(len(self.users)):
            done += self._end_lease(b) if self.write == "through" else self._write_behind(b)
        return done

    def close(self, flush: bool = True) -> None:
        """Flush (unless flush=False: uncommitted tokens are given back) and
        let go of the leases and the mirror; close the client if the cache
        opened it. The history stays in kvpool."""
        if self._closed:
            return
        try:
            if flush and not self.client.closed:
                self.flush()
        finally:
            for b, lease in enumerate(self._leases):
                if lease is not None and not self.client.closed:
                    lease.release()
                self._leases[b] = self._hist_idx[b] = None
            for layer in self.layers:
                layer.keys = layer.values = layer._kb = layer._vb = None
            self._buf = self._rows = None
            self._closed = True
            if self._own:
                self.client.close()

    def __enter__(self) -> "KVPoolCache":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(flush=exc_type is None)

    @property
    def committed(self) -> int:
        """Tokens of this cache that are in the kvpool history (row 0)."""
        return self._committed[0]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx]._len if layer_idx < len(self.layers) else 0

    def crop(self, tokens_to_remove: int = 0, **kwargs: Any) -> None:
        """Drop tokens from the end (negative: that many; positive, the
        transformers 4 meaning: keep that many). Only tokens not yet
        committed can go: the kvpool history is append-only."""
        n = kwargs.get("max_length", tokens_to_remove)
        keep = self._len + n if n < 0 else min(n, self._len)
        if keep < max(self._committed):
            raise ValueError(f"KVPoolCache.crop: {max(self._committed)} tokens are committed "
                             f"to kvpool (append-only); cannot keep only {keep}")
        for layer in self.layers:
            layer._len = keep
            self._set_views(layer, keep)
        self._len = keep

    def reset(self) -> None:  # type: ignore[override]
        raise NotImplementedError(
            "a KVPoolCache is a kvpool user history: it is not reset; evict the "
            "user (client.evict(user)) and open a new cache")

    # ------------------------------------------------------------ checks
    def _check_config(self, config: Any) -> None:
        cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        layers = getattr(cfg, "num_hidden_layers", None)
        heads = getattr(cfg, "num_attention_heads", None)
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        hd = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
        want = (self.num_layers, self.kv_heads, self.head_dim)
        if (layers, kv, hd) != want:
            raise ValueError(
                f"the pool's layout (layers={want[0]}, kv_heads={want[1]}, head_dim={want[2]}) "
                f"is not the model's (num_hidden_layers={layers}, num_key_value_heads={kv}, "
                f"head_dim={hd}): start kvpoold with --layout=layers={layers},kv_heads={kv},"
                f"head_dim={hd},dtype=...")
        types = getattr(cfg, "layer_types", None)
        if types and any(t != "full_attention" for t in types):
            raise ValueError(f"KVPoolCache holds full-attention layers only; the model has {set(types)}")
        if not types and getattr(cfg, "sliding_window", None) and \
                getattr(cfg, "use_sliding_window", True):
            raise ValueError("KVPoolCache does not support sliding-window attention")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the KVPoolCache is closed")

    def _init_layer(self, layer: KVPoolLayer, k: torch.Tensor) -> None:
        self._check_open()
        B, H, _, D = k.shape
        if k.dtype != self.dtype:
            raise TypeError(f"the model's K/V are {k.dtype}, the pool holds {self.dtype}: "
                            "run the model in the pool's dtype (kvpool stores K/V bit for bit)")
        if k.device != self.device:
            raise ValueError(f"the model's K/V are on {k.device}, the pool is on {self.device}")
        if (H, D) != (self.kv_heads, self.head_dim) or B != len(self.users):
            raise ValueError(f"K/V of shape [batch={B}, heads={H}, ., dim={D}]; the cache "
                             f"serves {len(self.users)} users with kv_heads={self.kv_heads}, "
                             f"head_dim={self.head_dim}")
        layer.dtype, layer.device = self.dtype, self.device
        layer.batch_size = B
        if self.mirror:
            self._grow(max(self._capacity, self._len + k.shape[2]))
            self._set_views(layer, layer._len)
        layer.is_initialized = True

    # ------------------------------------------------------------ the mirror
    def _grow(self, need: int) -> None:
        buf = self._buf
        cap = 0 if buf is None else buf.shape[4]
        if need <= cap:
            return
        new = torch.empty((self.num_layers, 2, len(self.users), self.kv_heads,
                           _round_up(max(need + 256, cap * 3 // 2), 64), self.head_dim),
                          dtype=self.dtype, device=self.device)
        if buf is not None and self._len:
            new[..., :self._len, :].copy_(buf[..., :self._len, :])
        self._buf = new
        for layer in self.layers:
            self._set_views(layer, layer._len)

    def _set_views(self, layer: KVPoolLayer, n: int) -> None:
        if self.mirror and self._buf is not None:
            layer._kb = self._buf[layer.layer_idx, 0]      # [B, H, cap, D]
            layer._vb = self._buf[layer.layer_idx, 1]
            layer.keys, layer.values = layer._kb[:, :, :n], layer._vb[:, :, :n]

    def _rows_of(self, lease: Any, first: int, n: int) -> torch.Tensor:
        return _rows(lease, first, n, self.num_layers, self.page_tokens).to(self.device)

    def _hist_append(self, b: int, idx: torch.Tensor, at: int) -> None:
        h = self._hist_idx[b]
        need = at + idx.shape[0]
        if h is None or h.shape[0] < need:
            new = torch.empty((_round_up(max(need + 256, need * 3 // 2), 64), self.num_layers, 2),
                              dtype=torch.int64, device=self.device)
            if h is not None and at:
                new[:at].copy_(h[:at])
            self._hist_idx[b] = h = new
        h[at:need].copy_(idx)

    # ------------------------------------------------------------ load
    def _load(self) -> None:
        infos = [self.client.info(u) for u in self.users]
        lens = {i.len for i in infos}
        if lens == {0}:
            return
        if len(lens) != 1:
            raise ValueError("KVPoolCache: the users' cached histories differ in length "
                             f"({[i.len for i in infos]}); one cache serves rows of equal length")
        for i in infos:
            if i.start:
                raise ValueError(f"user {i.user}: its history starts at token {i.start} "
                                 "(the head was trimmed); KVPoolCache needs it from token 0")
        n = lens.pop()
        if self.mirror:
            self._grow(max(self._capacity, n))
        for b, u in enumerate(self.users):
            with self.client.prepare(u, n, 0) as lease:   # pins the pages while we read
                idx = self._rows_of(lease, 0, n)          # [n, layers, 2]
                if self.mirror:                           # one gather, one copy
                    g = self._rows.index_select(0, idx.view(-1)).view(
                        n, self.num_layers, 2, self.kv_heads, self.head_dim)
                    self._buf[:, :, b, :, :n].copy_(g.permute(1, 2, 3, 0, 4))
                else:
                    self._hist_append(b, idx, 0)
            self._committed[b] = n
        self._len = n
        for layer in self.layers:
            layer._len = n
            layer.dtype, layer.device, layer.batch_size = self.dtype, self.device, len(self.users)
            layer.is_initialized = True
            if self.mirror:
                self._set_views(layer, n)
            else:
                layer.keys, layer.values = self._gather(layer.layer_idx, n)

    # ------------------------------------------------------------ update
    def _update(self, layer: KVPoolLayer, k: torch.Tensor, v: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        if not layer.is_initialized:
            self._init_layer(layer, k)
        elif self._closed:
            self._check_open()
        if k.dtype != self.dtype:
            raise TypeError(f"K/V of {k.dtype}, the pool holds {self.dtype}")
        l, t0, n = layer.layer_idx, layer._len, k.shape[2]
        t1 = t0 + n
        if l == 0:
            self._begin_step(t0, n)
        elif self.layers[0]._len != t1:
            raise RuntimeError(f"KVPoolCache: layer {l} updated with {n} tokens at {t0}, "
                               f"layer 0 holds {self.layers[0]._len}: layers update in turn")
        if self.mirror:
            kb, vb = layer._kb, layer._vb
            kb[:, :, t0:t1].copy_(k)
            vb[:, :, t0:t1].copy_(v)
            layer.keys = kb[:, :, :t1]
            layer.values = vb[:, :, :t1]
        else:   # straight into the pages (through the library), then read back
            for b in range(len(self.users)):
                self._leases[b].append_layer(l, k[b].transpose(0, 1), v[b].transpose(0, 1),
                                             first=t0 - self._lease_base[b])
            layer.keys, layer.values = self._gather(l, t1)
        layer._len = t1
        if l == self.num_layers - 1:
            self._len = t1
            self._end_step(t0, n)
        return layer.keys, layer.values

    def _gather(self, l: int, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        ks, vs = [], []
        for b in range(len(self.users)):
            h = self._hist_idx[b]
            ks.append(self._rows.index_select(0, h[:n, l, 0]).transpose(0, 1))
            vs.append(self._rows.index_select(0, h[:n, l, 1]).transpose(0, 1))
        return torch.stack(ks), torch.stack(vs)

    def _begin_step(self, t0: int, n: int) -> None:
        """Layer 0 starts a forward of n tokens at t0: every layer must have
        finished the previous one; room in the mirror; write="through": each
        row's lease has slots for [t0, t0 + n), else the full one is
        committed and the next prepared."""
        if self.layers[-1]._len != t0:
            raise RuntimeError("KVPoolCache: a forward began before every layer had "
                               "the previous tokens (layers must update 0..L-1 in turn)")
        if self.mirror and (self._buf is None or t0 + n > self._buf.shape[4]):
            self._grow(t0 + n)
        if self.write != "through":
            return
        for b, u in enumerate(self.users):
            lease = self._leases[b]
            if lease is not None and t0 + n - self._lease_base[b] <= lease.n_new:
                continue
            if lease is not None:
                self._end_lease(b)
            lease = self.client.prepare(u, t0, max(n, self.reserve))
            self._leases[b], self._lease_base[b] = lease, t0
            if not self.mirror:   # where attention reads them back from
                self._hist_append(b, self._rows_of(lease, lease.len, lease.n_new), t0)

    def _end_step(self, t0: int, n: int) -> None:
        """The last layer is done with tokens [t0, t0 + n)."""
        if self.write == "through":
            for b, lease in enumerate(self._leases):
                if self.mirror:   # every layer's K and V of the step, one append
                    lease.append(self._step_kv(b, t0, n), first=t0 - self._lease_base[b])
                if self._len - self._lease_base[b] >= lease.n_new:
                    self._end_lease(b)
        elif n > 1 or self._len - min(self._committed) >= self.flush_every:
            for b in range(len(self.users)):    # a prefill is written at once
                self._write_behind(b)

    def _step_kv(self, b: int, t0: int, n: int) -> torch.Tensor:
        """Row b's tokens [t0, t0 + n) of the mirror as kvp_append reads
        them: [n, layers, 2, kv_heads, head_dim], contiguous (a copy)."""
        return self._buf[:, :, b, :, t0:t0 + n].permute(3, 0, 1, 2, 4).contiguous()

    def _end_lease(self, b: int) -> int:
        lease = self._leases[b]
        if lease is None:
            return 0
        n = self._len - self._lease_base[b]
        try:
            if n:
                lease.commit(n)   # waits for this stream's writes first (cuda)
                self._committed[b] = self._lease_base[b] + n
        finally:
            lease.release()
            self._leases[b] = None
        return n

    def _write_behind(self, b: int) -> int:
        c0 = self._committed[b]
        n = self._len - c0
        if n <= 0:
            return 0
        with self.client.prepare(self.users[b], c0, n) as lease:
            lease.append(self._step_kv(b, c0, n))
            lease.commit(n)
        self._committed[b] = c0 + n
        return n


def cached_length(client: "_client.Client", user: int) -> int:
    """Tokens of ``user``'s kvpool history (0: none), what a KVPoolCache on
    it would report as get_seq_length()."""
    i = client.info(user)
    return i.start + i.len if i.len else 0


def load_kv(client: "_client.Client", user: int
            ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Read ``user``'s cached K/V back from the pages: per layer ``(K, V)``
    as ``[1, kv_heads, tokens, head_dim]`` tensors on the pool's device
    (copies; the pages are pinned while they are read). What a
    DynamicCache's ``layers[i].keys`` / ``.values`` hold for the same tokens."""
    i = client.info(user)
    if not i.len:
        return []
    L = client.layout
    H, D, P, nl = L["kv_heads"], L["head_dim"], L["page_tokens"], L["layers"]
    rows = client.tier().view(-1, H * D)
    with client.prepare(user, i.start + i.len, 0) as lease:
        n = lease.len
        idx = _rows(lease, 0, n, nl, P).view(-1).to(rows.device)
        g = rows.index_select(0, idx).view(n, nl, 2, H, D)
    return [(g[:, l, 0].transpose(0, 1).unsqueeze(0).contiguous(),
             g[:, l, 1].transpose(0, 1).unsqueeze(0).contiguous()) for l in range(nl)]


def _rows(lease: Any, first: int, n: int, layers: int, P: int) -> torch.Tensor:
    """[n, layers, 2] int64 (CPU): the device tier's rows (one token's K or
    V of one layer, [kv_heads, head_dim]) of history positions [first,
    first + n) of a lease's page table. The tier is [frames, layers, 2,
    page_tokens, kv_heads, head_dim], so the row of (frame f, layer l, kv,
    slot s) is ((f * layers + l) * 2 + kv) * page_tokens + s. Token-major:
    [n, layers, 2], what the reads gather."""
    table = torch.frombuffer(bytearray(lease._table), dtype=torch.int32).to(torch.int64)
    pos = torch.arange(first, first + n, dtype=torch.int64)
    base = table[pos // P] * (layers * 2 * P) + pos % P                       # [n]
    off = torch.arange(layers * 2, dtype=torch.int64).view(1, layers, 2) * P  # [1, layers, 2]
    return base.view(n, 1, 1) + off
