# SPDX-License-Identifier: MIT
"""kvpool.llm.blocks: seed 000's blocks -- :class:`Block` handles on cached
KV, the private sequences of generations (_Seq) -- and :class:`ChunkedLLM`'s
block methods (get_*_blocks, infer_from_blocks*, infer_sequence*) as a
mixin; a :class:`kvpool.vseq.VirtualSequence` runs them."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch

__all__ = ["Block"]


@dataclass(frozen=True)
class Block:
    """A handle on cached KV (seed 000's "blocks"): a chunk entry (``kind``
    "entry", ``id`` its 64-hex daemon id) or a sequence of one of this
    ChunkedLLM's generations (``kind`` "seq", ``id`` the sequence id).
    ``start``: the position of its first token; ``tokens``: how many it
    holds. A chain of blocks is valid when each continues the previous one
    (checked by :meth:`ChunkedLLM.infer_from_blocks`)."""

    kind: str
    id: Union[str, int]
    start: int
    tokens: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass
class _Seq:
    """A generation's private sequence (ours): its page table and what it
    follows."""

    seq: int
    table: torch.Tensor           # int32 page table (pages pinned while the seq lives)
    start: int
    tokens: int                   # committed tokens (KV present)
    pending: List[int]            # generated tokens with no KV yet (the last one)
    prefix: Tuple[str, ...]       # str(Block) of the blocks before it
    token_ids: List[int] = field(default_factory=list)
    holds: List[int] = field(default_factory=list)  # daemon seqs holding its past (vseq)



class BlockMixin:
    """ChunkedLLM's blocks: its generations' private sequences and the
    last generation's blocks, and inference from blocks (kvpool.vseq)."""

    # Set by ChunkedLLM.__init__.
    client: Any
    _lock: threading.RLock
    _seqs: Dict[int, _Seq]
    _seq_next: int
    _active: List[List[Block]]

    # ------------------------------------------------------------ sequences
    def _new_seq_id(self) -> int:
        s = self._seq_next
        self._seq_next += 1
        return s

    def _free_seq(self, seq: int) -> None:
        s = self._seqs.pop(seq, None)
        for h in ([seq] + (s.holds if s is not None else [])):
            with contextlib.suppress(Exception):
                self.client.seq_free(h)

    def _set_active(self, rows: List[List[Block]]) -> None:
        keep = {b.id for r in rows for b in r if b.kind == "seq"}
        for r in self._active:
            for b in r:
                if b.kind == "seq" and b.id not in keep and b.id in self._seqs:
                    self._free_seq(int(b.id))
        self._active = rows

    # ------------------------------------------------------------ blocks (seed 000)
    def get_all_active_blocks(self, row: int = 0) -> Tuple[List[Block], int]:
        """The blocks of the last generation (row ``row`` of a batch): its
        chain's entries and the sequence of its generated tokens, and how
        many tokens they hold. The last generated token has no KV yet
        (nothing attended to it); infer_from_blocks on these blocks computes
        it first."""
        if not self._active:
            return [], 0
        blocks = list(self._active[row])
        return blocks, sum(b.tokens for b in blocks)

    def release_generations(self) -> None:
        """Free the private sequences of this object's generations (their
        blocks become invalid; get_all_active_blocks returns nothing)."""
        with self._lock:
            for s in list(self._seqs):
                self._free_seq(s)
            self._active = []

    def get_conversation_blocks(self, row: int = 0) -> Tuple[List[Block], int]:
        """The conversation so far as blocks: every block of the last
        generation (system, contexts, query, and what was generated after
        them, including earlier infer_from_blocks turns it continued)."""
        return self.get_all_active_blocks(row)

    def infer_from_blocks(self, existing_blocks: Any = None,
                          existing_token_count: Optional[int] = None,
                          new_tokens: Any = None,
                          sampling_params: Any = None) -> Dict[str, Any]:
        """Seed 000: generate after cached blocks, optionally with new tokens
        appended (token ids, or text). Blocks: Block handles (from
        get_all_active_blocks, a ContextManager or an output's 'blocks'),
        chunk entry ids or chunk ids (see :mod:`kvpool.vseq`: any order is
        exact; what does not continue the blocks before it is linked or
        recomputed). existing_blocks None or ``...``: this object's active
        blocks (get_all_active_blocks). existing_token_count: the tokens the
        blocks hold (checked; None: not checked). Only the new tokens get
        pages (a :class:`kvpool.vseq.VirtualSequence`); with none, the last
        cached token is recomputed for the first logits. Returns {'text',
        'token_ids', 'finish_reason', 'prompt_tokens', 'blocks', ...}."""
        out = None
        for d in self.infer_from_blocks_stream(existing_blocks, existing_token_count,
                                               new_tokens, sampling_params):
            out = d
        assert out is not None
        return out["result"]

    def infer_from_blocks_stream(self, existing_blocks: Any = None,
                                 existing_token_count: Optional[int] = None,
                                 new_tokens: Any = None,
                                 sampling_params: Any = None) -> Iterator[Dict[str, Any]]:
        """The streaming form: yields {'token' (its text), 'token_id',
        'index', 'text' (so far), 'finish_reason' (None until the last)}
        per generated token; the last dict also has 'result' (what
        infer_from_blocks returns)."""
        from ..vseq import VirtualSequence  # noqa: PLC0415
        if existing_blocks is None or existing_blocks is ...:
            existing_blocks, count = self.get_all_active_blocks()
            if existing_token_count is None or existing_token_count is ...:
                existing_token_count = count
        if existing_token_count is ...:
            existing_token_count = None
        seq = VirtualSequence(new_tokens, sampling_params, existing_blocks,
                              existing_token_count)
        return seq.stream(self)

    def infer_sequence(self, seq: Any) -> Dict[str, Any]:
        """Run a :class:`kvpool.vseq.VirtualSequence` (allocating it first
        when it is not yet): the result dict of infer_from_blocks."""
        return seq.generate(self)

    def infer_sequence_stream(self, seq: Any) -> Iterator[Dict[str, Any]]:
        """The streaming form of infer_sequence."""
        return seq.stream(self)
