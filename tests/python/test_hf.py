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
import math
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
def fake_transformers() -> types.ModuleType:
    """Modules 'transformers' (version 5.0.0+fake) and
    'transformers.cache_utils' with the parts of the Cache protocol a
    decoder's attention uses."""
    cu = types.ModuleType("transformers.cache_utils")

    class CacheLayerMixin:
        is_compileable = False

        def __init__(self, **kwargs: Any) -> None:
            self.keys: Optional[torch.Tensor] = None
            self.values: Optional[torch.Tensor] = None
            self.is_initialized = False

    class DynamicLayer(CacheLayerMixin):
        is_sliding = False

        def lazy_initialization(self, key_states, value_states=None):
            self.dtype, self.device = key_states.dtype, key_states.device
            self.keys = key_states.new_zeros((key_states.shape[0], key_states.shape[1], 0,
                                              key_states.shape[3]))
            self.values = self.keys.clone()
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            return self.keys, self.values

        def get_seq_length(self):
            return 0 if self.keys is None else self.keys.shape[-2]

        def get_mask_sizes(self, query_length):
            return self.get_seq_length() + query_length, 0

    class Cache:
        def __init__(self, layers=None, layer_class_to_replicate=None, offloading=False,
                     offload_only_non_sliding=True):
            if (layers is None) == (layer_class_to_replicate is None):
                raise ValueError("exactly one of layers and layer_class_to_replicate")
            self.layers = layers if layers is not None else []
            self.layer_class_to_replicate = layer_class_to_replicate
            self.offloading = offloading

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if self.layer_class_to_replicate is not None:
                while len(self.layers) <= layer_idx:
                    self.layers.append(self.layer_class_to_replicate())
            return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

        def get_seq_length(self, layer_idx=0):
            return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

        def get_mask_sizes(self, query_length, layer_idx):
            if layer_idx >= len(self.layers):
                return query_length, 0
            return self.layers[layer_idx].get_mask_sizes(query_length)

        def __len__(self):
            return len(self.layers)

    class DynamicCache(Cache):
        def __init__(self, config=None):
            super().__init__(layer_class_to_replicate=DynamicLayer)

    for c in (CacheLayerMixin, DynamicLayer, Cache, DynamicCache):
        c.__module__ = cu.__name__
        setattr(cu, c.__name__, c)
    tf = types.ModuleType("transformers")
    tf.__version__ = "5.0.0+fake"
    tf.cache_utils = cu
    tf.DynamicCache = DynamicCache
    return tf


def import_hf(tf: types.ModuleType) -> types.ModuleType:
    """kvpool.hf bound to the stand-in (the caller restores sys.modules)."""
    sys.modules["transformers"] = tf
    sys.modules["transformers.cache_utils"] = tf.cache_utils
    sys.modules.pop("kvpool.hf", None)
    return importlib.import_module("kvpool.hf")


