# SPDX-License-Identifier: MIT
"""kvpool.kvcache: seed 004's KV cache manager with prefix caching (a Go
``kvcache.KVCacheManager``) over kvpoold's sequences.

    import kvpool.kvcache as kvcache

    mgr = kvcache.KVCacheManager(kvcache.ManagerConfig(enable_caching=True))
    cached = mgr.allocate_request("req-1", prompt_ids)   # tokens already computed
    for layer in range(mgr.config().num_layers):
        for pos in range(cached, len(prompt_ids)):
            blk = mgr.get_block_for_write("req-1", layer, pos)
            blk.k[pos % mgr.block_size()] = k[layer][pos]  # [kv_dim] rows
            blk.v[pos % mgr.block_size()] = v[layer][pos]
    mgr.commit_tokens("req-1", len(prompt_ids) - cached)
    mgr.append_token("req-1", next_id)                     # then write, commit 1
    mgr.free_request("req-1")

Every method has the seed's name in snake_case and, as an alias, the seed's
own (``AllocateRequest``, ``GetRequest``, ``NumComputedTokens``, ...). What
differs from the seed, and why:

- A request is a kvpoold sequence (kvpool.h kvp_seq_alloc): its id is the
  request id when that is an int, else 63 bits of the BLAKE2b hash of the
  string (kvpoold's kv_cache log line names that number). Sequences are per
  tenant: two managers of one tenant share the prefix cache, and a request
  id one of them uses is taken for the other (``already exists``).
- The pool, its geometry and its block (page) size are kvpoold's: the
  config's num_layers, num_kv_heads, head_dim and block_size must match the
  daemon's --layout (0 takes the daemon's); device and gpu are kvpoold's too.
- enable_caching, max_seq_len and max_num_requests hold for this manager;
  kvpoold's per-tenant settings (kvpool.conf prefix_caching, max_seq_tokens,
  max_seqs) hold for every process of the tenant, and whichever is lower
  refuses first. A request of a manager with enable_caching=False neither
  finds nor publishes cached pages (a sequence without token ids).
- commit_tokens() may be called in parts, as the seed's; tokens must be
  written before they are committed (commit_tokens() past what is reserved
  raises). append_token() after the reserved tokens were committed.
- The request's BlockHashes are not shown: kvpoold salts them per tenant
  (kvpool.conf hash_salt). RequestKVCache.published_blocks says how many
  leading blocks are in the prefix cache instead. Block-level editing (seed
  000's future item) is not offered: blocks are edited through a request's
  write lease only.
- get_block_for_write() hands out views of the pool (no copy): on the cuda
  backend synchronise the stream that wrote them before commit_tokens().
"""
from __future__ import annotations

import errno as _errno
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from . import errors
from ._client import Client
from ._kvpool import SEQ_TOKEN_IDS

__all__ = ["ManagerConfig", "KVBlock", "RequestKVCache", "PrefixCacheStats",
           "KVCacheManager", "NewKVCacheManager"]

# The seed's defaults (NewKVCacheManager).
DEFAULT_MAX_SEQ_LEN = 8192
DEFAULT_MAX_NUM_REQUESTS = 16


@dataclass
class ManagerConfig:
    """The seed's ManagerConfig. 0 (or None) takes the default: the daemon's
    geometry and page size, max_seq_len 8192, max_num_requests 16."""
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    block_size: int = 0
    max_seq_len: int = 0
    device: Any = None
    gpu: int = 0
    enable_caching: bool = True
    max_num_requests: int = 0


@dataclass
class KVBlock:
    """One block (kvpool page) of one layer: ``k`` and ``v`` are views of the
    pool, ``[block_size, num_kv_heads * head_dim]`` each."""
    block_id: int
    layer: int
    k: Any
    v: Any


@dataclass
class RequestKVCache:
    """The seed's RequestKVCache, read back from kvpoold (kvp_seq_info)."""
    request_id: Any
    seq_id: int
    token_ids: List[int]
    # Per layer, the blocks the request holds: a kvpool page holds every
    # layer, so each layer lists the same frames.
    block_ids: List[List[int]]
    num_computed_tokens: int
    num_cached_tokens: int       # found in the prefix cache at allocate
    published_blocks: int        # leading blocks in the prefix cache
    reserved_tokens: int         # allocated, not committed yet


@dataclass
class PrefixCacheStats:
    """The tenant's prefix cache (kvp_stats, this pool)."""
    cached_blocks: int
    idle_blocks: int
    lookups: int
    lookup_tokens: int
    hit_tokens: int
    evicted_blocks: int
    requests: int
    request_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


@dataclass
class _Request:
    seq: int
    lease: Any                   # the open write lease, or None
    # The ids this manager gave (kvpoold keeps them only while the request
    # publishes: with enable_caching and up to the committed end).
    token_ids: List[int] = field(default_factory=list)


