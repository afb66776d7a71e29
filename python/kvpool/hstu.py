# SPDX-License-Identifier: MIT
"""A drop-in for the HSTU inference example's GPU KV-cache manager, on kvpool.

The HSTU example (NVIDIA recsys-examples, seed 002) keeps each user's history
KV in a paged cache owned by one process. This manager keeps it in kvpoold,
so several pipeline processes share one cache, and makes the example's
``get_user_kvdata_info`` + ``prepare_kv_cache`` pair one atomic kvpool
``prepare`` per user (the ordering rule of seed 002 then holds across
processes). The loop::

    mgr = kvpool.hstu.KVCacheManager()                  # $KVPOOL_SOCKET
    starts, lengths = mgr.get_batch_kvdata_info(user_ids)
    mgr.prepare_kv_cache(user_ids, starts + lengths, new_lengths)  # GapError/OverlapError
    meta = mgr.get_cache_metadata(user_ids)             # kv_indices, kv_indptr, ...
    for layer in range(mgr.num_layers):
        ...                                             # attention over get_kvcache_table(layer)
        mgr.append_kvcache(layer, k_new, v_new, meta)   # [nnz, heads, head_dim]
    # Appended to every layer, so cached (the example's semantics): the next
    # get_user_kvdata_info counts these tokens, in this process and others.
    mgr.offload_kv_cache(user_ids)                      # where the example offloads

Errors are seed 002's: ``GapError`` "The input sequence has missing tokens
from 10 to 19 (both inclusive)." and ``OverlapError`` "... overlapping tokens
from 5 to 9 (both inclusive).", with the range as ``first``/``last``.

Positions: kvpool counts a user's pages from the first cached token
(``start``), so ``total_history_lengths`` is the number of tokens in the page
table (cached + new), and ``kv_last_page_len`` is the lease's; they equal the
example's ``start + length`` figures when histories start at 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from . import _client
from .errors import KvpoolError

UserIds = Union[Sequence[int], torch.Tensor]

_BATCH = 128  # operations queued per submit (well under the ring's entries)


def _ids(user_ids: UserIds) -> List[int]:
    if isinstance(user_ids, torch.Tensor):
        return [int(u) for u in user_ids.tolist()]
    return [int(u) for u in user_ids]


@dataclass
class KVCacheMetadata:
    """The page tables of a batch (FlashInfer convention, int32 on the model's
    device) and where each new token goes.

    kv_indices / kv_indptr / kv_last_page_len: the users' pages, in batch order.
    total_history_lengths[b]: tokens in user b's page table (cached + new);
    total_history_offsets: their exclusive prefix sum ([batch + 1]).
    new_history_lengths / new_history_offsets: the new tokens per user.
    batch_indices[i] / position[i]: user and page-table position of new token i
    (tokens in batch order, as the model's jagged K/V hold them).
    kv_cache_table: every layer's paged cache [frames, 2, page_tokens, heads, dim].
    """

    kv_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    total_history_lengths: torch.Tensor
    total_history_offsets: torch.Tensor
    new_history_lengths: torch.Tensor
    new_history_offsets: torch.Tensor
    batch_indices: torch.Tensor
    position: torch.Tensor
    new_history_nnz: int
    kv_cache_table: List[torch.Tensor] = field(repr=False)
    user_ids: List[int] = field(default_factory=list)
    # Where new token i goes: frame and slot (int64, for torch indexing).
    append_frames: Optional[torch.Tensor] = field(default=None, repr=False)
    append_slots: Optional[torch.Tensor] = field(default=None, repr=False)


class KVCacheManager:
    """The HSTU example's KV-cache manager interface over kvpoold.

    client: a connected :class:`kvpool.Client` (default: ``kvpool.connect(socket)``).
    device: the model's device for the metadata tensors (default: the pool's).
    The geometry comes from the daemon's layout: ``num_layers``,
    ``num_heads`` (kv heads), ``head_dim``, ``page_size``, ``dtype``.
    One thread uses a manager at a time, as in the example; many processes
    may each have one on the same daemon.
    """

    def __init__(self, client: Optional[_client.Client] = None, *,
                 socket: Optional[str] = None,
                 device: Optional[Union[str, torch.device]] = None) -> None:
        from . import connect
        self._own = client is None
        self.client = client if client is not None else connect(socket, "kvpool.hstu")
        L = self.client.layout
        self.num_layers: int = L["layers"]
        self.num_heads: int = L["kv_heads"]
        self.head_dim: int = L["head_dim"]
        self.page_size: int = L["page_tokens"]
        self.dtype: torch.dtype = self.client.torch_dtype
        self.device = torch.device(device) if device is not None else self.client.device
        self._tables = self.client.kv_caches()
        self._leases: Dict[int, _client.Lease] = {}
        # The layers append_kvcache wrote for each pending lease: once every
        # layer has its tokens they are committed (what was appended is
        # cached, as in the example); a lease never written is no history.
        self._written: Dict[int, set] = {}

    # ------------------------------------------------------------ info
    def get_user_kvdata_info(self, user_id: int) -> Tuple[int, int]:
        """``(start, length)`` of the user's cached history: start is -1 when
        nothing is cached."""
        info = self.client.info(int(user_id))
        return (info.start if info.len else -1, info.len)

    def get_batch_kvdata_info(self, user_ids: UserIds) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(start, length)`` of every user as int32 CPU tensors (start -1 where
        nothing is cached); one round trip per batch of users."""
        ids = _ids(user_ids)
        starts, lens = [0] * len(ids), [0] * len(ids)
        c = self.client
        for b0 in range(0, len(ids), _BATCH):
            chunk = ids[b0:b0 + _BATCH]
            for i, u in enumerate(chunk):
                c.queue_info(u, b0 + i)
            c.submit()
            n, first_err = len(chunk), None
            while n:
                for cq in c.reap(min_complete=1):
                    n -= 1
                    if cq.error is not None:
                        first_err = first_err or cq.error
                    else:
                        starts[cq.tag] = cq.info.start if cq.info.len else -1
                        lens[cq.tag] = cq.info.len
            if first_err:
                raise first_err
        return (torch.tensor(starts, dtype=torch.int32),
                torch.tensor(lens, dtype=torch.int32))

    # ------------------------------------------------------------ prepare
    def prepare_kv_cache(self, user_ids: UserIds, user_start_pos: UserIds,
                         new_history_lengths: UserIds) -> None:
        """Allocate pages for each user's new tokens: one atomic kvpool prepare
        per user (continuity check, onload from the host tier, allocation with
        LRU eviction of unleased users, pinning). ``user_start_pos[b]`` must be
        the end of user b's cached history (any position when nothing is
        cached): otherwise GapError / OverlapError with seed 002's message.
        On any error the users prepared by this call are released again and
        the first error is raised. An earlier prepare of the same user whose
        tokens were not appended to every layer is released first: its
        tokens were never written, so they are not cached (appended ones
        were committed by append_kvcache already)."""
        ids = _ids(user_ids)
        starts = _ids(user_start_pos)
        news = _ids(new_history_lengths)
        if not len(ids) == len(starts) == len(news):
            raise ValueError("prepare_kv_cache: user_ids, user_start_pos and "
                             "new_history_lengths differ in length")
        if len(set(ids)) != len(ids):
            raise ValueError("prepare_kv_cache: a user appears twice in the batch")
        for u in ids:
            lease = self._leases.pop(u, None)
            self._written.pop(u, None)
            if lease is not None:
                lease.release()
        c = self.client
        got: Dict[int, _client.Lease] = {}
        first_err: Optional[BaseException] = None
        for b0 in range(0, len(ids), _BATCH):
            n = 0
            for b in range(b0, min(b0 + _BATCH, len(ids))):
                c.queue_prepare(ids[b], starts[b], news[b], b)
                n += 1
            c.submit()
            while n:
                for cq in c.reap(min_complete=1):
                    n -= 1
                    if cq.error is not None:
                        first_err = first_err or cq.error
                    else:
                        got[ids[cq.tag]] = cq.lease
            if first_err:
                break
        if first_err:
            for lease in got.values():
                lease.release()
            raise first_err
        self._leases.update(got)
        for u in got:
            self._written[u] = set()

    # ------------------------------------------------------------ metadata
    def get_cache_metadata(self, user_ids: UserIds) -> KVCacheMetadata:
        """The batch's page tables and new-token positions (see
        :class:`KVCacheMetadata`) for users prepared by prepare_kv_cache, as
        int32 tensors on the model's device."""
        ids = _ids(user_ids)
        missing = [u for u in ids if u not in self._leases]
        if missing:
            raise KeyError(f"get_cache_metadata: users {missing} were not prepared "
                           "(prepare_kv_cache first)")
        leases = [self._leases[u] for u in ids]
        P = self.page_size
        tables = [lease.kv_indices() for lease in leases]
        npages = torch.tensor([lease.npages for lease in leases], dtype=torch.int32)
        totals = torch.tensor([lease.len + lease.n_new for lease in leases], dtype=torch.int32)
        news = torch.tensor([lease.n_new for lease in leases], dtype=torch.int32)
        indptr = torch.zeros(len(ids) + 1, dtype=torch.int32)
        torch.cumsum(npages, 0, out=indptr[1:])
        offsets = torch.zeros(len(ids) + 1, dtype=torch.int32)
        torch.cumsum(totals, 0, out=offsets[1:])
        new_off = torch.zeros(len(ids) + 1, dtype=torch.int32)
        torch.cumsum(news, 0, out=new_off[1:])
        last = torch.tensor([lease.last_page_len for lease in leases], dtype=torch.int32)
        bidx = torch.repeat_interleave(torch.arange(len(ids), dtype=torch.int32),
                                       news.to(torch.int64))
        pos = torch.cat([torch.arange(lease.len, lease.len + lease.n_new, dtype=torch.int64)
                         for lease in leases]) if leases else torch.empty(0, dtype=torch.int64)
        frames = torch.cat([t.to(torch.int64)[
            torch.arange(lease.len, lease.len + lease.n_new, dtype=torch.int64) // P]
            for t, lease in zip(tables, leases)]) if leases else torch.empty(0, dtype=torch.int64)
        kv_indices = torch.cat(tables) if tables else torch.empty(0, dtype=torch.int32)
        dev = self.device
        return KVCacheMetadata(
            kv_indices=kv_indices.to(dev), kv_indptr=indptr.to(dev),
            kv_last_page_len=last.to(dev), total_history_lengths=totals.to(dev),
            total_history_offsets=offsets.to(dev), new_history_lengths=news.to(dev),
            new_history_offsets=new_off.to(dev), batch_indices=bidx.to(dev),
            position=pos.to(torch.int32).to(dev), new_history_nnz=int(news.sum()),
            kv_cache_table=self._tables, user_ids=ids,
            append_frames=frames.to(self._tables[0].device),
            append_slots=(pos % P).to(self._tables[0].device))

    def get_kvcache_table(self, layer_idx: int) -> torch.Tensor:
        """Layer ``layer_idx``'s paged cache, no copy: ``[frames, 2, page_size,
        num_heads, head_dim]`` (K at [:, 0], V at [:, 1]; NHD)."""
        return self._tables[layer_idx]

    # ------------------------------------------------------------ append
    def append_kvcache(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor,
                       kvcache_metadata: KVCacheMetadata) -> None:
        """Write one layer's K and V of the batch's new tokens (``[nnz, heads,
        head_dim]``, users in batch order, each user's tokens in order) into
        their pages through each user's lease (kvp_append_layer_async: a stale
        lease raises StaleLeaseError and writes nothing), on the current
        stream (the example's paged_kvcache_ops.append_kvcache). When a
        user's tokens have been appended to every layer they are committed
        (one queued commit per user, batched): cached, as in the example, so
        the next get_user_kvdata_info counts them, in any process."""
        m = kvcache_metadata
        if key.shape[0] != m.new_history_nnz or value.shape[0] != m.new_history_nnz:
            raise ValueError(f"append_kvcache: {key.shape[0]} keys / {value.shape[0]} "
                             f"values for {m.new_history_nnz} new tokens")
        for u in m.user_ids:
            lease = self._leases.get(u)
            if lease is None or lease.committed or lease.released:
                raise KvpoolError(0, f"append_kvcache: user {u} has no open lease "
                                     "(prepare_kv_cache first)")
        # Through libkvpool (kvp_append_layer_async, on the current stream
        # on cuda): the library's lease checks cover every write.
        at = 0
        done = []
        for u in m.user_ids:
            lease = self._leases[u]
            n = lease.n_new
            # A user with no new tokens (its history is all cached, only
            # candidates are scored) has nothing to write: an empty slice
            # is no tensor the library takes.
            if n:
                lease.append_layer(layer_idx, key[at:at + n], value[at:at + n])
            at += n
            written = self._written.setdefault(u, set())
            written.add(int(layer_idx))
            if len(written) == self.num_layers:
                done.append(u)
        if done:
            self.commit_kv_cache(done)

    # ------------------------------------------------------------ commit
    def commit_kv_cache(self, user_ids: Optional[UserIds] = None) -> None:
        """Make the prepared users' new tokens part of their histories and
        unpin them (commit + release in one queued operation per user).
        append_kvcache does it once a user's tokens are in every layer, and
        offload_kv_cache before it copies; call it yourself only to commit
        tokens you wrote another way (through the leases)."""
        ids = list(self._leases) if user_ids is None else \
            [u for u in _ids(user_ids) if u in self._leases]
        if not ids:
            return
        if self.client.cuda_device >= 0:
            _client._sync_device(self.client.cuda_device)
        c = self.client
        first_err: Optional[BaseException] = None
        for b0 in range(0, len(ids), _BATCH):
            chunk = ids[b0:b0 + _BATCH]
            for u in chunk:
                lease = self._leases.pop(u)
                self._written.pop(u, None)
                c.queue_commit(lease, lease.n_new, release=True, tag=u)
            c.submit()
            n = len(chunk)
            while n:
                for cq in c.reap(min_complete=1):
                    n -= 1
                    if cq.error is not None:
                        first_err = first_err or cq.error
        if first_err:
            raise first_err

    # ------------------------------------------------------------ offload / evict
    def offload_kv_cache(self, user_ids: UserIds) -> int:
        """Commit the users' pending tokens, then copy their device pages to the
        host tier (both copies stay valid). Returns the pages copied."""
        ids = _ids(user_ids)
        self.commit_kv_cache(ids)
        return sum(self.client.offload(u) for u in ids)

    def evict_kv_cache(self, user_ids: Optional[UserIds] = None) -> int:
        """Drop users' KV from every tier (None: all of this tenant's users,
        seed 002's evict). Pending leases are released (their new tokens are
        not committed) first; users another process holds leased are skipped.
        Returns the pages (users, for all) freed."""
        if user_ids is None:
            for lease in self._leases.values():
                lease.release()
            self._leases.clear()
            self._written.clear()
            return self.client.evict_tenant()
        ids = _ids(user_ids)
        for u in ids:
            lease = self._leases.pop(u, None)
            self._written.pop(u, None)
            if lease is not None:
                lease.release()
        return sum(self.client.evict(u) for u in ids)

    # ------------------------------------------------------------ misc
    def close(self) -> None:
        """Release pending leases (uncommitted tokens are dropped) and close the
        client when the manager made it."""
        for lease in self._leases.values():
            lease.release()
        self._leases.clear()
        self._written.clear()
        self._tables = []
        if self._own:
            self.client.close()

    def __enter__(self) -> "KVCacheManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
