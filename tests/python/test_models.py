# SPDX-License-Identifier: MIT
"""Real models with their KV in kvpool: a small torch decoder (RoPE, GQA,
fp32, fixed seed) generates the same greedy tokens from cached KV as from a
recompute, in one process and across two; an HSTU-shaped ranker through
kvpool.hstu.KVCacheManager gives the same scores from cached KV as from a
full recompute, in one process and in several pipeline processes that
continue each other's users. (The examples under examples/python are what
the multi-process tests run.)"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kvpool
from conftest import SRC, run_py
from tinymodels import TinyDecoder, TinyHSTU, generate_cached

EXAMPLES = SRC / "examples" / "python"
PROMPT = [5, 17, 3, 99, 42, 8, 61, 23, 77, 12, 30, 44, 2, 90, 15, 66, 71, 9, 33]


@pytest.mark.parametrize("append", ["layer", "all"])
def test_decoder_greedy_from_kvpool_equals_recompute(client, user, append):
    model = TinyDecoder(seed=0)
    got = generate_cached(client, model, user, PROMPT, 12, append=append)
    assert got == model.greedy(PROMPT, 12)
    assert client.info(user).len == len(PROMPT) + 11  # the last token's KV comes next step


def test_decoder_cached_logits_match_recompute(client, user):
    """Not just argmax: the logits from cached K/V equal a full forward's."""
    model = TinyDecoder(seed=0)
    seq = PROMPT + generate_cached(client, model, user, PROMPT, 3)
    n = client.info(user).len
    with client.prepare(user, n, 1) as lease:
        cached = model(torch.tensor(seq[-1:]), n, lambda layer: lease.gather(layer, n))
    full = model(torch.tensor(seq))
    assert torch.allclose(cached[-1], full[-1], atol=1e-5, rtol=0)


def test_decoder_two_processes_share_one_history(daemon):
    r = run_py(str(EXAMPLES / "two_processes.py"), "--steps", "6", "--user", "909",
               env=daemon.env(), timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "identical", r.stdout


def test_hstu_manager_matches_full_recompute(daemon):
    sys.path.insert(0, str(EXAMPLES))
    import hstu_loop
    model = TinyHSTU()
    with kvpool.hstu.KVCacheManager(socket=daemon.sock) as mgr:
        users = [5001, 5002, 5003]
        assert mgr.get_user_kvdata_info(5001) == (-1, 0)
        for _ in range(3):
            assert hstu_loop.step(mgr, model, users, 7, check=True) < 1e-5
        starts, lens = mgr.get_batch_kvdata_info(users)
        assert starts.tolist() == [0, 0, 0] and lens.tolist() == [21, 21, 21]
        assert starts.dtype == torch.int32
        assert mgr.get_kvcache_table(1).shape[1:] == (2, 16, 2, 16)


def test_hstu_manager_metadata_and_seed_errors(daemon):
    with kvpool.hstu.KVCacheManager(socket=daemon.sock) as mgr:
        mgr.prepare_kv_cache([6001, 6002], [0, 0], [10, 20])
        meta = mgr.get_cache_metadata([6001, 6002])
        assert meta.kv_indptr.tolist() == [0, 1, 3] and meta.kv_indices.dtype == torch.int32
        assert meta.kv_last_page_len.tolist() == [10, 4]
        assert meta.total_history_lengths.tolist() == [10, 20]
        assert meta.total_history_offsets.tolist() == [0, 10, 30]
        assert meta.new_history_nnz == 30 and meta.batch_indices.tolist() == [0] * 10 + [1] * 20
        assert meta.position.tolist() == list(range(10)) + list(range(20))
        k = torch.randn(30, 2, 16)
        for layer in range(2):
            mgr.append_kvcache(layer, k, -k, meta)
        mgr.commit_kv_cache()
        assert mgr.get_user_kvdata_info(6001) == (0, 10)
        # Seed 002's examples, word for word, and nothing changes.
        with pytest.raises(kvpool.GapError) as e:
            mgr.prepare_kv_cache([6001], [20], [10])
        assert "The input sequence has missing tokens from 10 to 19 (both inclusive)" in str(e.value)
        with pytest.raises(kvpool.OverlapError) as e:
            mgr.prepare_kv_cache([6002, 6001], [20, 5], [1, 20])
        assert "The input sequence has overlapping tokens from 5 to 9 (both inclusive)" \
            in str(e.value)
        assert mgr.get_user_kvdata_info(6002) == (0, 20)  # its prepare was undone
        assert mgr.client.info(6002).leases == 0
        assert mgr.offload_kv_cache([6001, 6002]) == 3
        assert mgr.evict_kv_cache([6001]) >= 1
        assert mgr.get_user_kvdata_info(6001) == (-1, 0)
        mgr.evict_kv_cache()
        assert mgr.get_user_kvdata_info(6002) == (-1, 0)


def test_hstu_pipelines_continue_each_others_users(daemon):
    """Three pipeline processes on disjoint users, then three more, each taking
    users another one wrote: every step's scores equal a full recompute."""
    groups = ["7001,7002,7003", "7004,7005,7006", "7007,7008,7009"]
    env = daemon.env()
    env["PYTHONPATH"] = ":".join(p for p in [env.get("PYTHONPATH", ""), str(EXAMPLES)] if p)

    def phase(sets):
        procs = [subprocess.Popen([sys.executable, str(EXAMPLES / "hstu_loop.py"), "--users", s,
                                   "--steps", "2", "--new", "6", "--check"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for s in sets]
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, out + err
        return [o for o, _ in outs]

    phase(groups)
    outs = phase(groups[1:] + groups[:1])
    for out in outs:
        assert "cached lengths [24, 24, 24]" in out, out
