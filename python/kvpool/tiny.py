# SPDX-License-Identifier: MIT
"""Two small models written in plain torch for the tests and examples, fp32,
fixed seed, with their KV written to and read from kvpool pages:

- TinyDecoder: a decoder-only LM (RoPE, GQA: 4 query heads over 2 KV heads,
  RMSNorm, SiLU MLP), greedy generation;
- TinyHSTU: an HSTU-shaped ranker (pointwise SiLU attention, causal over a
  user's item history, u * attention gating), new items each step.

Both run ``forward(x, pos0, past, on_kv)``: ``past(layer)`` gives K, V of the
cached positions [0, pos0) (or None), ``on_kv(layer, k, v)`` receives the new
tokens' K, V (post-RoPE); with past=None and pos0=0 it is a full recompute.
The geometry matches the tests' kvpoold layout (2 layers, 2 KV heads,
head_dim 16, fp32, 16-token pages).

For kvpool.llm.ChunkedLLM: TinyDecoderAdapter (a kvpool.llm.ModelAdapter:
batched forward whose attention is a kvpool.cascade.Plan), ByteTokenizer
(UTF-8 bytes 0-255, BOS 256, EOS 257) and tiny_llm_parts() (a 258-token
TinyDecoder, its adapter and the tokenizer).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
from torch import nn

from . import paged_attention as _paged

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16
# The kvpoold layout these models need (`kvpoold --layout=...`).
LAYOUT = "layers=2,kv_heads=2,head_dim=16,dtype=fp32,page_tokens=16"
PastFn = Optional[Callable[[int], Tuple[torch.Tensor, torch.Tensor]]]
KvFn = Optional[Callable[[int, torch.Tensor, torch.Tensor], None]]


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [n, heads, dim] at positions pos [n]."""
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, heads * HEAD_DIM, bias=False)
        self.k = nn.Linear(d, KV_HEADS * HEAD_DIM, bias=False)
        self.v = nn.Linear(d, KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(heads * HEAD_DIM, d, bias=False)
        self.norm2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)


class TinyDecoder(nn.Module):
    """Decoder-only LM: RoPE, GQA (4 query heads, 2 KV heads), softmax attention."""

    def __init__(self, vocab: int = 101, d: int = 64, heads: int = 4, seed: int = 0) -> None:
        super().__init__()
        g = torch.manual_seed(seed)
        del g
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.eval()

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, pos0: int = 0, past: PastFn = None,
                on_kv: KvFn = None) -> torch.Tensor:
        n = tokens.shape[0]
        pos = torch.arange(pos0, pos0 + n)
        x = self.embed(tokens)
        for layer, b in enumerate(self.blocks):
            h = b.norm1(x)
            q = rope(b.q(h).view(n, b.heads, HEAD_DIM), pos)
            k = rope(b.k(h).view(n, KV_HEADS, HEAD_DIM), pos)
            v = b.v(h).view(n, KV_HEADS, HEAD_DIM)
            if on_kv:
                on_kv(layer, k, v)
            if past is not None and pos0:
                pk, pv = past(layer)
                k, v = torch.cat([pk, k]), torch.cat([pv, v])
            rep = b.heads // KV_HEADS
            kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = torch.einsum("qhd,khd->hqk", q, kk) / HEAD_DIM ** 0.5
            total = kk.shape[0]
            mask = torch.arange(total)[None, :] > (torch.arange(n)[:, None] + pos0)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            out = torch.einsum("hqk,khd->qhd", att, vv).reshape(n, -1)
            x = x + b.o(out)
            x = x + b.down(torch.nn.functional.silu(b.up(b.norm2(x))))
        return self.head(self.norm(x))

    def greedy(self, prompt: List[int], steps: int) -> List[int]:
        """Greedy tokens recomputing everything from the prompt each step."""
        seq = list(prompt)
        for _ in range(steps):
            logits = self.forward(torch.tensor(seq))
            seq.append(int(logits[-1].argmax()))
        return seq[len(prompt):]


class TinyHSTU(nn.Module):
    """HSTU-shaped: pointwise SiLU attention (normalised by a fixed maximum
    sequence length, as HSTU does, so that a position's output never depends
    on later ones), causal over the user's item history, gated by u; one
    score per item."""

    MAX_SEQ = 256

    def __init__(self, items: int = 1000, d: int = 32, seed: int = 1) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(items, d)
        self.pos = nn.Embedding(4096, d)
        self.blocks = nn.ModuleList(_Block(d, KV_HEADS) for _ in range(LAYERS))
        self.u = nn.ModuleList(nn.Linear(d, KV_HEADS * HEAD_DIM, bias=False)
                               for _ in range(LAYERS))
        self.score = nn.Linear(d, 1, bias=False)
        self.eval()

    @torch.no_grad()
    def forward(self, items: torch.Tensor, pos0: int = 0, past: PastFn = None,
                on_kv: KvFn = None) -> torch.Tensor:
        n = items.shape[0]
        x = self.embed(items) + self.pos(torch.arange(pos0, pos0 + n))
        for layer, b in enumerate(self.blocks):
            h = b.norm1(x)
            q = b.q(h).view(n, KV_HEADS, HEAD_DIM)
            k = b.k(h).view(n, KV_HEADS, HEAD_DIM)
            v = b.v(h).view(n, KV_HEADS, HEAD_DIM)
            u = torch.nn.functional.silu(self.u[layer](h))
            if on_kv:
                on_kv(layer, k, v)
            if past is not None and pos0:
                pk, pv = past(layer)
                k, v = torch.cat([pk, k]), torch.cat([pv, v])
            total = k.shape[0]
            att = torch.nn.functional.silu(torch.einsum("qhd,khd->hqk", q, k)) / self.MAX_SEQ
            mask = torch.arange(total)[None, :] > (torch.arange(n)[:, None] + pos0)
            att = att.masked_fill(mask, 0.0)
            out = torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1) * u
            x = x + b.o(out)
            x = x + b.down(torch.nn.functional.silu(b.up(b.norm2(x))))
        return self.score(x).squeeze(-1)


