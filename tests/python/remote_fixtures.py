# SPDX-License-Identifier: MIT
"""What tests/python/test_remote.py needs besides conftest's Daemon: the
Redis Cluster of tools/redis_cluster.py (a skip where redis-server or
redis-cli is missing), daemons on it, a daemon's /metrics, and the
TinyDecoder run over a kvpool sequence (seq_alloc / seq_extend: the prefix
cache's path)."""
from __future__ import annotations

import random
import sys
from typing import Dict, List

import pytest
import torch

from conftest import SRC, Daemon

sys.path.insert(0, str(SRC / "tools"))
import redis_cluster  # noqa: E402
from redis_cluster import RedisMissing  # noqa: E402


class RedisCluster(redis_cluster.RedisCluster):
    """tools/redis_cluster.py's, skipping the test where Redis is missing."""

    def __init__(self, n: int = 3) -> None:
        try:
            super().__init__(n)
        except RedisMissing as e:
            pytest.skip(f"{e}: the remote tier's Python tests need them")


def metrics(d: Daemon) -> Dict[str, float]:
    return redis_cluster.metrics(d.log)


def drain(d: Daemon, timeout: float = 10) -> Dict[str, float]:
    return redis_cluster.drain(d.log, timeout)


def remote_daemon(cluster: RedisCluster, **kw) -> Daemon:
    """A Daemon on the cluster; skips where kvpoold was built without the
    remote tier (no libhiredis-dev)."""
    try:
        return Daemon(extra=cluster.daemon_args(), **kw)
    except RuntimeError as e:
        if "hiredis" in str(e) or "remote tier" in str(e):
            pytest.skip(f"kvpoold has no remote tier: {e}")
        raise


def seq_generate(client, model, seq: int, prompt: List[int], steps: int) -> Dict[str, int]:
    """Greedy tokens of the TinyDecoder over a kvpool sequence: seq_alloc
    shares the prompt's cached full pages (the prefix cache, and the remote
    tier behind it), the model computes the rest over them, then each step
    extends the sequence by the token it feeds. Returns {'cached' (prompt
    tokens found), 'computed' (prompt tokens prefilled), 'tokens'}."""
    out: List[int] = []
    with client.seq_alloc(seq, prompt) as lease:
        cached = lease.len
        feed = prompt[cached:]
        logits = model(torch.tensor(feed), cached, lambda layer: lease.gather(layer, cached),
                       lambda layer, k, v: lease.append_layer(layer, k, v))
        lease.commit()
    n = len(prompt)
    for i in range(steps):
        nxt = int(logits[-1].argmax())
        out.append(nxt)
        if i == steps - 1:
            break
        with client.seq_extend(seq, 1, [nxt]) as lease:
            logits = model(torch.tensor([nxt]), n, lambda layer: lease.gather(layer, n),
                           lambda layer, k, v: lease.append_layer(layer, k, v))
            lease.commit()
        n += 1
    client.seq_free(seq)
    return {"cached": cached, "computed": len(prompt) - cached, "tokens": out}


def fill_prefix_cache(client, first_seq: int, prompts: int, tokens: int, base: int) -> None:
    """Publish `prompts` prompts of `tokens` made-up tokens (random K/V) and
    free them: their pages push older prefix pages out of the device tier
    (the eviction that writes those behind to the store)."""
    for i in range(prompts):
        rng = random.Random(base * 100003 + i)  # distinct prompts: distinct chains
        toks = [rng.randrange(256) for _ in range(tokens)]
        with client.seq_alloc(first_seq + i, toks) as lease:
            lease.append(torch.randn(lease.n_new, 2, 2, 2, 16))
            lease.commit()
        client.seq_free(first_seq + i)
