# SPDX-License-Identifier: MIT
"""kvpool.llm.adapter: the interface a model implements for
:class:`kvpool.llm.ChunkedLLM`. It imports nothing of the rest of kvpool.llm
(nor transformers, nor torch at run time), so adapters such as
``kvpool.hf_llm.HFAdapter`` import it without the chunk or decode code."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # annotations only
    import torch

    from ..cascade import Plan

__all__ = ["ModelAdapter"]


class ModelAdapter:
    """What :class:`ChunkedLLM` needs of a model. Subclass it or provide the
    same attributes (duck typing is fine).

    Attributes: ``layers``, ``kv_heads``, ``head_dim`` (the model's KV
    geometry: the pool's layout must be the same), ``dtype`` (of its K/V;
    the pool's dtype should be it), ``device`` (where the model runs: the
    pool's device), ``vocab_size``, ``eos_token_id`` (or None).

    ``forward(tokens, positions, plan) -> logits``:
      * ``tokens``: LongTensor ``[B, n]`` on ``device``: n new tokens per row;
      * ``positions``: LongTensor ``[B, n]``: their absolute positions (for
        RoPE); row b's positions continue its cached chain, so rows differ;
      * ``plan``: a :class:`kvpool.cascade.Plan`. Every layer ``l`` computes
        ``q [B, Hq, n, D]`` (after RoPE), ``k, v [B, Hkv, n, D]`` (k after
        RoPE) and calls ``o = plan.attend(l, q, k, v, scale=None)`` ->
        ``[B, n, Hq, D]`` in q's dtype, in place of its attention (no mask,
        no cache: the plan knows the past levels and what is causal, and
        stores k, v into the pool when the forward is a prefill or decode
        step whose KV is kept);
      * returns fp32 logits ``[B, vocab]`` of each row's LAST position.
    ``scale`` None means ``head_dim ** -0.5``; pass the model's own where it
    differs.
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    vocab_size: int
    eos_token_id: Optional[int] = None

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                plan: Plan) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor,
                 plan: Plan) -> torch.Tensor:
        return self.forward(tokens, positions, plan)
