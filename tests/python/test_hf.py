# SPDX-License-Identifier: MIT
"""kvpool.hf on the CPU (shm backend), without transformers: the Cache is
driven through a minimal stand-in of transformers 5's cache protocol
(Cache / CacheLayerMixin / DynamicLayer, as in transformers.cache_utils:
``update(k, v, layer_idx)``, ``get_seq_length()``, ``get_mask_sizes(q, layer)``)
by a small fp32 attention model written the way transformers' Llama calls
its cache (RoPE, GQA, a causal mask sized by get_mask_sizes). A DynamicCache
written the same way is the reference: greedy tokens equal, the K/V kvpool
hands back bit-identical, in one process and when a second process
continues the first one's history. The real transformers + a Llama model on
a GPU: test_hf_gpu.py and tools/hf_proof.py.

Run as a script (``test_hf.py child ...``) it is the first process of the
two-process test."""
from __future__ import annotations

import importlib
import json
import os
import sys
import types
from typing import Any, List, Optional, Tuple
from unittest import mock

import torch

try:
    import pytest
except ImportError:  # the child process needs no pytest
    pytest = None

N_LAYERS, KV_HEADS, HEAD_DIM, HEADS, HIDDEN, VOCAB = 2, 2, 16, 4, 64, 97
PROMPTS = [[5, 17, 3, 99 % VOCAB, 42, 8, 61], list(range(1, 40)), [7] * 3 + list(range(50, 70))]


# ---------------------------------------------------------------- the stand-in
FAKE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_fake")


def import_fake(version: Optional[str] = None) -> types.ModuleType:
    """The stand-in transformers (tests/python/hf_fake) and kvpool.hf bound
    to it; the caller restores sys.modules (mock.patch.dict)."""
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        del sys.modules[name]
    sys.modules.pop("kvpool.hf", None)
    sys.path.insert(0, FAKE_DIR)
    try:
        tf = importlib.import_module("transformers")
    finally:
        sys.path.remove(FAKE_DIR)
    assert getattr(tf, "FAKE", False), tf
    if version:
        tf.__version__ = version
    return importlib.import_module("kvpool.hf")


def make_model(tf: types.ModuleType) -> Any:
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
        num_hidden_layers=N_LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM))


def greedy(model: Any, ids: List[List[int]], cache: Any, steps: int) -> List[List[int]]:
    """model.generate, greedy: the new tokens."""
    out = model.generate(torch.tensor(ids), past_key_values=cache, max_new_tokens=steps)
    return out[:, len(ids[0]):].tolist()


def reference(model: Any, prompts: List[List[int]], steps: int, tf: types.ModuleType
              ) -> Tuple[List[List[int]], Any]:
    cache = tf.DynamicCache()
    return greedy(model, prompts, cache, steps), cache