def _seq_id(request_id: Any) -> int:
    if isinstance(request_id, int) and not isinstance(request_id, bool):
        if not 0 <= request_id < 1 << 64:
            raise errors.InvalidArgumentError(
                f"request {request_id}: an int request id is a sequence id, 0 to 2**64-1")
        return request_id
    h = hashlib.blake2b(str(request_id).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


class KVCacheManager:
    """Seed 004's KVCacheManager over a kvpool Client (``client``, or one
    connected to ``socket`` that :meth:`free` closes)."""

    def __init__(self, cfg: Optional[ManagerConfig] = None,
                 client: Optional[Client] = None, *, socket: Optional[str] = None,
                 name: Optional[str] = None) -> None:
        if client is None:
            from . import connect
            client = connect(socket, name or "kvcache")
            self._own_client = True
        else:
            self._own_client = False
        self._client = client
        self._cfg = self._resolve(cfg or ManagerConfig(), client.layout)
        self._mu = threading.Lock()
        self._requests: Dict[Any, _Request] = {}

    @staticmethod
    def _resolve(cfg: ManagerConfig, L: Dict[str, Any]) -> ManagerConfig:
        want = {"num_layers": L["layers"], "num_kv_heads": L["kv_heads"],
                "head_dim": L["head_dim"], "block_size": L["page_tokens"]}
        key = {"num_layers": "layers", "num_kv_heads": "kv_heads",
               "head_dim": "head_dim", "block_size": "page_tokens"}
        out = ManagerConfig(**vars(cfg))
        for f, v in want.items():
            got = getattr(cfg, f)
            if got and got != v:
                raise errors.InvalidArgumentError(
                    f"ManagerConfig.{f} = {got} but kvpoold serves {key[f]}={v}; "
                    f"set {f} = {v} (or 0), or start kvpoold with --layout={key[f]}={got},...")
            setattr(out, f, v)
        if out.max_seq_len <= 0:
            out.max_seq_len = DEFAULT_MAX_SEQ_LEN
        if out.max_num_requests <= 0:
            out.max_num_requests = DEFAULT_MAX_NUM_REQUESTS
        return out

    # ------------------------------------------------------------ requests
    def allocate_request(self, request_id: Any, token_ids: List[int]) -> int:
        """Allocate blocks for a new request's prompt; returns how many of its
        tokens are already computed (found in the prefix cache; never all of
        them: the last token is left to compute)."""
        tokens = [int(t) for t in token_ids]
        with self._mu:
            if request_id in self._requests:
                raise errors.from_code(_errno.EEXIST, f"request {request_id} already exists")
            self._check_len(request_id, len(tokens))
            if len(self._requests) >= self._cfg.max_num_requests:
                raise errors.from_code(
                    _errno.ENOSPC, f"request {request_id}: {len(self._requests)} requests "
                    f"and max_num_requests is {self._cfg.max_num_requests}; free one "
                    f"(free_request) or raise ManagerConfig.max_num_requests")
            seq = _seq_id(request_id)
            if self._cfg.enable_caching:
                lease = self._client.seq_alloc(seq, tokens)
            else:
                # No ids: kvpoold neither looks the prompt up nor publishes it.
                lease = self._client.seq_create(seq, [], len(tokens))
            req = _Request(seq, lease, tokens)
            self._requests[request_id] = req
            return lease.len

    def _check_len(self, request_id: Any, n: int) -> None:
        if n > self._cfg.max_seq_len:
            raise errors.TooBigError(
                _errno.E2BIG, f"request {request_id}: {n} tokens but max_seq_len is "
                f"{self._cfg.max_seq_len}; shorten it or raise ManagerConfig.max_seq_len")

    def commit_tokens(self, request_id: Any, num_tokens: int) -> None:
        """Mark the next ``num_tokens`` allocated tokens computed (their K/V
        written); the blocks they fill go into the prefix cache. Unknown
        requests are ignored, as in the seed."""
        with self._mu:
            req = self._requests.get(request_id)
            if req is None or num_tokens == 0:
                return
            lease = req.lease
            have = 0 if lease is None or lease.committed else lease.n_new
            if not 0 < num_tokens <= have:
                raise errors.InvalidArgumentError(
                    f"request {request_id}: commit {num_tokens} tokens but {have} are "
                    f"allocated and not committed; allocate_request or append_token first")
            rest = have - num_tokens
            done = lease.len + num_tokens
            # The seed commits in parts. kvpoold gives the uncommitted slots
            # back at a commit, so K/V already written there is kept aside
            # and written again into the slots reserved anew.
            kept = self._gather(lease, done, rest) if rest else None
            lease.commit(num_tokens)
            if rest:
                req.lease = self._client.seq_extend(req.seq, rest,
                                                    req.token_ids[done:done + rest])
                req.lease.append(kept)

    def _gather(self, lease: Any, first: int, n: int) -> Any:
        """K/V of positions [first, first + n) through lease's page table:
        a copy, [n, layers, 2, kv_heads, head_dim]."""
        import torch
        P = self._cfg.block_size
        table = list(lease.indices)
        return torch.stack([self._client.page(table[p // P])[:, :, p % P]
                            for p in range(first, first + n)]).clone()

    def append_token(self, request_id: Any, token_id: int) -> None:
        """Add a generated token: a block more when the last one is full."""
        with self._mu:
            req = self._requests.get(request_id)
            if req is None:
                raise errors.NotFoundError(_errno.ENOENT, f"request {request_id} not found")
            info = self._client.seq_info(req.seq)
            self._check_len(request_id, info["tokens"] + 1)
            req.lease = self._client.seq_extend(req.seq, 1, [int(token_id)])
            req.token_ids.append(int(token_id))

    def free_request(self, request_id: Any) -> None:
        """Release every block of a request (cached ones stay cached)."""
        with self._mu:
            req = self._requests.pop(request_id, None)
            if req is not None:
                self._free(req)

    def _free(self, req: _Request) -> None:
        if req.lease is not None and not req.lease.released:
            req.lease.release()
        self._client.seq_free(req.seq)

    # ------------------------------------------------------------ reading back
    def _info(self, request_id: Any) -> Optional[Dict[str, Any]]:
        req = self._requests.get(request_id)
        return None if req is None else self._client.seq_info(req.seq)

    def get_request(self, request_id: Any) -> Optional[RequestKVCache]:
        """The request's state as kvpoold has it; None when unknown."""
        with self._mu:
            req = self._requests.get(request_id)
            if req is None:
                return None
            info = self._client.seq_info(req.seq)
            # kvpoold's ids when it has them, else the ones this manager gave.
            ids = (info["token_ids"] if info["flags"] & SEQ_TOKEN_IDS
                   else req.token_ids[:info["tokens"]])
            return RequestKVCache(
                request_id=request_id, seq_id=req.seq, token_ids=ids,
                block_ids=[list(info["pages"]) for _ in range(self._cfg.num_layers)],
                num_computed_tokens=info["computed"], num_cached_tokens=info["cached"],
                published_blocks=info["published"], reserved_tokens=info["n_new"])

    def num_computed_tokens(self, request_id: Any) -> int:
        """Tokens of the request whose K/V are computed (0 when unknown)."""
        with self._mu:
            info = self._info(request_id)
            return info["computed"] if info else 0

    def _block(self, frame: int, layer: int) -> KVBlock:
        t = self._client.page(frame)[layer]     # [2, P, heads, dim]
        P = self._cfg.block_size
        return KVBlock(frame, layer, t[0].reshape(P, -1), t[1].reshape(P, -1))

    def get_computed_blocks(self, request_id: Any, layer: int) -> List[KVBlock]:
        """The blocks of one layer whose tokens are all computed ([] when the
        request or the layer is unknown)."""
        with self._mu:
            info = self._info(request_id)
            if info is None or not 0 <= layer < self._cfg.num_layers:
                return []
            return [self._block(f, layer) for f in info["pages"][:info["computed_pages"]]]

    def get_block_for_write(self, request_id: Any, layer: int,
                            token_pos: int) -> Optional[KVBlock]:
        """The block token ``token_pos`` of the request goes in (slot
        ``token_pos % block_size``); None past its blocks or when unknown."""
        with self._mu:
            info = self._info(request_id)
            if info is None or not 0 <= layer < self._cfg.num_layers:
                return None
            i = token_pos // self._cfg.block_size
            if not 0 <= i < len(info["pages"]):
                return None
            return self._block(info["pages"][i], layer)

    # ------------------------------------------------------------ the pool
    def stats(self) -> PrefixCacheStats:
        s = self._client.stats()
        return PrefixCacheStats(
            cached_blocks=s["prefix_pages"], idle_blocks=s["prefix_idle_pages"],
            lookups=s["prefix_lookups"], lookup_tokens=s["prefix_lookup_tokens"],
            hit_tokens=s["prefix_hit_tokens"], evicted_blocks=s["prefix_evicted_pages"],
            requests=s["seqs"], request_blocks=s["seq_pages"])

    def usage(self) -> float:
        """Used fraction of the device tier (the tenant's, this pool)."""
        d = self._client.stats()["device"]
        return d["frames_used"] / d["frames_total"] if d["frames_total"] else 0.0

    def block_size(self) -> int:
        return self._cfg.block_size

    def config(self) -> ManagerConfig:
        return self._cfg

    def free(self) -> None:
        """Free every request of this manager (and close its own client)."""
        with self._mu:
            reqs, self._requests = list(self._requests.values()), {}
            for req in reqs:
                if not self._client.closed:
                    self._free(req)
            if self._own_client and not self._client.closed:
                self._client.close()

    def __enter__(self) -> "KVCacheManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    # The seed's names.
    AllocateRequest = allocate_request
    CommitTokens = commit_tokens
    AppendToken = append_token
    FreeRequest = free_request
    GetRequest = get_request
    NumComputedTokens = num_computed_tokens
    GetComputedBlocks = get_computed_blocks
    GetBlockForWrite = get_block_for_write
    Stats = stats
    Usage = usage
    BlockSize = block_size
    Config = config
    Free = free


def NewKVCacheManager(cfg: Optional[ManagerConfig] = None,
                      client: Optional[Client] = None, **kw: Any) -> KVCacheManager:
    """The seed's constructor: a KVCacheManager (errors raise)."""
    return KVCacheManager(cfg, client, **kw)
