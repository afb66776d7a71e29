# SPDX-License-Identifier: MIT
"""A Llama-shaped decoder (RMSNorm, RoPE, GQA, SwiGLU) whose attention calls
``past_key_values.update(k, v, layer_idx)`` with [batch, kv_heads, new,
head_dim] K/V and sizes its causal mask with get_mask_sizes, and a greedy
generate() that, as transformers' does, feeds the tokens the cache does not
hold yet in one forward and then one token per forward."""
from __future__ import annotations

import math
import types
from typing import Any, List

import torch

from .cache_utils import DynamicCache


class LlamaConfig:
    def __init__(self, vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=None, head_dim=None, **kw: Any):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.intermediate_size, self.num_hidden_layers = intermediate_size, num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self._attn_implementation = "eager"
        self.__dict__.update(kw)


class LogitsProcessorList(list):
    def __call__(self, input_ids, scores):
        for p in self:
            scores = p(input_ids, scores)
        return scores


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = c = config
        self.generation_config = types.SimpleNamespace(eos_token_id=None, pad_token_id=None,
                                                       do_sample=False)
        H, KV, D, E = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size

        def w(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape) / math.sqrt(shape[-1]))
        self.emb = w(c.vocab_size, E)
        self.layers = torch.nn.ModuleList()
        for _ in range(c.num_hidden_layers):
            m = torch.nn.Module()
            m.q, m.k, m.v, m.o = w(H * D, E), w(KV * D, E), w(KV * D, E), w(E, H * D)
            m.up, m.gate, m.down = (w(c.intermediate_size, E), w(c.intermediate_size, E),
                                    w(E, c.intermediate_size))
            self.layers.append(m)
        self.head = w(c.vocab_size, E)

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def forward(self, ids: torch.Tensor, past_key_values: Any) -> torch.Tensor:
        c, cache = self.config, past_key_values
        H, KV, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        B, T = ids.shape
        past = cache.get_seq_length()
        pos = torch.arange(past, past + T, device=ids.device)
        x = self.emb[ids]
        for i, p in enumerate(self.layers):
            h = self._norm(x)
            q = (h @ p.q.T).view(B, T, H, D).transpose(1, 2)
            k = (h @ p.k.T).view(B, T, KV, D).transpose(1, 2)
            v = (h @ p.v.T).view(B, T, KV, D).transpose(1, 2)
            q, k = _rope(q, pos), _rope(k, pos)
            kv_len, kv_off = cache.get_mask_sizes(T, i)
            k, v = cache.update(k, v, i, {"cache_position": pos})
            assert k.shape[2] == kv_len, (k.shape, kv_len)
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
            s = q @ k.transpose(2, 3) / math.sqrt(D)
            kpos = torch.arange(kv_off, kv_off + kv_len, device=ids.device)
            s = s.masked_fill(kpos[None, :] > pos[:, None], float("-inf"))
            a = (s.float().softmax(-1).to(v.dtype) @ v).transpose(1, 2).reshape(B, T, H * D)
            x = x + a @ p.o.T
            h = self._norm(x)
            x = x + (torch.nn.functional.silu(h @ p.gate.T) * (h @ p.up.T)) @ p.down.T
        return self._norm(x) @ self.head.T

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask=None, past_key_values=None,
                 max_new_tokens: int = 20, do_sample: bool = False,
                 logits_processor: List[Any] = (), **kw: Any) -> torch.Tensor:
        cache = past_key_values if past_key_values is not None else DynamicCache()
        seq = input_ids
        inp = seq[:, cache.get_seq_length():]
        for _ in range(max_new_tokens):
            scores = self(inp, cache)[:, -1].float()
            for proc in logits_processor:
                scores = proc(seq, scores)
            nxt = scores.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            inp = nxt
        return seq