def user_items(user: int, n: int, items: int = 1000) -> List[int]:
    """The first n items of a user's history: the same in every process."""
    g = torch.Generator().manual_seed(1_000_003 * user + 7)
    return torch.randint(0, items, (n,), generator=g).tolist()


def generate_cached(client, model: TinyDecoder, user: int, seq: List[int], steps: int,
                    append: str = "layer") -> List[int]:
    """Greedy tokens with the model's KV in kvpool, as user ``user``'s history.

    The cache holds the KV of every token of ``seq`` but the last (nothing
    cached: ``seq`` is the prompt and is prefilled). Each step prepares the
    new positions (one atomic kvpool prepare), reads the cached K, V through
    the lease's page table, writes the new ones and commits them.
    append="layer": each layer's K, V written as the layer computes them
    (Lease.append_layer, torch ops on the pool); "all": every layer at once
    after the forward (Lease.append, kvp_append).
    """
    import torch as _t

    cached = client.info(user).len
    if cached:
        if cached != len(seq) - 1:
            raise ValueError(f"user {user} caches {cached} tokens, the sequence has "
                             f"{len(seq)}: expected {len(seq) - 1}")
        feed = seq[-1:]
    else:
        feed = list(seq)
    out: List[int] = []
    for _ in range(steps):
        with client.prepare(user, cached, len(feed)) as lease:
            new_kv: List[Tuple[_t.Tensor, _t.Tensor]] = []

            def on_kv(layer: int, k: _t.Tensor, v: _t.Tensor) -> None:
                if append == "layer":
                    lease.append_layer(layer, k, v)
                else:
                    new_kv.append((k, v))

            logits = model(_t.tensor(feed), cached, lambda layer: lease.gather(layer, cached),
                           on_kv)
            if append != "layer":
                kv = _t.stack([_t.stack([k, v], 1) for k, v in new_kv], 1)  # [n, L, 2, H, D]
                lease.append(kv.contiguous())
            lease.commit()
        nxt = int(logits[-1].argmax())
        out.append(nxt)
        cached += len(feed)
        feed = [nxt]
    return out


class ByteTokenizer:
    """A byte-level tokenizer: token i < 256 is byte i of the UTF-8 text;
    256 is BOS, 257 EOS (added only with add_special_tokens=True / skipped by
    decode). No vocabulary file, nothing to download."""

    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 258

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id] + ids if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", "replace")


class TinyDecoderAdapter:
    """TinyDecoder as a kvpool.llm.ModelAdapter: the same weights and math,
    batched ([B, n] tokens at per-row positions), with each layer's attention
    done by the forward's kvpool.cascade.Plan (which stores the new K/V in
    pool pages and attends over the cached levels). Counts its forwards and
    the tokens they computed (``forwards``, ``tokens``, ``shapes``).

    paged: attend through :func:`kvpool.paged_attention.attend_plan` (the
    tables HFAdapter's fast path uses; the torch reference on the CPU, the
    Triton kernel on CUDA) wherever the plan stores its new tokens."""

    def __init__(self, model: TinyDecoder, eos_token_id: Optional[int] = None,
                 paged: bool = False) -> None:
        self.model = model
        self.paged = bool(paged)
        self.layers, self.kv_heads, self.head_dim = LAYERS, KV_HEADS, HEAD_DIM
        self.dtype = torch.float32
        self.device = torch.device("cpu")
        self.vocab_size = model.head.out_features
        self.eos_token_id = eos_token_id
        self.forwards = 0
        self.tokens = 0
        self.shapes: List[Tuple[int, int]] = []

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, plan) -> torch.Tensor:
        m = self.model
        B, n = tokens.shape
        self.forwards += 1
        self.tokens += B * n
        self.shapes.append((B, n))
        pos = positions.reshape(-1)
        x = m.embed(tokens)
        for layer, b in enumerate(m.blocks):
            h = b.norm1(x)
            q = rope(b.q(h).reshape(B * n, b.heads, HEAD_DIM), pos)
            k = rope(b.k(h).reshape(B * n, KV_HEADS, HEAD_DIM), pos)
            q = q.view(B, n, b.heads, HEAD_DIM).transpose(1, 2)
            k = k.view(B, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = b.v(h).view(B, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
            if self.paged and plan.store is not None:
                out = _paged.attend_plan(plan, layer, q, k, v)
            else:
                out = plan.attend(layer, q, k, v)
            out = out.reshape(B, n, b.heads * HEAD_DIM)
            x = x + b.o(out)
            x = x + b.down(torch.nn.functional.silu(b.up(b.norm2(x))))
        return m.head(m.norm(x[:, -1])).float()

    __call__ = forward


def tiny_llm_parts(seed: int = 0, paged: bool = False
                   ) -> Tuple[TinyDecoder, TinyDecoderAdapter, ByteTokenizer]:
    """A TinyDecoder over the byte tokenizer's 258 tokens, its adapter and
    the tokenizer: ChunkedLLM(model=adapter, tokenizer=tok). paged: the
    adapter attends through kvpool.paged_attention (see TinyDecoderAdapter)."""
    tok = ByteTokenizer()
    model = TinyDecoder(vocab=tok.vocab_size, seed=seed)
    return model, TinyDecoderAdapter(model, tok.eos_token_id, paged=paged), tok
