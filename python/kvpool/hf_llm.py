# SPDX-License-Identifier: MIT
"""kvpool.hf_llm: a transformers causal LM as a :class:`kvpool.llm.ModelAdapter`.

    from transformers import AutoModelForCausalLM
    from kvpool.llm import ChunkedLLM
    llm = ChunkedLLM(model=AutoModelForCausalLM.from_pretrained(path), tokenizer=tok)

The model's own modules compute everything (embeddings, RoPE, projections,
norms, MLP, head); only attention is kvpool's. :class:`HFAdapter` registers
an attention implementation named ``"kvpool"`` with transformers'
``AttentionInterface`` and ``AttentionMaskInterface`` and switches the model
to it. During :meth:`HFAdapter.forward` the attention of every layer is the
forward's :class:`kvpool.cascade.Plan`, which stores the new tokens' K/V
(post-RoPE, the model's dtype, bit for bit) in pool pages, and then:

* a forward of several rows (a batch decoding a composition): the cascade,
  ``plan.attend(layer, q, k, v)``, level by level over the pages, merged by
  log-sum-exp -- a level shared by the rows is read once for all of them;
* a forward of one row (a chunk's prefill, one composition's decode): there
  is nothing to share, so the levels' pages are gathered in chain order,
  followed by the new tokens, and transformers' own SDPA attention runs over
  them with the mask transformers would build for a DynamicCache of that
  length: the same kernel on the same K/V, hence the same bits as
  DynamicCache with the same chunk boundaries (bf16 rounding depends on how
  attention is split, so only like for like is exact).

No transformers Cache is used (``use_cache=False``): the pool is the cache.

Outside a kvpool forward (no plan active on this thread) the registered
functions are transformers' own SDPA attention and mask, so the same model
object still runs ``model.generate()`` / DynamicCache references unchanged.

Families: any decoder whose attention modules call the attention interface
with ``(module, query [B, Hq, n, D], key, value [B, Hkv, n, D], mask,
scaling=...)`` and carry ``layer_idx`` -- Llama, Mistral, Qwen2, Qwen3,
Gemma (without sliding windows), Phi3 in transformers 5.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List, Optional

import torch

try:
    from transformers import AttentionInterface as _AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface as _AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask as _sdpa_mask
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as _sdpa_attention
except ImportError as _e:  # pragma: no cover - depends on the machine
    raise ImportError("kvpool.hf_llm needs HuggingFace transformers >= 5 with "
                      f"AttentionInterface and AttentionMaskInterface: {_e}") from _e

from .llm import ModelAdapter

__all__ = ["HFAdapter", "ATTN_NAME"]

ATTN_NAME = "kvpool"

_active = threading.local()


def _plan() -> Any:
    return getattr(_active, "plan", None)


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None,
               dropout: float = 0.0, **kwargs: Any):
    plan = _plan()
    if plan is None:
        return _sdpa_attention(module, query, key, value, attention_mask, scaling=scaling,
                               dropout=dropout, **kwargs)
    if kwargs.get("sliding_window") or getattr(module, "sliding_window", None):
        raise NotImplementedError("kvpool.hf_llm: sliding-window attention layers are not "
                                  "supported (every layer must attend to the whole chain)")
    layer = module.layer_idx
    if plan.rows != 1:
        return plan.attend(layer, query, key, value, scale=scaling), None
    plan.write(layer, key, value)
    flat = _flat(plan)
    k, v = flat.kv(plan.cache(layer), key, value)
    return _sdpa_attention(module, query, k, v, flat.mask, scaling=scaling, dropout=dropout,
                           **kwargs)


class _Flat:
    """One row's past levels as one gather per layer: every level's pages in
    chain order (``plan.levels``), each level's first ``length`` tokens, then
    the forward's new tokens; and the mask transformers' sdpa_mask makes for
    a DynamicCache holding that past (None where it would use is_causal or
    no mask: no past, or one new token)."""

    __slots__ = ("pages", "spans", "mask")

    def __init__(self, plan: Any) -> None:
        P = None
        pages, spans, at = [], [], 0
        for lv in plan.levels:
            P = lv.page_tokens
            n = int(lv.lengths[0])
            if n <= 0:
                continue
            need = -(-n // P)
            pages.append(lv.pages[0, :need])
            spans.append((at, need, n))
            at += need
        self.pages = torch.cat(pages).to(plan.device) if pages else None
        self.spans = spans
        past = sum(n for _, _, n in spans)
        n = plan.n
        self.mask = None
        if past and n > 1:
            i = torch.arange(n, device=plan.device)[:, None] + past
            j = torch.arange(past + n, device=plan.device)[None, :]
            self.mask = (j <= i)[None, None]

    def kv(self, cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        """K, V ``[1, Hkv, past + n, D]`` (contiguous, as DynamicCache holds
        them) from the pages of ``cache`` (one layer) and the new tokens."""
        if self.pages is None:
            return key, value
        kv = cache[self.pages]                       # [pages, 2, P, Hkv, D]: one gather
        H, D = kv.shape[-2], kv.shape[-1]
        ks, vs = [], []
        for at, need, n in self.spans:
            part = kv[at:at + need]
            ks.append(part[:, 0].reshape(-1, H, D)[:n].permute(1, 0, 2))
            vs.append(part[:, 1].reshape(-1, H, D)[:n].permute(1, 0, 2))
        ks.append(key[0])
        vs.append(value[0])
        return torch.cat(ks, dim=1)[None], torch.cat(vs, dim=1)[None]


def _flat(plan: Any) -> _Flat:
    f = getattr(plan, "_kvpool_flat", None)
    if f is None:
        f = _Flat(plan)
        plan._kvpool_flat = f
    return f


def _mask(*args: Any, **kwargs: Any):
    if _plan() is None:
        return _sdpa_mask(*args, **kwargs)
    return None


_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        _AttentionInterface.register(ATTN_NAME, _attention)
        _AttentionMaskInterface.register(ATTN_NAME, _mask)
        _registered = True


@contextlib.contextmanager
def _using(plan: Any) -> Iterator[None]:
    prev = _plan()
    _active.plan = plan
    try:
        yield
    finally:
        _active.plan = prev


def _text_config(cfg: Any) -> Any:
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


class HFAdapter(ModelAdapter):
    """A transformers ``*ForCausalLM`` (eval mode, any dtype/device) for
    :class:`kvpool.llm.ChunkedLLM`. The pool's layout must be the model's KV
    geometry: ``layers`` = num_hidden_layers, ``kv_heads`` =
    num_key_value_heads, ``head_dim``, and the model's dtype."""

    def __init__(self, model: Any) -> None:
        cfg = _text_config(model.config)
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) \
                and getattr(cfg, "layer_types", None) and \
                any(t != "full_attention" for t in cfg.layer_types):
            raise ValueError("kvpool.hf_llm: models with sliding-window layers are not supported")
        self.model = model.eval()
        self.layers = int(cfg.num_hidden_layers)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        p = next(model.parameters())
        self.dtype = p.dtype
        self.device = p.device
        self.vocab_size = int(cfg.vocab_size)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(cfg, "eos_token_id", None)
        self.eos_token_id: Optional[int] = eos[0] if isinstance(eos, (list, tuple)) and eos \
            else eos
        self.eos_token_ids: List[int] = list(eos) if isinstance(eos, (list, tuple)) else \
            ([] if eos is None else [eos])
        _register()
        setter = getattr(model, "set_attn_implementation", None)
        if callable(setter):
            setter(ATTN_NAME)
        else:  # pragma: no cover - older transformers 5 releases
            model.config._attn_implementation = ATTN_NAME

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        with _using(plan):
            out = self.model(input_ids=tokens.to(self.device), position_ids=positions.to(self.device),
                             use_cache=False, logits_to_keep=1)
        return out.logits[:, -1].float()

    def __repr__(self) -> str:
        return (f"HFAdapter({type(self.model).__name__}, layers={self.layers}, "
                f"kv_heads={self.kv_heads}, head_dim={self.head_dim}, dtype={self.dtype})")

