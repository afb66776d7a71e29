# SPDX-License-Identifier: MIT
"""kvpool.llm.core: :class:`ChunkedLLM` (see kvpool.llm's doc): set-up,
tokens, the chains of chunk entries, and the seed's generate calls. Its chunk,
decode and block methods are mixins (kvpool.llm.chunks, .generate, .blocks)."""
from __future__ import annotations

import contextlib
import hashlib
import random
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .. import chunk_copy as _chunk_copy
from .. import errors as _errors
from ..cascade import Level
from ..loaders import load_model
from .adapter import ModelAdapter
from .blocks import Block, BlockMixin, _Seq
from .chunks import (ChunkMixin, ChunkNotFoundError, ChunkType, IncompatibleChunksError)
from .generate import GenerateMixin, SamplingParams, _is_sampling

__all__ = ["ChunkedLLM"]


class ChunkedLLM(ChunkMixin, GenerateMixin, BlockMixin):
    """Seed 001's ChunkedLLM over kvpool (see kvpool.llm's doc).

    model_path: a local model directory, loaded by ``loader(path)`` when
    given, else by the first loader registered with
    :func:`kvpool.llm.register_model_loader` that recognises the directory,
    else with transformers' AutoModelForCausalLM / AutoTokenizer (see
    :func:`load_model`).
    max_chunks, chunk_memory_ratio: this tenant's chunk limits in the daemon
    (``Client.chunk_limits``: at most the configured values; LRU eviction of
    chunks nobody holds beyond them).
    enable_deduplication: True (the default): chunks are content-addressed,
    the same content registered again is the same chunk and one copy of its
    KV, in every process. False: every ``register_chunk`` makes a chunk of
    its own -- its id is SHA-256(content || NUL || "kvpool-copy " || a
    random nonce) instead of SHA-256(content), and its token ids are stored
    with the nonce in bits 24-31 (so the daemon, which keys KV by the
    tokens, makes it an entry of its own; the model sees the ids masked
    back, so only models whose token ids are below 2**24 can do this; see
    kvpool.chunk_copy). It costs what deduplication saves: a prefill and
    the pages of the KV again at every registration, links under it made
    again, nothing shared with other registrations or processes.
    model: a :class:`ModelAdapter`, or a transformers model (wrapped with
    ``kvpool.hf_llm.HFAdapter``). tokenizer: anything with ``encode`` and
    ``decode`` (``encode(text, add_special_tokens=False)`` is tried first).
    client / socket: a :class:`kvpool.Client` to use, or the daemon's socket
    to connect to (default ``$KVPOOL_SOCKET``).
    wait_ms: how long to wait for a chunk another process is filling.
    prefill_chunk: the most tokens one prefill forward takes (longer
    prefills are split; each piece attends to the ones before it).
    keep_chain_kv: during a decode, keep each layer's K/V of the composed
    chain gathered from the pages after the first step (one gather per layer
    per generation instead of one per step, for a copy of the chain's KV
    while the generation runs).
    """

    def __init__(self, model_path: Optional[str] = None, max_chunks: int = 1000,
                 chunk_memory_ratio: float = 0.5, enable_deduplication: bool = True, *,
                 model: Any = None, tokenizer: Any = None, client: Any = None,
                 socket: Optional[str] = None, wait_ms: int = 30000,
                 prefill_chunk: int = 8192, keep_chain_kv: bool = False,
                 loader: Optional[Callable[[str], Any]] = None) -> None:
        self.enable_deduplication = bool(enable_deduplication)
        if model is None and model_path is not None:
            model, tok = load_model(model_path, loader)
            tokenizer = tokenizer if tokenizer is not None else tok
        if model is None:
            raise ValueError("ChunkedLLM needs a model: model=ModelAdapter or transformers "
                             "model, or model_path=a local model directory")
        # First: close() takes it, and a failed __init__ below calls close().
        self._lock = threading.RLock()
        self.adapter = self._adapt(model)
        self.tokenizer = tokenizer if tokenizer is not None \
            else getattr(self.adapter, "tokenizer", None)
        self._own_client = client is None
        if client is None:
            import kvpool  # noqa: PLC0415
            client = kvpool.connect(socket, "kvpool.llm")
        self.client = client
        self.wait_ms = int(wait_ms)
        self.prefill_chunk = max(1, int(prefill_chunk))
        self.keep_chain_kv = bool(keep_chain_kv)
        L = client.layout
        self.page_tokens: int = L["page_tokens"]
        a = self.adapter
        want = (a.layers, a.kv_heads, a.head_dim)
        have = (L["layers"], L["kv_heads"], L["head_dim"])
        if want != have:
            self.close()
            dt = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(
                getattr(a, "dtype", None), L.get("dtype") or "bf16")
            raise IncompatibleChunksError(
                f"the pool's layout has layers={have[0]}, kv_heads={have[1]}, "
                f"head_dim={have[2]}; the model needs layers={want[0]}, "
                f"kv_heads={want[1]}, head_dim={want[2]}: start kvpoold with "
                f"--layout=layers={want[0]},kv_heads={want[1]},head_dim={want[2]},"
                f"dtype={dt},page_tokens={L['page_tokens']}")
        self.device = client.device
        self._caches = client.kv_caches()
        try:
            self.limits = client.chunk_limits(max_chunks=int(max_chunks),
                                              memory_ratio=float(chunk_memory_ratio))
        except AttributeError:  # a binding without chunk limits
            self.limits = {}
        self.eos_token_id: Optional[int] = getattr(self.tokenizer, "eos_token_id", None)
        if self.eos_token_id is None:
            self.eos_token_id = getattr(self.adapter, "eos_token_id", None)
        # name -> (type, tokens, root entry id, created_ns): see _name()
        self._names: Dict[str, Tuple[ChunkType, List[int], Optional[str], int]] = {}
        self._seqs: Dict[int, _Seq] = {}
        self._seq_next = (random.getrandbits(40) << 20) | 1
        self._active: List[List[Block]] = []   # the last generation's rows
        self.counters: Dict[str, int] = dict.fromkeys(
            ("forwards", "prefill_tokens", "recompute_tokens", "decode_tokens",
             "roots_created", "root_hits", "links_created", "link_hits", "generations"), 0)

    # ------------------------------------------------------------ setup
    @staticmethod
    def _adapt(model: Any) -> Any:
        if isinstance(model, ModelAdapter):
            return model
        if hasattr(model, "config") and isinstance(model, torch.nn.Module):
            from ..hf_llm import HFAdapter  # noqa: PLC0415
            return HFAdapter(model)
        for a in ("forward", "layers", "kv_heads", "head_dim"):
            if not hasattr(model, a):
                raise TypeError(f"model: a ModelAdapter or a transformers model; this "
                                f"{type(model).__name__} has no {a!r}")
        return model

    def close(self) -> None:
        """Free this object's sequences and close the client if it made it."""
        with self._lock:
            c = getattr(self, "client", None)
            if c is None or c.closed:
                return
            for s in list(getattr(self, "_seqs", {})):
                self._free_seq(s)
            self._active = []
            if self._own_client:
                c.close()

    def __enter__(self) -> "ChunkedLLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ tokens
    def _encode(self, text: str) -> List[int]:
        tok = self.tokenizer
        if tok is None:
            raise ValueError("no tokenizer: pass tokenizer= (anything with encode/decode), "
                             "or token ids instead of text")
        try:
            ids = tok.encode(text, add_special_tokens=False)
        except TypeError:
            ids = tok.encode(text)
        if hasattr(ids, "ids"):  # a tokenizers.Encoding
            ids = ids.ids
        if torch.is_tensor(ids):
            ids = ids.reshape(-1).tolist()
        return [int(t) for t in ids]

    def _decode(self, ids: Sequence[int]) -> str:
        tok = self.tokenizer
        if tok is None:
            return ""
        try:
            return tok.decode(list(ids), skip_special_tokens=True)
        except TypeError:
            return tok.decode(list(ids))

    def _model_tokens(self, ids: Any) -> List[int]:
        """A chunk's token ids as the model takes them: a copy's
        (enable_deduplication=False) carry a nonce in bits 24-31."""
        ids = [int(t) for t in ids]
        if int(getattr(self.adapter, "vocab_size", 0) or 0) <= _chunk_copy.TOKEN_MASK + 1:
            ids = [t & _chunk_copy.TOKEN_MASK for t in ids]
        return ids

    def _tokens_of(self, content: Any) -> Tuple[List[int], Optional[bytes]]:
        if isinstance(content, str):
            return self._encode(content), content.encode("utf-8")
        if torch.is_tensor(content):
            content = content.reshape(-1).tolist()
        if isinstance(content, (list, tuple)) and all(isinstance(t, int) for t in content):
            return [int(t) for t in content], None
        raise TypeError(f"content: text or token ids, not {type(content).__name__}")

    # ------------------------------------------------------------ chains
    def _expect(self, cid: Any, want: ChunkType, role: str) -> Tuple[str, List[int]]:
        cid = self._check_id(cid)
        ct, toks = self._name(cid)
        if ct is not want:
            raise IncompatibleChunksError(
                f"chunk {cid[:16]} is a {ct.value} chunk, given as the {role}: "
                f"incompatible chunks (the {role} must be a {want.value} chunk)", cid)
        return cid, toks

    def _chain(self, system_chunk_id: str, context_chunk_ids: Optional[Sequence[str]],
               query_chunk_id: Optional[str], prefill: bool = True
               ) -> Tuple[List[Dict[str, Any]], Optional[torch.Tensor]]:
        """Resolve (and, with prefill, complete) the chain of entries:
        [{name, entry, start, tokens, ids, created}], and the logits of the
        last link's last token when this call prefilled it (else None)."""
        steps = [(system_chunk_id, ChunkType.SYSTEM_PROMPT, "system prompt")]
        steps += [(c, ChunkType.CONTEXT, f"context {i}")
                  for i, c in enumerate(context_chunk_ids or [])]
        if query_chunk_id is not None:
            steps.append((query_chunk_id, ChunkType.QUERY, "query"))
        named = [self._expect(c, t, r) for c, t, r in steps]
        chain: List[Dict[str, Any]] = []
        reads: List[Any] = []            # read leases of the ancestors (for prefills)
        last_logits = None
        try:
            sid, stoks = named[0]
            with self._errs(sid):
                info = self.client.chunk_get(sid)
            root = info.get("root")
            if not root:
                raise ChunkNotFoundError(sid, f"system chunk {sid} has no KV (its root entry "
                                         "was evicted): register it again")
            if self._names[sid][2] != root:   # registered anew since _name() read it
                stoks = self._name(sid)[1]
            chain.append(dict(name=sid, entry=root, start=0, tokens=len(stoks), ids=stoks,
                              created=False))
            for cid, toks in named[1:]:
                parent = chain[-1]
                if not prefill:
                    ent = self._find_link(cid, parent["entry"])
                    chain.append(dict(name=cid, entry=ent, start=parent["start"] +
                                      parent["tokens"], tokens=len(toks), ids=toks,
                                      created=False))
                    continue
                with self._errs(cid):
                    reg = self.client.chunk_link(cid, parent["entry"], wait_ms=self.wait_ms)
                want_start = parent["start"] + parent["tokens"]
                if int(reg["start"]) != want_start:
                    if reg.get("created") and reg.get("lease") is not None:
                        reg["lease"].release()
                    raise IncompatibleChunksError(
                        f"link {reg['id'][:16]} of chunk {cid[:16]} starts at {reg['start']}, "
                        f"the chain has {want_start} tokens before it", cid)
                last_logits = None
                if reg["created"] or int(reg["tokens"]) != len(toks):
                    # The tokens the entry is filled with (or stands for) are
                    # the name's now: read again unless its record is the
                    # one they came from (_name), since the name may have
                    # been registered anew with other tokens meanwhile.
                    try:
                        toks = self._name(cid)[1]
                    except BaseException:
                        if reg["created"] and reg.get("lease") is not None:
                            reg["lease"].release()
                        raise
                if reg["created"]:
                    self.counters["links_created"] += 1
                    while len(reads) < len(chain):
                        e = chain[len(reads)]
                        with self._errs(e["name"]):
                            reads.append(self.client.chunk_acquire(e["entry"],
                                                                   wait_ms=self.wait_ms))
                    past = [Level.from_tables([(r.kv_indices(), r.len, 1)], self.page_tokens)
                            for r in reads]
                    with self._errs(cid):
                        last_logits = self._fill(reg, toks, past)
                else:
                    self.counters["link_hits"] += 1
                    if reg.get("state") == "filling":   # another process fills it: wait
                        with self._errs(cid):
                            self.client.chunk_acquire(reg["id"], wait_ms=self.wait_ms).release()
                chain.append(dict(name=cid, entry=reg["id"], start=want_start,
                                  tokens=len(toks), ids=toks, created=bool(reg["created"])))
        finally:
            for r in reads:
                with contextlib.suppress(Exception):
                    r.release()
        return chain, last_logits

    def _find_link(self, name: str, parent: str) -> Optional[str]:
        """The existing entry of name under parent, or None."""
        if parent is None:
            return None
        with self._errs(name):
            for e in self.client.chunk_entries(name):
                if e.get("parent") == parent:
                    return e["id"]
        return None

    def generate_from_chunks(self, system_chunk_id: str,
                             context_chunk_ids: Optional[Sequence[str]] = None,
                             query_chunk_id: Optional[str] = None,
                             sampling_params: Any = None) -> Dict[str, Any]:
        """Generate after system -> contexts (in order) -> query, from their
        cached KV: prefills only the links of the chain no process computed
        before, composes the chain and decodes. Returns {'text', 'token_ids',
        'finish_reason', 'prompt_tokens', 'completion_tokens',
        'cached_tokens', 'prefilled_tokens', 'chunk_ids'}.
        ChunkNotFoundError / IncompatibleChunksError / OutOfMemoryError."""
        self._check_id(system_chunk_id)      # first: the seed's `generate_from_chunks(...)`
        if query_chunk_id is None:
            raise ValueError("generate_from_chunks needs a query_chunk_id (without one, use "
                             "infer_from_blocks on the system and context blocks)")
        return self.batch_generate_from_chunks(
            [{"system_chunk_id": system_chunk_id, "context_chunk_ids": context_chunk_ids,
              "query_chunk_id": query_chunk_id}], sampling_params)[0]

    def batch_generate_from_chunks(self, requests: Sequence[Mapping[str, Any]],
                                   sampling_params: Any = None) -> List[Dict[str, Any]]:
        """Several compositions in one batch: each request a dict
        {system_chunk_id, context_chunk_ids, query_chunk_id}. One compose for
        the batch (requests are ordered so that equal chain prefixes are
        adjacent: a system prompt or system+context shared by several
        requests is one cascade group, attended once per layer for all of
        them), one batched decode. Outputs in the order of the requests."""
        sp = SamplingParams.of(sampling_params)
        reqs = list(requests)
        if not reqs:
            return []
        with self._lock:
            chains, logits = [], []
            for r in reqs:
                if r.get("query_chunk_id") is None:
                    raise ValueError("each request needs a query_chunk_id")
                ch, lg = self._chain(r["system_chunk_id"], r.get("context_chunk_ids"),
                                     r["query_chunk_id"])
                chains.append(ch)
                logits.append(lg)
            order = sorted(range(len(reqs)), key=lambda i: tuple(e["entry"] for e in chains[i]))
            creq = [{"system": chains[i][0]["entry"],
                     "contexts": [e["entry"] for e in chains[i][1:-1]],
                     "query": chains[i][-1]["entry"], "qo_len": 1} for i in order]
            with self._errs() as _:
                comp = self.client.compose(creq)
            try:
                B = len(order)
                levels = self._chain_levels(comp, B)
                base = [sum(e["tokens"] for e in chains[i]) for i in order]
                prefix = [tuple(str(Block("entry", e["entry"], e["start"], e["tokens"]))
                                for e in chains[i]) for i in order]
                if all(logits[i] is not None for i in order):
                    # every query link was prefilled just now: its last logits are the first
                    it = self._generate(levels, base, sp,
                                        logits0=torch.stack([logits[i] for i in order]),
                                        prefix=prefix)
                else:
                    it = self._generate(levels, base, sp,
                                        recompute=[chains[i][-1]["ids"][-1] for i in order],
                                        prefix=prefix)
                self._run(it)
            finally:
                comp.release()
            self.counters["generations"] += B
            outs: List[Optional[Dict[str, Any]]] = [None] * len(reqs)
            active: List[List[Block]] = []
            for b, i in enumerate(order):
                ch = chains[i]
                blocks = [Block("entry", e["entry"], e["start"], e["tokens"]) for e in ch]
                sq = self._gen_rows[b] if self._gen_rows else None
                if sq is not None:
                    blocks.append(Block("seq", sq.seq, sq.start, sq.tokens))
                active.append(blocks)
                outs[i] = self._result(
                    b, base[b], cached_tokens=sum(e["tokens"] for e in ch if not e["created"]),
                    prefilled_tokens=sum(e["tokens"] for e in ch if e["created"]),
                    chunk_ids={"system": ch[0]["name"],
                               "context": [e["name"] for e in ch[1:-1]],
                               "query": ch[-1]["name"]},
                    blocks=blocks)
            self._set_active([active[order.index(i)] for i in range(len(reqs))])
            return outs  # type: ignore[return-value]

    def preview_composition(self, system_chunk_id: str,
                            context_chunk_ids: Optional[Sequence[str]] = None,
                            query_chunk_id: Optional[str] = None) -> Dict[str, Any]:
        """What a composition would attend, computing and holding nothing:
        total_tokens, num_levels, memory_bytes (the pages of the chain's KV,
        counted whether cached or still to prefill), cached_tokens and
        prefill_tokens (links not cached yet), and one row per level."""
        chain, _ = self._chain(system_chunk_id, context_chunk_ids, query_chunk_id,
                               prefill=False)
        P = self.page_tokens
        page_bytes = self.client.layout["page_bytes"]
        cached = [e for e in chain if e["entry"]]
        out: Dict[str, Any] = {
            "total_tokens": sum(e["tokens"] for e in chain),
            "num_levels": len(chain),
            "cached_tokens": sum(e["tokens"] for e in cached),
            "prefill_tokens": sum(e["tokens"] for e in chain if not e["entry"]),
            "levels": [{"chunk_id": e["name"], "entry": e["entry"], "start": e["start"],
                        "tokens": e["tokens"], "cached": bool(e["entry"])} for e in chain],
        }
        pages = sum((e["tokens"] + P - 1) // P for e in chain)
        out["memory_bytes"] = pages * page_bytes
        if len(cached) == len(chain) and query_chunk_id is not None:
            with contextlib.suppress(_errors.KvpoolError):
                pv = self.client.compose_preview([{
                    "system": chain[0]["entry"], "contexts": [e["entry"] for e in chain[1:-1]],
                    "query": chain[-1]["entry"]}])
                out.update(total_tokens=pv.tokens, num_levels=pv.nlevels,
                           memory_bytes=pv.bytes)
        return out

    def generate(self, prompt: Any = None, context: Any = None, query: Any = None,
                 sampling_params: Any = None, persist_chunks: bool = True, *,
                 system_prompt: Any = None) -> Any:
        """Two forms.

        The standard API (the seed's "before"): ``generate(prompt=text,
        sampling_params=...)`` -- also ``generate(text)``, ``generate(text,
        sampling_params)`` and nano-vllm's ``generate([texts], sp)`` (a list
        in, a list out) -- generates after the prompt as it is (no chat
        template, no chunk registered: its KV goes in a private sequence,
        the generation's blocks). Returns the dict of infer_from_blocks
        ({'text', 'token_ids', 'finish_reason', ...}).

        The chunk form: ``generate(system_prompt=..., context=[...],
        query=..., sampling_params=..., persist_chunks=True)`` (or the
        system prompt first positionally with a context or a query after
        it) registers the system prompt, the contexts (a text or a list)
        and the query, and generates from them. Returns the
        generate_from_chunks output with 'chunk_ids': {'system', 'context':
        [...], 'query'}. persist_chunks=False deletes the chunks this call
        registered (not ones that were there before) once the output is
        made."""
        if context is not None and query is None and sampling_params is None and \
                _is_sampling(context):
            context, sampling_params = None, context    # generate(prompt, sp)
        if isinstance(prompt, (list, tuple)) and prompt and query is None and \
                not all(isinstance(t, int) for t in prompt) and \
                isinstance(context, (list, tuple)) and context and \
                all(_is_sampling(c) for c in context):
            context, sampling_params = None, context    # generate([prompts], [sps])
        if system_prompt is None and context is None and query is None:
            if prompt is None:
                raise ValueError("generate: a prompt (prompt=...), or system_prompt= with "
                                 "context= / query=")
            return self._generate_prompts(prompt, sampling_params)
        if system_prompt is not None and prompt is not None:
            raise ValueError("generate: prompt= is the standard form, system_prompt= the "
                             "chunk form: give one of them")
        system_prompt = prompt if system_prompt is None else system_prompt
        ctx = [context] if isinstance(context, str) else list(context or [])
        made: List[str] = []
        try:
            sid, c = self._register(system_prompt, ChunkType.SYSTEM_PROMPT)
            if c:
                made.append(sid)
            cids = []
            for t in ctx:
                cid, c = self._register(t, ChunkType.CONTEXT)
                cids.append(cid)
                if c:
                    made.append(cid)
            if query is not None and not persist_chunks:
                # A query not kept is not a chunk: its tokens are fed after
                # the cached chain into the generation's own sequence (one
                # forward), never prefilled at position 0 as a root.
                tokens, data = self._tokens_of(query)
                chain, _ = self._chain(sid, cids, None)
                blocks = [Block("entry", e["entry"], e["start"], e["tokens"]) for e in chain]
                out = self.infer_from_blocks(blocks, sum(b.tokens for b in blocks), tokens,
                                             sampling_params)
                qname = hashlib.sha256(data if data is not None else
                                       b"".join(t.to_bytes(4, "little") for t in tokens))
                out["chunk_ids"] = {"system": sid, "context": cids, "query": qname.hexdigest()}
            elif query is not None:
                qid, c = self._register(query, ChunkType.QUERY)
                if c:
                    made.append(qid)
                out = self.generate_from_chunks(sid, cids, qid, sampling_params)
            else:
                chain, _ = self._chain(sid, cids, None)
                blocks = [Block("entry", e["entry"], e["start"], e["tokens"]) for e in chain]
                out = self.infer_from_blocks(blocks, sum(b.tokens for b in blocks), None,
                                             sampling_params)
                out["chunk_ids"] = {"system": sid, "context": cids, "query": None}
            return out
        finally:
            if not persist_chunks:
                for cid in reversed(made):
                    with contextlib.suppress(_errors.NotFoundError):
                        self.client.chunk_delete(cid)
                    self._names.pop(cid, None)

    def _generate_prompts(self, prompt: Any, sampling_params: Any) -> Any:
        many = isinstance(prompt, (list, tuple)) and prompt and \
            not all(isinstance(t, int) for t in prompt)
        prompts = list(prompt) if many else [prompt]
        sps = list(sampling_params) if isinstance(sampling_params, (list, tuple)) \
            else [sampling_params] * len(prompts)
        if len(sps) != len(prompts):
            raise ValueError(f"generate: {len(sps)} sampling_params for {len(prompts)} "
                             "prompts")
        outs = []
        for p, sp in zip(prompts, sps):
            tokens, _ = self._tokens_of(p)
            if not tokens:
                raise ValueError("generate: the prompt has no tokens")
            outs.append(self.infer_from_blocks([], 0, tokens, sp))
        return outs if many else outs[0]