# ---------------------------------------------------------------- the model
def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class TinyLM(torch.nn.Module):
    """A Llama-shaped decoder (RMSNorm, RoPE, GQA, SwiGLU), fp32, whose
    attention calls ``past_key_values.update(k, v, layer_idx)`` with K/V of
    shape [batch, kv_heads, new, head_dim] as transformers' Llama does."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(shape[-1]))
        self.emb = w(VOCAB, HIDDEN)
        self.layers = [dict(q=w(HEADS * HEAD_DIM, HIDDEN), k=w(KV_HEADS * HEAD_DIM, HIDDEN),
                            v=w(KV_HEADS * HEAD_DIM, HIDDEN), o=w(HIDDEN, HEADS * HEAD_DIM),
                            up=w(2 * HIDDEN, HIDDEN), gate=w(2 * HIDDEN, HIDDEN),
                            down=w(HIDDEN, 2 * HIDDEN)) for _ in range(N_LAYERS)]
        self.head = w(VOCAB, HIDDEN)

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def forward(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        B, T = ids.shape
        past = cache.get_seq_length()
        pos = torch.arange(past, past + T)
        x = self.emb[ids]
        for i, p in enumerate(self.layers):
            h = self._norm(x)
            q = (h @ p["q"].T).view(B, T, HEADS, HEAD_DIM).transpose(1, 2)
            k = (h @ p["k"].T).view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = (h @ p["v"].T).view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
            q, k = _rope(q, pos), _rope(k, pos)
            kv_len, kv_off = cache.get_mask_sizes(T, i)
            k, v = cache.update(k, v, i, {"cache_position": pos})
            assert k.shape[2] == kv_len, (k.shape, kv_len)
            rep = HEADS // KV_HEADS
            k = k.repeat_interleave(rep, 1)
            v = v.repeat_interleave(rep, 1)
            s = q @ k.transpose(2, 3) / math.sqrt(HEAD_DIM)
            kpos = torch.arange(kv_off, kv_off + kv_len)
            s = s.masked_fill(kpos[None, :] > pos[:, None], float("-inf"))
            a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, HEADS * HEAD_DIM)
            x = x + a @ p["o"].T
            h = self._norm(x)
            x = x + (torch.nn.functional.silu(h @ p["gate"].T) * (h @ p["up"].T)) @ p["down"].T
        return self._norm(x) @ self.head.T


@torch.no_grad()
def greedy(model: TinyLM, ids: List[List[int]], cache: Any, steps: int) -> List[List[int]]:
    """transformers' generate loop, greedy: the tokens the cache does not hold
    yet in one forward, then one token per step. Returns the new tokens."""
    seq = torch.tensor(ids)
    out = []
    inp = seq[:, cache.get_seq_length():]
    for _ in range(steps):
        nxt = model(inp, cache)[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        inp = nxt
    return torch.cat(out, 1).tolist()


def reference(prompts: List[List[int]], steps: int, tf: types.ModuleType
              ) -> Tuple[List[List[int]], Any]:
    cache = tf.DynamicCache()
    return greedy(TinyLM(), prompts, cache, steps), cache


# ---------------------------------------------------------------- the tests
if pytest is not None:
    from conftest import run_py  # noqa: E402

    @pytest.fixture
    def hf():
        tf = fake_transformers()
        with mock.patch.dict(sys.modules):
            mod = import_hf(tf)
            mod._tf = tf
            yield mod

    def _kv_equal(hfmod, client, user, ref_cache, n: Optional[int] = None, row: int = 0) -> None:
        got = hfmod.load_kv(client, user)
        assert len(got) == N_LAYERS
        for layer, (k, v) in enumerate(got):
            rk = ref_cache.layers[layer].keys[row:row + 1]
            rv = ref_cache.layers[layer].values[row:row + 1]
            if n is not None:
                rk, rv = rk[:, :, :n], rv[:, :, :n]
            assert k.shape == rk.shape and torch.equal(k, rk), f"layer {layer} K differs"
            assert torch.equal(v, rv), f"layer {layer} V differs"

    MODES = [dict(), dict(reserve=1), dict(reserve=5), dict(write="behind", flush_every=7),
             dict(mirror=False)]

    @pytest.mark.parametrize("mode", MODES, ids=lambda m: ",".join(f"{k}={v}" for k, v in
                                                                    m.items()) or "default")
    def test_greedy_and_kv_equal_dynamic_cache(hf, client, user, mode):
        torch.set_num_threads(1)
        model, base = TinyLM(), 10_000_000 + user * 10
        for i, prompt in enumerate(PROMPTS):
            user = base + i
            want, ref = reference([prompt], 12, hf._tf)
            with hf.KVPoolCache(client, user, **mode) as cache:
                got = greedy(model, [prompt], cache, 12)
                assert cache.get_seq_length() == len(prompt) + 11
                for layer in range(N_LAYERS):   # what attention read last step
                    assert torch.equal(cache.layers[layer].keys, ref.layers[layer].keys)
                    assert torch.equal(cache.layers[layer].values, ref.layers[layer].values)
            assert got == want
            assert client.info(user).len == len(prompt) + 11
            _kv_equal(hf, client, user, ref)

    def test_reopen_continues_history_in_process(hf, client, user):
        """A cache opened on a user continues it: the same tokens as one run."""
        torch.set_num_threads(1)
        model, prompt = TinyLM(), PROMPTS[1]
        want, ref = reference([prompt], 20, hf._tf)
        with hf.KVPoolCache(client, user, reserve=4) as cache:
            first = greedy(model, [prompt], cache, 8)[0]
        assert hf.cached_length(client, user) == len(prompt) + 7
        with hf.KVPoolCache(client, user) as cache:
            assert cache.get_seq_length() == len(prompt) + 7
            rest = greedy(model, [prompt + first], cache, 12)[0]
        assert first + rest == want[0]
        _kv_equal(hf, client, user, ref)

    def test_second_process_continues_first(hf, daemon, client, user):
        torch.set_num_threads(1)
        prompt = PROMPTS[2]
        want, ref = reference([prompt], 16, hf._tf)
        r = run_py(__file__, "child", str(user), json.dumps(prompt), "6", env=daemon.env())
        first = json.loads(r.stdout.strip().splitlines()[-1])
        assert first == want[0][:6]
        with hf.KVPoolCache(client, user, config=_Cfg()) as cache:
            assert cache.get_seq_length() == len(prompt) + 5
            rest = greedy(TinyLM(), [prompt + first], cache, 10)[0]
        assert first + rest == want[0]
        _kv_equal(hf, client, user, ref)

    def test_batch_of_users(hf, client, user):
        torch.set_num_threads(1)
        prompts = [PROMPTS[0] + [1, 2], PROMPTS[0][::-1] + [3, 4]]
        users = [user, user + 50000]
        want, ref = reference(prompts, 9, hf._tf)
        with hf.KVPoolCache(client, users, reserve=3) as cache:
            assert greedy(TinyLM(), prompts, cache, 9) == want
        for row, u in enumerate(users):
            _kv_equal(hf, client, u, ref, row=row)

    def test_uncommitted_tokens_and_errors(hf, client, user):
        torch.set_num_threads(1)
        model, prompt = TinyLM(), PROMPTS[0]
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
        import kvpool
        with pytest.raises(kvpool.OverlapError):
            greedy(model, [prompt + [1]], cache, 1)
        cache.close(flush=False)
        # a closed-without-flush cache gave its slots back
        assert client.info(user).len == len(prompt) + 2 and client.info(user).leases == 0

    def test_geometry_and_dtype_are_checked(hf, client, user):
        with pytest.raises(ValueError, match="layout"):
            hf.KVPoolCache(client, user, config=_Cfg(num_key_value_heads=4))
        with pytest.raises(ValueError, match="sliding"):
            hf.KVPoolCache(client, user, config=_Cfg(layer_types=["sliding_attention"] * 2))
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
        tf = fake_transformers()
        tf.__version__ = "4.57.1"
        with mock.patch.dict(sys.modules):
            with pytest.raises(ImportError, match=">= 5"):
                import_hf(tf)


class _Cfg:
    """A config's fields KVPoolCache reads (transformers' LlamaConfig has them)."""

    def __init__(self, **kw: Any) -> None:
        self.num_hidden_layers, self.num_attention_heads = N_LAYERS, HEADS
        self.num_key_value_heads, self.head_dim, self.hidden_size = KV_HEADS, HEAD_DIM, HIDDEN
        self.__dict__.update(kw)


def _child(argv: List[str]) -> None:
    """The first process: generate `steps` tokens for the user, commit, exit."""
    user, prompt, steps = int(argv[0]), json.loads(argv[1]), int(argv[2])
    torch.set_num_threads(1)
    import_hf(fake_transformers())
    import kvpool
    import kvpool.hf
    with kvpool.connect() as c, kvpool.hf.KVPoolCache(c, user, reserve=4) as cache:
        out = greedy(TinyLM(), [prompt], cache, steps)[0]
    print(json.dumps(out))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _child(sys.argv[2:])
