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
(post-RoPE, the model's dtype, bit for bit) in pool pages, and then, with
``attention="paged"``: one :mod:`kvpool.paged_attention` kernel per layer
reads every level's pages where they lie (and the new tokens, causally,
from their slots); a level several rows share is one launch, read once for
them all. The kernel matches its torch reference on the H200 (fp32, bf16,
fp16, GQA, shared launches, split keys; fp32 generations token-identical to
one full prefill: bench/results/gpu-proof-2026-11-28), but it stays
opt-in: ``HFAdapter(model, attention="paged")`` or
``KVPOOL_ATTENTION=paged``. Those forwards replay as CUDA graphs keyed by
bucket (rows, new tokens, each launch's groups and power-of-two token
capacity), captured on a key's second use (``cuda_graphs=False``: eager).
tools/graph_probe.py showed on the H200 that such a replay re-reads its
inputs (the graph tests that seemed to say otherwise passed ``attend`` an
``out`` of transposed strides, which the merge wrote in dense order; fixed,
and tests/python/test_paged_attention.py checks it).

With ``attention="sdpa"`` (the default until then), no graphs:

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

import collections
import contextlib
import copy
import os
import threading
from typing import Any, Iterator, List, Optional, Tuple

import torch

try:
    from transformers import AttentionInterface as _AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface as _AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask as _sdpa_mask
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as _sdpa_attention
except ImportError as _e:  # pragma: no cover - depends on the machine
    raise ImportError("kvpool.hf_llm needs HuggingFace transformers >= 5 with "
                      f"AttentionInterface and AttentionMaskInterface: {_e}") from _e

from . import paged_attention as _paged
from .llm.adapter import ModelAdapter

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
    if getattr(plan, "_kvpool_tables", None) is not None:
        # The fast path: the new tokens' K/V go to their pool slots, then
        # one kernel reads every level's pages where they lie (and the new
        # tokens, causally, from theirs).
        return _paged.attend_plan(plan, layer, query, key, value, scale=scaling), None
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
        # One gather each for K and V ([pages, P, Hkv, D], contiguous, so the
        # token views below are free), one concatenation each into the
        # head-major layout DynamicCache holds: two copies of the past.
        K = cache[self.pages, 0]
        V = cache[self.pages, 1]
        H, D = K.shape[-2], K.shape[-1]
        ks, vs = [], []
        for at, need, n in self.spans:
            ks.append(K[at:at + need].view(-1, H, D)[:n].permute(1, 0, 2))
            vs.append(V[at:at + need].view(-1, H, D)[:n].permute(1, 0, 2))
        ks.append(key[0])
        vs.append(value[0])
        return torch.cat(ks, dim=1)[None], torch.cat(vs, dim=1)[None]


def _flat(plan: Any) -> _Flat:
    f = getattr(plan, "_kvpool_flat", None)
    if f is None:
        f = _Flat(plan)
        plan._kvpool_flat = f
    return f


