#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The HSTU inference loop on kvpool.hstu.KVCacheManager.

A pipeline process ranks new items for a batch of users each step, as the
HSTU inference example does: get_batch_kvdata_info, prepare_kv_cache from
the cached end (one atomic kvpool prepare per user), get_cache_metadata,
per layer attention over the cached history read through the page table
(kv_indices / kv_indptr) plus the new items, append_kvcache, and
offload_kv_cache at the end of the step. Several such processes share one
kvpoold; a user's history written by one is continued by another.

--check compares every step's scores with a full recompute over the user's
whole item history (it must match: the cached K/V are the ones a recompute
makes).

    KVPOOL_SOCKET=/tmp/kvp/kvpoold.sock python3 examples/python/hstu_loop.py \\
        --users 0,1,2,3 --steps 3 --new 5 --check
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import kvpool  # noqa: E402
from kvpool.hstu import KVCacheManager, KVCacheMetadata  # noqa: E402
from tinymodels import LAYERS, TinyHSTU, user_items  # noqa: E402


def history(meta: KVCacheMetadata, b: int, layer: int, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """K, V of user b's first n page-table tokens, read through the page table."""
    P = meta.kv_cache_table[layer].shape[2]
    lo = int(meta.kv_indptr[b])
    pages = meta.kv_indices[lo:int(meta.kv_indptr[b + 1])].to(torch.int64)
    pos = torch.arange(n)
    table = meta.kv_cache_table[layer]
    return table[pages[pos // P], 0, pos % P], table[pages[pos // P], 1, pos % P]


def step(mgr: KVCacheManager, model: TinyHSTU, users: List[int], new: int,
         check: bool) -> float:
    starts, lens = mgr.get_batch_kvdata_info(users)
    begin = [int(s) + int(n) if int(s) >= 0 else 0 for s, n in zip(starts, lens)]
    mgr.prepare_kv_cache(users, begin, [new] * len(users))
    meta = mgr.get_cache_metadata(users)
    new_kv: Dict[int, List[Tuple[torch.Tensor, torch.Tensor]]] = {l: [] for l in range(LAYERS)}
    worst = 0.0
    for b, u in enumerate(users):
        cached = int(meta.total_history_lengths[b]) - new
        items = user_items(u, begin[b] + new)
        x = torch.tensor(items[begin[b]:])

        def on_kv(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
            new_kv[layer].append((k, v))

        scores = model(x, cached, lambda layer: history(meta, b, layer, cached), on_kv)
        if check:
            full = model(torch.tensor(items))[-new:]
            worst = max(worst, float((full - scores).abs().max()))
    for layer in range(LAYERS):
        k = torch.cat([kv[0] for kv in new_kv[layer]])
        v = torch.cat([kv[1] for kv in new_kv[layer]])
        mgr.append_kvcache(layer, k, v, meta)
    mgr.offload_kv_cache(users)
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", default=None)
    ap.add_argument("--users", default="0,1,2,3", help="comma-separated user ids")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--new", type=int, default=5, help="new items per user per step")
    ap.add_argument("--check", action="store_true", help="compare with a full recompute")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    args = ap.parse_args()
    users = [int(u) for u in args.users.split(",")]
    model = TinyHSTU()
    worst = 0.0
    with KVCacheManager(socket=args.socket) as mgr:
        for s in range(args.steps):
            worst = max(worst, step(mgr, model, users, args.new, args.check))
        starts, lens = mgr.get_batch_kvdata_info(users)
    print(f"users {users}: cached lengths {lens.tolist()}"
          + (f", max |cached - recompute| = {worst:.3g}" if args.check else ""))
    if args.check and worst > args.tolerance:
        print("MISMATCH", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except kvpool.ContinuityError as e:  # seed 002's message, as the example prints it
        print(f"ERROR: {e}", file=sys.stderr)
        sys.exit(2)
