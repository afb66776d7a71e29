# SPDX-License-Identifier: MIT
"""kvpool.vseq: seed 000's virtual sequences over kvpool -- generation
straight from KV that is already in the pool.

    from kvpool.vseq import VirtualSequence, ContextManager

    ctx = ContextManager(llm, system_chunk_id=sys_id, context_chunk_ids=[doc_id])
    blocks, count = ctx.get_all_active_blocks()     # from registered chunks
    seq = VirtualSequence(token_ids=tokenizer.encode("Continue: "),
                          sampling_params={"temperature": 0, "max_tokens": 32},
                          existing_blocks=blocks, existing_token_count=count)
    out = llm.infer_sequence(seq)                   # or llm.infer_from_blocks(...)
    seq.deallocate()

Blocks. An existing block is a :class:`kvpool.llm.Block` (from
``get_all_active_blocks`` / ``get_conversation_blocks`` of a ChunkedLLM or a
ContextManager, or an output's ``'blocks'``), a chunk entry id, or a chunk id
as ``register_chunk`` returns it (its KV at the place it is given). They are
never frame numbers: a caller cannot point attention at pages it does not
hold.

Reference counts. :meth:`VirtualSequence.allocate` makes kvpool sequences
(``Client.seq_create``) whose sources are the existing blocks: the daemon
takes a reference on each of their pages (the chunk's ``holders`` count goes
up; a chunk held so is neither evicted nor freed by a delete until the
reference goes), and they are read where they are, never copied. Pages are
allocated only for the new tokens (and the tokens generated after them), in
a sequence of the virtual sequence's own. :meth:`VirtualSequence.deallocate`
frees that one and drops the references; the blocks keep their pages.

What the seed leaves implicit and kvpool makes exact. A block's KV depends on
every token before it, at its positions. Blocks that do not continue each
other -- a chunk registered on its own (at position 0) given after a system
prompt, a generation's sequence after other blocks than the ones it was
generated after -- are made to: a chunk entry after a chunk entry is
replaced by the chunk's link under it (``chunk_link``: a hit when any process
computed it before, else one prefill of the chunk, kept for everyone); a
chunk or a sequence anywhere else (after a generation's sequence) has its
tokens computed again as new tokens of this sequence. So any list of blocks
is valid; what is not a continuation costs its prefill once.

Page boundaries. The daemon's page table has one partial page, its last, so
a kvpool sequence's sources must end on page boundaries but the last.
Blocks whose length is not a multiple of ``page_tokens`` therefore end a
*segment*: each segment is a sequence of its own and one cascade level of
the attention (``kvpool.cascade``), exact over any block lengths.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import errors as _errors
from .cascade import Level
from .llm import (Block, ChunkedLLM, ChunkNotFoundError, IncompatibleChunksError,
                  SamplingParams, _is_hex_id)

__all__ = ["VirtualSequence", "ContextManager"]

_MAX_SOURCES = 64   # kvpoold's sources per sequence (SEQ_MAX_SOURCES)


def _norm(b: Any) -> Block:
    if isinstance(b, Block):
        return b
    if _is_hex_id(b):
        return Block("entry", b.lower(), -1, -1)
    if isinstance(b, str) and b.startswith(("entry:", "seq:")):
        k, v = b.split(":", 1)
        return Block(k, v.lower() if k == "entry" else int(v), -1, -1)
    raise TypeError(f"block {b!r}: a Block (get_all_active_blocks), a chunk entry id or a "
                    "chunk id; frame numbers are not blocks")


class VirtualSequence:
    """Seed 000's VirtualSequence: new tokens after existing blocks.

    token_ids: the new tokens (ids, or a text the ChunkedLLM's tokenizer
    encodes; none: continue the blocks). sampling_params: as ChunkedLLM
    takes them. existing_blocks: see the module doc. existing_token_count:
    the tokens the blocks hold (checked; None: whatever they hold).

    Lifecycle: ``allocate(llm)`` (references on the blocks, the chain made
    exact; done by ``llm.infer_sequence(seq)`` when not yet), a generation
    (``llm.infer_sequence`` / ``infer_sequence_stream``), ``deallocate()``
    (frees the pages of its own, drops the references). A ``with`` block
    deallocates at its end. After a generation its own sequence is also the
    ChunkedLLM's active generation (``llm.get_all_active_blocks()``) until
    the next one or ``deallocate()``.

    Attributes: ``seq_id``, ``status`` (waiting, allocated, finished,
    freed), ``token_ids`` (the new tokens), ``completion_token_ids``,
    ``num_cached_tokens`` (tokens whose KV is reused), ``num_tokens``,
    ``blocks`` (the blocks as reused, after the chain was made exact),
    ``recomputed_tokens`` (tokens of blocks computed again), ``block_tables``
    ([(page table, tokens)] of its segments: a table's pages are held by
    reference, none of them its own), ``shared_seqs`` and ``own_seq`` (the
    daemon's sequence ids).
    """

    _ids = itertools.count(1)

    def __init__(self, token_ids: Any = None, sampling_params: Any = None,
                 existing_blocks: Optional[Sequence[Any]] = None,
                 existing_token_count: Optional[int] = None) -> None:
        self.seq_id = next(VirtualSequence._ids)
        if torch.is_tensor(token_ids):
            token_ids = token_ids.reshape(-1).tolist()
        self._text = token_ids if isinstance(token_ids, str) else None
        self.token_ids: List[int] = [] if token_ids is None or self._text is not None \
            else [int(t) for t in token_ids]
        self.sampling_params = SamplingParams.of(sampling_params)
        if isinstance(existing_blocks, (str, Block)):
            existing_blocks = [existing_blocks]
        self.existing_blocks: List[Block] = [_norm(b) for b in (existing_blocks or [])]
        if existing_token_count is not None and int(existing_token_count) < 0:
            raise ValueError(f"existing_token_count {existing_token_count}: at least 0")
        self.existing_token_count = None if existing_token_count is None \
            else int(existing_token_count)
        self.status = "waiting"
        self.completion_token_ids: List[int] = []
        self.finish_reason: Optional[str] = None
        self.blocks: List[Block] = []
        self.block_tables: List[Tuple[torch.Tensor, int]] = []
        self.shared_seqs: List[int] = []
        self.own_seq: Optional[int] = None
        self.recomputed_tokens = 0
        self._feed: List[int] = []
        self._last: Optional[int] = None
        self._levels: List[Level] = []
        self.llm: Optional[ChunkedLLM] = None

    # ------------------------------------------------------------ sizes
    @property
    def num_cached_tokens(self) -> int:
        return sum(b.tokens for b in self.blocks)

    @property
    def num_prompt_tokens(self) -> int:
        return self.num_cached_tokens + len(self._feed)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.completion_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in ("finished", "freed")

    def __repr__(self) -> str:
        return (f"VirtualSequence(seq_id={self.seq_id}, status={self.status}, "
                f"blocks={len(self.blocks or self.existing_blocks)}, "
                f"new={len(self.token_ids)}, completion={len(self.completion_token_ids)})")

    # ------------------------------------------------------------ allocate
    def allocate(self, llm: ChunkedLLM) -> "VirtualSequence":
        """Resolve the blocks (the chain made exact: links made, tokens to
        recompute found), then take the references: one kvpool sequence per
        segment, no pages of its own yet. Nothing is held when it raises."""
        if self.status != "waiting":
            raise ValueError(f"virtual sequence {self.seq_id} is {self.status}: allocate "
                             "a sequence once")
        if self._text is not None:
            self.token_ids = llm._encode(self._text)
        with llm._lock:
            blocks, feed, _, last = _resolve(llm, self.existing_blocks,
                                             self.existing_token_count)
            self.llm = llm
            try:
                self._share(llm, blocks)
            except BaseException:
                self._drop_shared()
                raise
        self.blocks = blocks
        self.recomputed_tokens = len(feed)
        self._feed = feed + self.token_ids
        self._last = last
        self.status = "allocated"
        return self

    def _share(self, llm: ChunkedLLM, blocks: List[Block]) -> None:
        P = llm.page_tokens
        segs: List[List[Block]] = [[]]
        for b in blocks:
            if len(segs[-1]) == _MAX_SOURCES:
                segs.append([])
            segs[-1].append(b)
            if b.tokens % P:            # only a sequence's last page may be partial
                segs.append([])
        for seg in (s for s in segs if s):
            sid = llm._new_seq_id()
            src = [("chunk", str(b.id)) if b.kind == "entry" else ("seq", int(b.id))
                   for b in seg]
            with llm._errs(str(seg[0].id) if seg[0].kind == "entry" else None):
                lease = llm.client.seq_create(sid, src, 0)
            self.shared_seqs.append(sid)
            try:
                table, n = lease.kv_indices(), int(lease.len)
            finally:
                with contextlib.suppress(Exception):
                    lease.release()
            self.block_tables.append((table, n))
            self._levels.append(Level.from_tables([(table, n, 1)], P))

    def _drop_shared(self) -> None:
        llm = self.llm
        for sid in self.shared_seqs:
            with contextlib.suppress(Exception):
                llm.client.seq_free(sid)    # type: ignore[union-attr]
        self.shared_seqs = []
        self.block_tables = []
        self._levels = []

    def deallocate(self) -> None:
        """Free the pages of its own (the new and generated tokens) and drop
        the references on the existing blocks (they keep their pages)."""
        llm = self.llm
        if llm is None or self.status == "freed":
            self.status = "freed"
            return
        with llm._lock:
            if self.own_seq is not None and self.own_seq in llm._seqs:
                llm._free_seq(self.own_seq)    # and its holds: shared_seqs
                llm._active = [r for r in llm._active
                               if not any(b.kind == "seq" and b.id == self.own_seq
                                          for b in r)]
            self._drop_shared()
        self.status = "freed"

    def __enter__(self) -> "VirtualSequence":
        return self

    def __exit__(self, *exc: object) -> None:
        self.deallocate()

    # ------------------------------------------------------------ run
    def stream(self, llm: ChunkedLLM) -> Iterator[Dict[str, Any]]:
        """Generate (allocating first when not yet): yields {'token' (its
        text), 'token_id', 'index', 'text' (so far), 'finish_reason'} per
        generated token; the last also has 'result' (a dict as
        ChunkedLLM.infer_from_blocks returns)."""
        if self.status == "waiting":
            self.allocate(llm)
        if self.status != "allocated" or self.llm is not llm:
            raise ValueError(f"virtual sequence {self.seq_id} is {self.status}"
                             + ("" if self.llm is llm else " on another ChunkedLLM"))
        sp = self.sampling_params
        attached = False
        it = None
        before = getattr(llm, "_gen_rows", None)
        with llm._lock:
            try:
                count = self.num_cached_tokens
                prefix = [tuple(str(b) for b in self.blocks)]
                if self._feed:
                    it = llm._generate(self._levels, [count], sp, feed=[self._feed],
                                       prefix=prefix)
                elif self.blocks:
                    it = llm._generate(self._levels, [count], sp, recompute=[self._last],
                                       prefix=prefix)
                else:
                    raise ValueError("infer_from_blocks: no blocks and no new tokens")
                ids: List[int] = []
                text = ""
                d: Dict[str, Any] = {}
                for step, toks, reasons in it:
                    if toks[0] is None:
                        continue
                    ids.append(toks[0])
                    full = llm._decode(ids)
                    if full.endswith("\ufffd") and reasons[0] is None:
                        piece = ""      # an incomplete character: wait for its bytes
                    else:
                        k = 0
                        while k < min(len(text), len(full)) and text[k] == full[k]:
                            k += 1
                        piece = full[k:]
                        text = full
                    d = {"token": piece, "token_id": toks[0], "index": step, "text": full,
                         "finish_reason": reasons[0]}
                    if reasons[0] is not None:
                        break
                    yield d
                it.close()        # the generator commits its sequence (its finally)
                sq = llm._gen_rows[0] if llm._gen_rows else None
                all_blocks = list(self.blocks)
                if sq is not None:
                    sq.holds = list(self.shared_seqs)   # freed with it
                    attached = True
                    self.own_seq = sq.seq
                    all_blocks.append(Block("seq", sq.seq, sq.start, sq.tokens))
                llm._set_active([all_blocks])
                llm.counters["generations"] += 1
                self.completion_token_ids = ids
                self.finish_reason = d.get("finish_reason")
                self.status = "finished"
                d["result"] = llm._result(0, count + len(self._feed), blocks=all_blocks,
                                          cached_tokens=count,
                                          prefilled_tokens=len(self._feed),
                                          recomputed_tokens=self.recomputed_tokens)
                yield d
            finally:
                if not attached:
                    if it is not None:    # a stream closed early: its sequence goes too
                        it.close()
                        rows = getattr(llm, "_gen_rows", None)
                        if rows is not before:
                            for r in rows or []:
                                llm._free_seq(r.seq)
                    self._drop_shared()
                    if self.status != "finished":
                        self.status = "freed"

    def generate(self, llm: ChunkedLLM) -> Dict[str, Any]:
        """:meth:`stream` to the end: the result dict."""
        out: Dict[str, Any] = {}
        for d in self.stream(llm):
            out = d
        return out["result"]


# ---------------------------------------------------------------- resolution
def _entry(llm: ChunkedLLM, b: Block) -> Tuple[Optional[Dict[str, Any]], str, List[int]]:
    """(entry dict or None, name, model token ids) of an entry block or of
    a chunk id (its root entry; None when it has none)."""
    eid = str(b.id).lower()
    try:
        e = llm.client.chunk_entry(eid)
    except _errors.NotFoundError:
        with llm._errs(eid):
            info = llm.client.chunk_get(eid)      # a chunk id: its root
        e = None
        if info.get("root"):
            with llm._errs(eid):
                e = llm.client.chunk_entry(info["root"])
        return e, eid, llm._name(eid)[1]
    return e, e["name"], llm._name(e["name"])[1]


def _link(llm: ChunkedLLM, name: str, chain: List[Block], toks: List[int]) -> Block:
    """The entry of chunk ``name`` after the entry chain ``chain``: a hit, or
    made now (one prefill over the chain's pages)."""
    parent = chain[-1]
    pos = parent.start + parent.tokens
    with llm._errs(name):
        reg = llm.client.chunk_link(name, str(parent.id), wait_ms=llm.wait_ms)
    if int(reg["start"]) != pos or int(reg["tokens"]) != len(toks):
        if reg.get("created") and reg.get("lease") is not None:
            reg["lease"].release()
        raise IncompatibleChunksError(f"link {reg['id'][:16]} of chunk {name[:16]} is "
                                      f"{reg['tokens']} tokens at {reg['start']}; the chain "
                                      f"ends at {pos}, the chunk has {len(toks)}", name)
    if reg["created"]:
        llm.counters["links_created"] += 1
        reads: List[Any] = []
        try:
            for c in chain:
                with llm._errs(str(c.id)):
                    reads.append(llm.client.chunk_acquire(str(c.id), wait_ms=llm.wait_ms))
            past = [Level.from_tables([(r.kv_indices(), r.len, 1)], llm.page_tokens)
                    for r in reads]
        except BaseException:
            with contextlib.suppress(Exception):
                reg["lease"].release()
            raise
        try:
            with llm._errs(name):
                llm._fill(reg, toks, past)
        finally:
            for r in reads:
                with contextlib.suppress(Exception):
                    r.release()
    else:
        llm.counters["link_hits"] += 1
        if reg.get("state") == "filling":       # another process fills it: wait
            with llm._errs(name):
                llm.client.chunk_acquire(reg["id"], wait_ms=llm.wait_ms).release()
    return Block("entry", reg["id"], pos, len(toks))


def _resolve(llm: ChunkedLLM, blocks: Sequence[Block], count: Optional[int] = None
             ) -> Tuple[List[Block], List[int], int, Optional[int]]:
    """(blocks whose KV is reused, as one exact chain; tokens to compute
    after them; the tokens the given blocks hold; the last reused token).
    Every block is looked up, and ``count`` checked, before any link is
    made."""
    items: List[Tuple[Block, Any]] = []
    given = 0
    for b in blocks:
        if b.kind == "seq":
            s = llm._seqs.get(int(b.id))
            if s is None:
                raise ChunkNotFoundError(str(b), f"block {b}: no such sequence of this "
                                         "ChunkedLLM (freed, or another's)")
            given += s.tokens
            items.append((b, s))
        elif b.kind == "entry":
            got = _entry(llm, b)
            given += len(got[2])
            items.append((b, got))
        else:
            raise TypeError(f"block {b}: kind entry or seq")
    if count is not None and count != given:
        raise ValueError(f"existing_token_count {count}: the blocks hold {given} tokens")
    out: List[Block] = []
    feed: List[int] = []
    last: Optional[int] = None
    for b, it in items:
        pos = sum(x.tokens for x in out)
        if b.kind == "seq":
            s = it
            if not feed and s.start == pos and s.prefix == tuple(str(x) for x in out):
                if s.tokens:
                    out.append(Block("seq", s.seq, pos, s.tokens))
                    last = s.token_ids[s.tokens - 1]
                feed.extend(s.pending)    # its last token has no KV: computed first
            else:
                feed.extend(s.token_ids)  # generated after other blocks: computed again
            continue
        e, name, toks = it
        if feed:
            feed.extend(toks)
            continue
        prev = out[-1] if out else None
        if e is not None and int(e["start"]) == pos and \
                (e.get("parent") or None) == (str(prev.id) if prev else None):
            out.append(Block("entry", e["id"], pos, int(e["tokens"])))
        elif prev is None:
            with llm._errs(name):
                root = llm.client.chunk_get(name).get("root")
            if root:
                out.append(Block("entry", root, 0, len(toks)))
            else:
                feed.extend(toks)          # no KV at position 0 any more
                continue
        elif prev.kind == "entry":
            out.append(_link(llm, name, out, toks))
        else:
            feed.extend(toks)
            continue
        last = toks[-1]
    return out, feed, given, last


# ---------------------------------------------------------------- context
class ContextManager:
    """The seed's ``context_mgr``: which registered chunks make up the
    conversation, and their blocks -- from the chunks themselves, no
    generation needed first.

    Chunks are kept in order (a system prompt first), each active or not.
    :meth:`get_all_active_blocks`: the blocks of the active chunks, as one
    exact chain (each chunk's link under the ones before it, made once in
    whichever process asks first). :meth:`get_conversation_blocks`: those
    plus what the ChunkedLLM generated after them (its active generation,
    when that continued exactly these blocks): the conversation so far."""

    def __init__(self, llm: ChunkedLLM, system_chunk_id: Optional[str] = None,
                 context_chunk_ids: Sequence[str] = ()) -> None:
        self.llm = llm
        self._chunks: List[List[Any]] = []     # [chunk_id, active]
        if system_chunk_id is not None:
            self.add_chunk(system_chunk_id)
        for c in context_chunk_ids:
            self.add_chunk(c)

    def register_chunk(self, content: Any, chunk_type: Any,
                       metadata: Optional[Dict[str, Any]] = None, active: bool = True) -> str:
        """llm.register_chunk, then add_chunk; returns the chunk id."""
        cid = self.llm.register_chunk(content, chunk_type, metadata)
        self.add_chunk(cid, active)
        return cid

    def add_chunk(self, chunk_id: str, active: bool = True) -> None:
        """Append a registered chunk (a system prompt goes first)."""
        cid = self.llm._check_id(chunk_id)
        ct, _ = self.llm._name(cid)
        if any(c == cid for c, _ in self._chunks):
            raise ValueError(f"chunk {cid[:16]} is in the context already")
        row = [cid, bool(active)]
        if ct.value == "system_prompt":
            self._chunks.insert(0, row)
        else:
            self._chunks.append(row)

    def _row(self, chunk_id: str) -> List[Any]:
        for r in self._chunks:
            if r[0] == str(chunk_id).lower():
                return r
        raise ChunkNotFoundError(str(chunk_id), f"chunk {chunk_id} is not in this context")

    def activate(self, chunk_id: str) -> None:
        self._row(chunk_id)[1] = True

    def deactivate(self, chunk_id: str) -> None:
        self._row(chunk_id)[1] = False

    def remove_chunk(self, chunk_id: str) -> None:
        self._chunks.remove(self._row(chunk_id))

    def active_chunks(self) -> List[str]:
        return [c for c, a in self._chunks if a]

    def get_all_active_blocks(self) -> Tuple[List[Block], int]:
        """(blocks, token count) of the active chunks, in order."""
        ids = self.active_chunks()
        if not ids:
            return [], 0
        with self.llm._lock:
            blocks, feed, _, _ = _resolve(self.llm, [_norm(c) for c in ids])
        if feed:
            raise ChunkNotFoundError(ids[0], f"chunk {ids[0]} has no KV at position 0 "
                                     "(its root was evicted): register it again")
        return blocks, sum(b.tokens for b in blocks)

    def get_conversation_blocks(self) -> Tuple[List[Block], int]:
        """The active blocks followed by the ChunkedLLM's generation after
        them, when its last generation continued them."""
        blocks, count = self.get_all_active_blocks()
        want = [str(b) for b in blocks]
        for row in self.llm._active:
            if [str(b) for b in row[:len(blocks)]] == want and len(row) > len(blocks):
                return list(row), sum(b.tokens for b in row)
        return blocks, count