class _Graph:
    """One captured forward over paged tables of one bucket (see
    HFAdapter.forward): static input ids, positions, destination slots and
    tables, refilled before each replay; the logits come out of a static
    buffer (cloned on the way out)."""

    def __init__(self, adapter: "HFAdapter", tokens: torch.Tensor, positions: torch.Tensor,
                 plan: Any) -> None:
        sp = copy.copy(plan)
        sp.leases = None                        # checked before each replay, not inside
        sp.checked = True
        sp.store = (plan.store[0].clone(), plan.store[1].clone())
        sp._kvpool_tables = plan._kvpool_tables.bucketed()
        self.plan = sp
        self.tokens = tokens.clone()
        self.positions = positions.clone()
        self.mask2d = torch.ones_like(tokens)
        model = adapter.model

        def fwd() -> torch.Tensor:
            with _using(sp):
                out = model(input_ids=self.tokens, position_ids=self.positions,
                            attention_mask=self.mask2d, use_cache=False, logits_to_keep=1)
            return out.logits[:, -1].float()

        # One side stream per adapter for every warm-up and capture: cuBLAS
        # keeps a workspace per stream for the life of the process, so a new
        # stream per capture would leak one workspace each time. One memory
        # pool for all the adapter's graphs: they never run at once, and
        # their outputs are cloned as soon as they are replayed.
        dev = tokens.device
        if adapter._stream is None:
            adapter._stream = torch.cuda.Stream(device=dev)
        if adapter._pool is None:
            adapter._pool = torch.cuda.graph_pool_handle()
        side = adapter._stream
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            fwd()                                 # warm-up (and Triton's compile)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=adapter._pool, stream=side):
            self.out = fwd()

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.plan.store[0].copy_(plan.store[0])
        self.plan.store[1].copy_(plan.store[1])
        self.plan._kvpool_tables.copy_from(plan._kvpool_tables)
        self.graph.replay()
        return self.out.clone()


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
    num_key_value_heads, ``head_dim``, and the model's dtype.

    attention: ``"paged"`` reads pool pages in place with
    :mod:`kvpool.paged_attention`'s kernel wherever it runs (CUDA with
    Triton) and the forward stores its tokens; ``"sdpa"`` (the default, or
    ``$KVPOOL_ATTENTION``) gathers each row's pages and runs transformers'
    SDPA over the copy -- slower, but bit for bit what DynamicCache
    computes with the same chunk boundaries (the like-for-like bf16 check).
    cuda_graphs: replay paged forwards as CUDA graphs, at most
    ``max_graphs`` of them."""

    def __init__(self, model: Any, cuda_graphs: bool = True, max_graphs: int = 16,
                 attention: Optional[str] = None) -> None:
        if attention is None:
            attention = os.environ.get("KVPOOL_ATTENTION", "sdpa")
        if attention not in ("paged", "sdpa"):
            raise ValueError(f"HFAdapter: attention={attention!r} (or $KVPOOL_ATTENTION); use "
                             "'paged' (kvpool's kernel over pool pages) or 'sdpa'")
        self.attention = attention
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
        # CUDA graphs, keyed by bucket, never by chain: a forward's key is
        # its rows, new tokens and each launch's groups and token capacity
        # rounded up to a power of two (paged_attention.Tables.bucket_key).
        # Every decode step of a generation, and every 32-token query over
        # any chain of 4k-8k tokens, is one key: captured on its second
        # use (no capture for a one-off), replayed after that with the
        # tokens, positions, destination slots and tables refilled.
        self.cuda_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        self.max_graphs = int(max_graphs)
        self._graphs: "collections.OrderedDict[Tuple[Any, ...], _Graph]" = collections.OrderedDict()
        self._seen: "collections.OrderedDict[Tuple[Any, ...], int]" = collections.OrderedDict()
        self._failed: set = set()
        self.graph_captures = self.graph_replays = self.graph_failures = 0
        self._stream: Optional[torch.cuda.Stream] = None
        self._pool: Any = None
        _register()
        setter = getattr(model, "set_attn_implementation", None)
        if callable(setter):
            setter(ATTN_NAME)
        else:  # pragma: no cover - older transformers 5 releases
            model.config._attn_implementation = ATTN_NAME

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        tokens = tokens.to(self.device)
        positions = positions.to(self.device)
        # A plan that stores into leases (kvpool.llm's) has the library check
        # them first, outside any capture: a graph replays only indexed
        # stores into slots the check just covered.
        if getattr(plan, "leases", None) is not None:
            plan.check_writes()
        if self.attention != "paged" or plan.store is None or \
                not _paged.available(self.device):
            return self._eager(tokens, positions, plan)
        tables = _paged.plan_tables(plan)
        if self.cuda_graphs:
            key = (tables.bucket_key(), tuple(tokens.shape), plan.scale)
            g = self._graphs.get(key)
            if g is not None:
                self._graphs.move_to_end(key)
                self.graph_replays += 1
                return g.run(tokens, positions, plan)
            if key not in self._failed and self._seen.get(key, 0) >= 1:
                g = self._capture(key, tokens, positions, plan)
                if g is not None:
                    return g.run(tokens, positions, plan)
            self._seen[key] = self._seen.get(key, 0) + 1
            self._seen.move_to_end(key)
            while len(self._seen) > 256:
                self._seen.popitem(last=False)
        return self._eager(tokens, positions, plan)

    def clear_graphs(self) -> None:
        """Drop every captured CUDA graph (their memory pools go back to
        torch's allocator); forwards capture again on their second use."""
        self._graphs.clear()
        self._seen.clear()
        self._pool = None

    def _eager(self, tokens: torch.Tensor, positions: torch.Tensor, plan: Any) -> torch.Tensor:
        # attention_mask given: transformers then skips its packed-sequence
        # probe (a device sync); the plan decides what is causal anyway.
        with _using(plan):
            out = self.model(input_ids=tokens, position_ids=positions,
                             attention_mask=torch.ones_like(tokens), use_cache=False,
                             logits_to_keep=1)
        return out.logits[:, -1].float()

    def _capture(self, key: Tuple[Any, ...], tokens: torch.Tensor, positions: torch.Tensor,
                 plan: Any) -> Optional["_Graph"]:
        try:
            g = _Graph(self, tokens, positions, plan)
        except Exception:  # noqa: BLE001 - a model or kernel that cannot be captured
            self._failed.add(key)
            self.graph_failures += 1
            return None
        self._graphs[key] = g
        self.graph_captures += 1
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return g

    def __repr__(self) -> str:
        return (f"HFAdapter({type(self.model).__name__}, layers={self.layers}, "
                f"kv_heads={self.kv_heads}, head_dim={self.head_dim}, dtype={self.dtype})")

