# SPDX-License-Identifier: MIT
"""Seed 002 (the HSTU inference example's KV cache manager) as its users call
it: for each request, ``get_user_kvdata_info`` -> ``prepare_kv_cache`` ->
``append_kvcache`` for every layer, then the next request's
``get_user_kvdata_info`` -> ``prepare_kv_cache``; ``offload_kv_cache`` only
where the example offloads and ``evict_kv_cache`` to drop everything. In the
original, what was appended is cached: the next request's info must count
it, with no commit call the original does not have. Only the model is a CPU
stand-in (kvpool.tiny.TinyHSTU, the same geometry as the daemon's layout).

The seed's two error examples must read as the seed writes them, the
sentence first (kvpool's clause after it).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch

from kvpool import GapError, OverlapError
from kvpool.hstu import KVCacheManager, KVCacheMetadata
from kvpool.tiny import LAYERS, TinyHSTU, user_items


def _history(meta: KVCacheMetadata, b: int, layer: int, n: int
             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """K, V of user b's first n page-table tokens, through the page table."""
    table = meta.kv_cache_table[layer]
    P = table.shape[2]
    pages = meta.kv_indices[int(meta.kv_indptr[b]):int(meta.kv_indptr[b + 1])].to(torch.int64)
    pos = torch.arange(n)
    return table[pages[pos // P], 0, pos % P], table[pages[pos // P], 1, pos % P]


def _request(mgr: KVCacheManager, model: TinyHSTU, users: List[int], new: int) -> float:
    """One request of the original loop, no commit and no offload."""
    begin = []
    for u in users:                                   # the example asks per user
        start, length = mgr.get_user_kvdata_info(u)
        begin.append(start + length if start >= 0 else 0)
    mgr.prepare_kv_cache(users, begin, [new] * len(users))
    meta = mgr.get_cache_metadata(users)
    new_kv: Dict[int, List[Tuple[torch.Tensor, torch.Tensor]]] = {l: [] for l in range(LAYERS)}
    worst = 0.0
    for b, u in enumerate(users):
        cached = int(meta.total_history_lengths[b]) - new
        items = user_items(u, begin[b] + new)

        def on_kv(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
            new_kv[layer].append((k, v))

        scores = model(torch.tensor(items[begin[b]:]), cached,
                       lambda layer: _history(meta, b, layer, cached), on_kv)
        full = model(torch.tensor(items))[-new:]
        worst = max(worst, float((full - scores).abs().max()))
    for layer in range(LAYERS):                       # paged_kvcache_ops.append_kvcache
        mgr.append_kvcache(layer, torch.cat([kv[0] for kv in new_kv[layer]]),
                           torch.cat([kv[1] for kv in new_kv[layer]]), meta)
    return worst


def test_original_call_order_caches_what_was_appended(kd):
    model = TinyHSTU()
    users = [20001, 20002, 20003]
    with KVCacheManager(socket=kd.sock) as mgr:
        for step in range(4):
            assert _request(mgr, model, users, 5) < 1e-5
            for u in users:       # appended, so cached: no commit, no offload
                assert mgr.get_user_kvdata_info(u) == (0, 5 * (step + 1))
        # Another process sees it too, as the cache is shared.
        with KVCacheManager(socket=kd.sock) as other:
            assert other.get_user_kvdata_info(users[0]) == (0, 20)
        # Offload where the example offloads: both copies stay valid.
        assert mgr.offload_kv_cache(users) > 0
        assert _request(mgr, model, users, 3) < 1e-5
        assert mgr.get_user_kvdata_info(users[1]) == (0, 23)
        # evict_kv_cache: every user of the tenant goes.
        mgr.evict_kv_cache()
        assert mgr.get_user_kvdata_info(users[2]) == (-1, 0)


def test_a_request_prepared_but_not_appended_is_not_cached(kd):
    """Pages prepared but never written are no history: the next prepare of
    the user starts where its cache ends, and the unwritten tokens are gone."""
    with KVCacheManager(socket=kd.sock) as mgr:
        mgr.prepare_kv_cache([20011], [0], [8])
        assert mgr.get_user_kvdata_info(20011) == (-1, 0)
        mgr.prepare_kv_cache([20011], [0], [4])
        meta = mgr.get_cache_metadata([20011])
        for layer in range(LAYERS):
            kv = torch.ones(4, mgr.num_heads, mgr.head_dim, dtype=mgr.dtype)
            mgr.append_kvcache(layer, kv, kv, meta)
        assert mgr.get_user_kvdata_info(20011) == (0, 4)


def test_seed_error_examples(kd):
    with KVCacheManager(socket=kd.sock) as mgr:
        u = 20021
        mgr.prepare_kv_cache([u], [0], [10])
        meta = mgr.get_cache_metadata([u])
        for layer in range(LAYERS):
            kv = torch.zeros(10, mgr.num_heads, mgr.head_dim, dtype=mgr.dtype)
            mgr.append_kvcache(layer, kv, kv, meta)
        assert mgr.get_user_kvdata_info(u) == (0, 10)
        # [next input] {userId: 0, starting position: 10, length: 10}: acceptable
        # [next input] {userId: 0, starting position: 20, length: 10}
        with pytest.raises(GapError) as e:
            mgr.prepare_kv_cache([u], [20], [10])
        assert str(e.value).startswith(
            "The input sequence has missing tokens from 10 to 19 (both inclusive).")
        assert (e.value.first, e.value.last) == (10, 19)
        # [next input] {userId: 0, starting position: 5, length: 20}
        with pytest.raises(OverlapError) as e:
            mgr.prepare_kv_cache([u], [5], [20])
        assert str(e.value).startswith(
            "The input sequence has overlapping tokens from 5 to 9 (both inclusive).")
        assert (e.value.first, e.value.last) == (5, 9)
        mgr.prepare_kv_cache([u], [10], [10])             # the acceptable one
        assert mgr.get_user_kvdata_info(u) == (0, 10)     # prepared, not appended yet