# ---------------------------------------------------------------- the tests
if pytest is not None:
    from conftest import SRC, run_py  # noqa: E402

    @pytest.fixture
    def hf():
        import kvpool
        saved = getattr(kvpool, "hf", None)
        with mock.patch.dict(sys.modules):
            mod = import_fake()
            mod._tf = sys.modules["transformers"]
            torch.set_num_threads(1)
            yield mod
        if saved is not None:
            kvpool.hf = saved
        elif hasattr(kvpool, "hf"):
            del kvpool.hf

    def _kv_equal(hfmod, client, user, ref_cache, row: int = 0) -> None:
        got = hfmod.load_kv(client, user)
        assert len(got) == N_LAYERS
        for layer, (k, v) in enumerate(got):
            rk = ref_cache.layers[layer].keys[row:row + 1]
            rv = ref_cache.layers[layer].values[row:row + 1]
            assert k.shape == rk.shape and torch.equal(k, rk), f"layer {layer} K differs"
            assert torch.equal(v, rv), f"layer {layer} V differs"

    MODES = [dict(), dict(reserve=1), dict(reserve=5), dict(write="behind", flush_every=7),
             dict(mirror=False)]

    @pytest.mark.parametrize("mode", MODES, ids=lambda m: ",".join(f"{k}={v}" for k, v in
                                                                    m.items()) or "default")
    def test_greedy_and_kv_equal_dynamic_cache(hf, client, user, mode):
        model, base = make_model(hf._tf), 10_000_000 + user * 10
        for i, prompt in enumerate(PROMPTS):
            u = base + i
            want, ref = reference(model, [prompt], 12, hf._tf)
            with hf.KVPoolCache(client, u, config=model.config, **mode) as cache:
                got = greedy(model, [prompt], cache, 12)
                assert cache.get_seq_length() == len(prompt) + 11
                for layer in range(N_LAYERS):   # what attention read at the last step
                    assert torch.equal(cache.layers[layer].keys, ref.layers[layer].keys)
                    assert torch.equal(cache.layers[layer].values, ref.layers[layer].values)
            assert got == want
            assert client.info(u).len == len(prompt) + 11
            _kv_equal(hf, client, u, ref)

    def test_reopen_continues_history_in_process(hf, client, user):
        """A cache opened on a user continues it: the same tokens as one run."""
        model, prompt = make_model(hf._tf), PROMPTS[1]
        want, ref = reference(model, [prompt], 20, hf._tf)
        with hf.KVPoolCache(client, user, reserve=4) as cache:
            first = greedy(model, [prompt], cache, 8)[0]
        assert hf.cached_length(client, user) == len(prompt) + 7
        with hf.KVPoolCache(client, user) as cache:
            assert cache.get_seq_length() == len(prompt) + 7
            rest = greedy(model, [prompt + first], cache, 12)[0]
        assert first + rest == want[0]
        _kv_equal(hf, client, user, ref)

    def test_second_process_continues_first(hf, daemon, client, user):
        model, prompt = make_model(hf._tf), PROMPTS[2]
        want, ref = reference(model, [prompt], 16, hf._tf)
        r = run_py(__file__, "child", str(user), json.dumps(prompt), "6", env=daemon.env())
        first = json.loads(r.stdout.strip().splitlines()[-1])
        assert first == want[0][:6]
        with hf.KVPoolCache(client, user, config=model.config) as cache:
            assert cache.get_seq_length() == len(prompt) + 5
            rest = greedy(model, [prompt + first], cache, 10)[0]
        assert first + rest == want[0]
        _kv_equal(hf, client, user, ref)

    def test_batch_of_users(hf, client, user):
        model = make_model(hf._tf)
        prompts = [PROMPTS[0] + [1, 2], PROMPTS[0][::-1] + [3, 4]]
        users = [user, user + 50000]
        want, ref = reference(model, prompts, 9, hf._tf)
        with hf.KVPoolCache(client, users, reserve=3) as cache:
            assert greedy(model, prompts, cache, 9) == want
        for row, u in enumerate(users):
            _kv_equal(hf, client, u, ref, row=row)

    def test_uncommitted_tokens_and_errors(hf, client, user):
        import kvpool
        model, prompt = make_model(hf._tf), PROMPTS[0]
        cache = hf.KVPoolCache(client, user, reserve=64)
        greedy(model, [prompt], cache, 4)              # 10 tokens, in one open lease
        assert cache.get_seq_length() == len(prompt) + 3 and client.info(user).len == 0
        with pytest.raises(NotImplementedError):
            cache.reset()
        cache.crop(-2)                                  # not committed yet: fine
        assert cache.get_seq_length() == len(prompt) + 1
        assert cache.flush() == len(prompt) + 1 and client.info(user).len == len(prompt) + 1
        with pytest.raises(ValueError, match="append-only"):
            cache.crop(-1)
        # another writer of the same user in between: the next prepare refuses
        with client.prepare(user, len(prompt) + 1, 1) as lease:
            lease.append(torch.zeros(1, N_LAYERS, 2, KV_HEADS, HEAD_DIM))
            lease.commit()
        with pytest.raises(kvpool.OverlapError):
            greedy(model, [prompt + [1]], cache, 1)
        cache.close(flush=False)
        assert client.info(user).len == len(prompt) + 2 and client.info(user).leases == 0

    @pytest.mark.parametrize("mode", [dict(), dict(mirror=False)], ids=["mirror", "no-mirror"])
    def test_a_stale_lease_writes_nothing(hf, client, user, mode):
        """The cache writes its pages through libkvpool (Lease.append /
        append_layer), so the library's lease checks cover it: once its open
        lease is no longer this client's (released by id behind the cache's
        back, as a lease the daemon ended), the next step raises
        StaleLeaseError and not one byte of the pool changes."""
        import contextlib
        import kvpool
        model, prompt = make_model(hf._tf), PROMPTS[0]
        cache = hf.KVPoolCache(client, user, reserve=64, **mode)
        first = greedy(model, [prompt], cache, 2)[0]        # one open lease, room left
        lease = cache._leases[0]
        assert lease is not None and not lease.released
        kvpool.Client.release(client, lease.id)             # the library forgets it
        before = client.tier().clone()
        with pytest.raises(kvpool.StaleLeaseError):
            greedy(model, [prompt + first], cache, 1)
        assert torch.equal(client.tier(), before), "a stale lease wrote into the pool"
        with contextlib.suppress(kvpool.KvpoolError):
            cache.close(flush=False)
        assert client.info(user).len == 0

    def test_geometry_and_dtype_are_checked(hf, client, user):
        cfg = make_model(hf._tf).config
        cfg.num_key_value_heads = 4
        with pytest.raises(ValueError, match="layout"):
            hf.KVPoolCache(client, user, config=cfg)
        cfg.num_key_value_heads, cfg.layer_types = KV_HEADS, ["sliding_attention"] * 2
        with pytest.raises(ValueError, match="full-attention"):
            hf.KVPoolCache(client, user, config=cfg)
        cache = hf.KVPoolCache(client, user)
        k = torch.zeros(1, KV_HEADS, 3, HEAD_DIM, dtype=torch.float64)
        with pytest.raises(TypeError, match="bit for bit"):
            cache.update(k, k, 0)
        with pytest.raises(ValueError, match="kv_heads"):
            cache.update(torch.zeros(1, 3, 3, HEAD_DIM), torch.zeros(1, 3, 3, HEAD_DIM), 0)
        cache.close()
        with pytest.raises(ValueError, match="write"):
            hf.KVPoolCache(client, user, write="sideways")
        with pytest.raises(ValueError, match="through"):
            hf.KVPoolCache(client, user, write="behind", mirror=False)

    def test_needs_transformers_5(client):
        import kvpool
        saved = getattr(kvpool, "hf", None)
        with mock.patch.dict(sys.modules):
            with pytest.raises(ImportError, match=">= 5"):
                import_fake(version="4.57.1")
        if saved is not None:
            kvpool.hf = saved

    def test_proof_script_dry_run(daemon, tmp_path):
        """tools/hf_proof.py end to end on the CPU (shm backend, the stand-in
        transformers): its daemon, both child processes, the JSON and .md."""
        import subprocess
        env = daemon.env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in [FAKE_DIR, env.get("PYTHONPATH")] if p)
        out = tmp_path / "hf.json"
        r = subprocess.run([sys.executable, str(SRC / "tools" / "hf_proof.py"), "--dry-run",
                            "--out", str(out)], env=env, capture_output=True, text=True,
                           timeout=240)
        assert r.returncode == 0, r.stderr[-6000:]
        res = json.loads(out.read_text())
        assert res["tokens_identical"] is True and res["kv_bit_identical"] is True, r.stderr
        assert res["pages_equal_attention_kv"] is True and res["dynamic_cache_repeatable"] is True
        assert not res["errors"], res["errors"]
        assert set(res["timing"]["tokens_per_s"]) >= {"dynamic_cache", "kvpool"}
        assert res["decode_ratio"] > 0
        assert [t["second_opened_with_tokens"] for t in res["two_processes"]] == \
            [t["expected_cached"] for t in res["two_processes"]]
        assert "tokens_identical: True" in out.with_suffix(".md").read_text()


def _child(argv: List[str]) -> None:
    """The first process: generate `steps` tokens for the user, commit, exit."""
    user, prompt, steps = int(argv[0]), json.loads(argv[1]), int(argv[2])
    torch.set_num_threads(1)
    hf = import_fake()
    import kvpool
    model = make_model(sys.modules["transformers"])
    with kvpool.connect() as c, hf.KVPoolCache(c, user, reserve=4) as cache:
        out = greedy(model, [prompt], cache, steps)[0]
    print(json.dumps(out))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    _child(sys.argv[2:])
