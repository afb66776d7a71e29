# SPDX-License-Identifier: MIT
# Past ~800 lines for now: one ChunkedLLM; it becomes the llm/ package (STYLE.md).
"""kvpool.llm: seed 001's chunk API on a real model -- registration is a
prefill, generation composes pre-computed KV through cascade attention.

    from kvpool.llm import ChunkedLLM, ChunkType

    llm = ChunkedLLM(model=model, tokenizer=tok)       # a ModelAdapter or a transformers LM
    sys_id = llm.register_chunk("You are a helpful assistant.", ChunkType.SYSTEM_PROMPT)
    doc_id = llm.register_chunk("Python is ...", ChunkType.CONTEXT, {"source": "docs"})
    q_id = llm.register_chunk("What are decorators?", ChunkType.QUERY)
    out = llm.generate_from_chunks(sys_id, [doc_id], q_id, {"temperature": 0, "max_tokens": 64})
    out["text"], out["token_ids"], out["finish_reason"]

How it is exact. A chunk's KV depends on every token before it, so the KV
lives in kvpoold as *entries*: a *root* (a chunk prefilled at position 0,
made by ``register_chunk``) or a *link* (a chunk prefilled after a parent
entry, at the positions that follow it). The seed's ``chunk_id`` is the
chunk's *name* (SHA-256 of its content; the KV is found by the tokens,
so a text that another tokenizer registered with other tokens gets a chunk
named by its own tokens: see ``register_chunk``); ``generate_from_chunks(system,
contexts, query)`` walks the chain system root -> context 1 under it ->
context 2 under that -> ... -> query, asks the daemon for each link
(``chunk_link``: a hit when any process computed it before) and prefills
only the links that are new, each over its ancestors' pages. The chain's
entries are then composed (``Client.compose``: cascade CSR tables, groups
shared by several requests attended once) and the model decodes over them
with :class:`kvpool.cascade.Plan`, its generated tokens' K/V in a private
kvpool sequence. The first logits come from the query link's prefill when
this call made it; when the link was cached, only the query's last token is
recomputed (its KV is cached, its logits are not). The result is the same
computation as one prefill of the concatenated prompt, split at the chunk
boundaries.

Registering a context or a query prefills it as a root (at position 0, as a
prompt of its own): the seed's "registration = prefill"; it is also what
``infer_from_blocks`` can start from. Its KV under a given system prompt is
the link, made (once, in whichever process asks first) by the first
generation that uses the pair.

Blocks (seed 000): :meth:`ChunkedLLM.get_all_active_blocks` returns
:class:`Block` handles -- chunk entries (daemon ids) and the sequences of
this object's generations -- never frame numbers; chunk ids are blocks too
(``kvpool.vseq.ContextManager`` gives a chain of them with no generation
first). :meth:`ChunkedLLM.infer_from_blocks` runs a
:class:`kvpool.vseq.VirtualSequence` over them: their page tables come from
the daemon (``seq_create``, which takes a reference on every page), so a
caller cannot point attention at pages it does not hold; see kvpool.vseq
for how blocks that do not chain or end mid-page are made exact.

The standard API (``generate(prompt=..., sampling_params=...)``) generates
after a prompt as it is, registering nothing. ``enable_deduplication=False``
and ``model_path=`` loaders: see :class:`ChunkedLLM`.

The model side is a :class:`ModelAdapter` (see its doc);
``kvpool.hf_llm.HFAdapter`` wraps transformers causal LMs, and
``kvpool.tiny`` has a plain-torch one.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import errno as _errno
import json
import random
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import torch

from . import chunk_copy as _chunk_copy
from . import errors as _errors
from .cascade import Level, Plan
from .loaders import load_model, register_model_loader

__all__ = ["ChunkType", "ModelAdapter", "ChunkedLLM", "Block", "SamplingParams",
           "ChunkNotFoundError", "IncompatibleChunksError", "OutOfMemoryError",
           "register_model_loader", "load_model"]


# ---------------------------------------------------------------- errors
class ChunkNotFoundError(_errors.NotFoundError):
    """A chunk (or an entry, or a block) is not registered: never, deleted or
    evicted. ``chunk_id`` names it; ``str(e)`` says what was asked."""

    def __init__(self, chunk_id: str, message: str = "") -> None:
        self.chunk_id = chunk_id
        super().__init__(_errno.ENOENT, message or f"chunk {chunk_id} is not registered "
                         "(never, or deleted, or evicted): register it again")


class IncompatibleChunksError(_errors.InvalidArgumentError):
    """Chunks that cannot be composed: a wrong type in a position (a context
    given as the system prompt...), a chain that does not continue, or a pool
    whose layout is not the model's. ``chunk_id`` names the chunk when one is
    to blame."""

    def __init__(self, message: str, chunk_id: Optional[str] = None) -> None:
        self.chunk_id = chunk_id
        super().__init__(_errno.EINVAL, message)


class OutOfMemoryError(_errors.PoolFullError):
    """The pool (or this tenant's chunk limits) cannot take the KV even after
    evicting unheld chunks: ``evict_unused_chunks()`` or delete some."""

    def __init__(self, message: str) -> None:
        super().__init__(_errno.ENOMEM, message)


# ---------------------------------------------------------------- types
class ChunkType(str, Enum):
    """A chunk's role. The strings ("system_prompt", "context", "query"; also
    the daemon's "system") are accepted wherever a ChunkType is."""

    SYSTEM_PROMPT = "system_prompt"
    CONTEXT = "context"
    QUERY = "query"

    @classmethod
    def of(cls, x: Union["ChunkType", str]) -> "ChunkType":
        if isinstance(x, ChunkType):
            return x
        s = str(x).strip().lower()
        s = {"system": "system_prompt", "sys": "system_prompt"}.get(s, s)
        try:
            return cls(s)
        except ValueError:
            raise ValueError(f"chunk type {x!r}: one of system_prompt, context, query") \
                from None

    @property
    def daemon(self) -> str:
        """The daemon's name of the type: system, context or query."""
        return "system" if self is ChunkType.SYSTEM_PROMPT else self.value

    @classmethod
    def from_daemon(cls, s: str) -> "ChunkType":
        return cls.of(s)

    def __str__(self) -> str:
        return self.value


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


@dataclass
class SamplingParams:
    """temperature (0: greedy), max_tokens, top_p, top_k (0: off), seed (None:
    random), stop_token_ids, ignore_eos. ChunkedLLM takes a dict with these
    keys, an object with these attributes (nano-vllm's SamplingParams), or
    None (the defaults)."""

    temperature: float = 1.0
    max_tokens: int = 64
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop_token_ids: Tuple[int, ...] = ()
    ignore_eos: bool = False

    @classmethod
    def of(cls, sp: Any) -> "SamplingParams":
        if sp is None or sp is ... or (isinstance(sp, (set, frozenset)) and sp <= {...}):
            return cls()      # None, or the seeds' placeholder `{...}`: the defaults
        if isinstance(sp, (set, frozenset, str, bytes, list, tuple)):
            raise TypeError(f"sampling_params: a dict, a SamplingParams or None, not "
                            f"{type(sp).__name__} {sp!r}")
        if isinstance(sp, SamplingParams):
            return sp
        get = (lambda k, d: sp.get(k, d)) if isinstance(sp, Mapping) \
            else (lambda k, d: getattr(sp, k, d))
        if isinstance(sp, Mapping):
            unknown = set(sp) - {"temperature", "max_tokens", "top_p", "top_k", "seed",
                                 "stop_token_ids", "stop", "ignore_eos"}
            if unknown:
                raise ValueError(f"sampling_params: unknown keys {sorted(unknown)}")
        stop = get("stop_token_ids", None)
        if stop is None:
            s = get("stop", None)
            stop = s if isinstance(s, (list, tuple)) and all(isinstance(t, int) for t in s) \
                else ()
        p = cls(temperature=float(get("temperature", 1.0)),
                max_tokens=int(get("max_tokens", 64)),
                top_p=float(get("top_p", 1.0) or 1.0), top_k=int(get("top_k", 0) or 0),
                seed=get("seed", None), stop_token_ids=tuple(int(t) for t in stop),
                ignore_eos=bool(get("ignore_eos", False)))
        if p.max_tokens < 1:
            raise ValueError("sampling_params: max_tokens is at least 1")
        if p.temperature < 0 or not 0 < p.top_p <= 1 or p.top_k < 0:
            raise ValueError(f"sampling_params: temperature >= 0, 0 < top_p <= 1, top_k >= 0 "
                             f"({p})")
        return p


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


def _is_sampling(x: Any) -> bool:
    """Whether a positional argument is sampling params (not a context)."""
    if isinstance(x, SamplingParams) or x is ... or \
            (isinstance(x, (set, frozenset)) and x <= {...}):
        return True
    if isinstance(x, Mapping):
        return True
    return not isinstance(x, (str, bytes, list, tuple)) and hasattr(x, "temperature")


def _iso(ns: int) -> str:
    t = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _is_hex_id(s: Any) -> bool:
    if not isinstance(s, str) or len(s) != 64:
        return False
    try:
        int(s, 16)
        return True
    except ValueError:
        return False


class ChunkedLLM:
    """Seed 001's ChunkedLLM over kvpool (see the module doc).

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
            from .hf_llm import HFAdapter  # noqa: PLC0415
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

    # ------------------------------------------------------------ errors
    @contextlib.contextmanager
    def _errs(self, chunk_id: Optional[str] = None) -> Iterator[None]:
        try:
            yield
        except (ChunkNotFoundError, IncompatibleChunksError, OutOfMemoryError):
            raise
        except _errors.NotFoundError as e:
            cid = chunk_id or "?"
            raise ChunkNotFoundError(cid, f"chunk {cid}: {e}") from e
        except _errors.PoolFullError as e:
            raise OutOfMemoryError(str(e)) from e
        except _errors.InvalidArgumentError as e:
            raise IncompatibleChunksError(str(e), chunk_id) from e

    def _check_id(self, chunk_id: Any) -> str:
        if isinstance(chunk_id, ChunkType) or not _is_hex_id(chunk_id):
            raise ChunkNotFoundError(str(chunk_id), f"{chunk_id!r} is not a chunk id (64 hex "
                                     "digits, as register_chunk returns)")
        return chunk_id.lower()

    def _name(self, chunk_id: str) -> Tuple[ChunkType, List[int]]:
        """(type, tokens) of a name, as the daemon holds it now.

        A name is the hash of a text, and the same text may have been
        registered with other tokens since this process last looked (deleted,
        then registered by a process with another tokenizer): the tokens kept
        here are used only while the name's root entry -- whose id the daemon
        derives from the tokens -- or its record (created_ns and token count)
        is the one they were read with; otherwise they are read again."""
        cid = self._check_id(chunk_id)
        with self._errs(cid):
            info = self.client.chunk_get(cid)
        ct = ChunkType.from_daemon(info["type"])
        root, made = info.get("root") or None, int(info.get("created_ns", 0))
        got = self._names.get(cid)
        if got is not None and len(got[1]) == int(info["tokens"]) and \
                ((root is not None and root == got[2]) or (made and made == got[3])):
            toks = got[1]
        else:
            with self._errs(cid):
                toks = self._model_tokens(self.client.chunk_tokens(cid))
        self._names[cid] = (ct, toks, root, made)
        return ct, toks

    # ------------------------------------------------------------ forward
    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, plan: Plan) -> torch.Tensor:
        dev = getattr(self.adapter, "device", None) or self.device
        self.counters["forwards"] += 1
        with torch.no_grad():
            return self.adapter.forward(tokens.to(dev), positions.to(dev), plan).float()

    def _prefill(self, tokens: Sequence[int], start: int, past: List[Level],
                 lease: Any, first: int = 0, kind: str = "prefill_tokens"
                 ) -> torch.Tensor:
        """Compute tokens at positions start.. (one row) over the past levels,
        storing their K/V at tokens first.. of ``lease``'s page table (whose
        tokens before ``first`` are earlier tokens of the same span) through
        libkvpool, so its lease checks cover the writes. Long spans go in
        pieces of prefill_chunk. Returns the last logits [vocab]."""
        P = self.page_tokens
        table = lease.kv_indices()
        n = len(tokens)
        logits = None
        done = 0
        while done < n:
            m = min(self.prefill_chunk, n - done)
            levels = list(past)
            if first + done:
                levels.append(Level.from_tables([(table, first + done, 1)], P))
            store = [(lease, first + done - lease.len)]  # through libkvpool
            plan = Plan(self._caches, 1, m, levels, store=store, device=self.device)
            t = torch.tensor([list(tokens[done:done + m])], dtype=torch.int64)
            pos = torch.arange(start + done, start + done + m, dtype=torch.int64)[None]
            logits = self._forward(t, pos, plan)[0]
            done += m
        self.counters[kind] += n
        return logits

    def _sync(self) -> None:
        if getattr(self.client, "cuda_device", -1) >= 0 and torch.cuda.is_available():
            torch.cuda.current_stream(self.client.cuda_device).synchronize()

    def _seal(self, reg: Dict[str, Any]) -> None:
        self._sync()
        lease = reg.get("lease")
        if lease is not None and hasattr(lease, "seal"):
            lease.seal()
        else:
            self.client.chunk_seal(reg)

    def _fill(self, reg: Dict[str, Any], tokens: Sequence[int], past: List[Level]
              ) -> torch.Tensor:
        """Prefill a created entry (root or link) and seal it; on failure
        the fill lease is released unsealed (the daemon drops the entry)."""
        lease = reg["lease"]
        try:
            if int(reg["tokens"]) != len(tokens):
                raise IncompatibleChunksError(
                    f"entry {reg['id']} has {reg['tokens']} tokens, its name {len(tokens)}")
            logits = self._prefill(tokens, int(reg["start"]), past, lease)
            self._seal(reg)
            return logits
        except BaseException:
            with contextlib.suppress(Exception):
                lease.release()
            raise

    # ------------------------------------------------------------ chunks
    def register_chunk(self, content: Any, chunk_type: Union[ChunkType, str],
                       metadata: Optional[Dict[str, Any]] = None) -> str:
        """Register a chunk and prefill its KV now (as a prompt of its own,
        at position 0). content: text (tokenized with the tokenizer) or token
        ids. metadata: a JSON-serialisable dict (list_chunks filters on it).
        Returns the chunk_id: SHA-256 of the content. The text is tokenized
        first and the KV found by the tokens: the same tokens again (in any
        process attached to the daemon) are a hit, nothing computed. When
        the text's name already holds other tokens (a process with another
        tokenizer registered it), these tokens get a chunk of their own,
        named by the SHA-256 of the tokens (as for token-id content) and kept
        without the text: each tokenizer gets the KV of its own tokens. The
        same content registered as another type raises
        IncompatibleChunksError."""
        return self._register(content, chunk_type, metadata)[0]

    def _register(self, content: Any, chunk_type: Union[ChunkType, str],
                  metadata: Optional[Dict[str, Any]] = None) -> Tuple[str, bool]:
        ct = ChunkType.of(chunk_type)
        tokens, data = self._tokens_of(content)
        if not tokens:
            raise ValueError("register_chunk: the content has no tokens")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError("metadata: a dict")
        meta = json.dumps(dict(metadata), sort_keys=True) if metadata else None
        if not self.enable_deduplication:
            return _chunk_copy.register(self, tokens, ct, metadata, data)
        with self._lock, self._errs():
            reg = self._put(tokens, ct, meta, data)
            if reg["created"]:
                self.counters["roots_created"] += 1
                self._fill(reg, tokens, [])
            else:
                self.counters["root_hits"] += 1
        name = reg["name"]
        self._names[name] = (ct, tokens, reg["id"], 0)
        return name, bool(reg["created"])

    def _put(self, tokens: List[int], ct: ChunkType, meta: Optional[str],
             data: Optional[bytes]) -> Dict[str, Any]:
        """Register a root by its tokens. The daemon finds the entry by the
        tokens (its id is their hash with the layout and the tenant's salt)
        and names it by the text; when the text's name already holds other
        tokens -- a process with another tokenizer registered the same text
        -- these tokens are registered under a name of their own, the hash
        of the tokens (no content kept with it), so this process gets the KV
        of its own tokens and the other keeps its own."""
        try:
            return self.client.chunk_register(tokens, ct.daemon, meta=meta, content=data)
        except _errors.InvalidArgumentError:
            if data is None or not self._other_tokens(hashlib.sha256(data).hexdigest(),
                                                      tokens):
                raise
        return self.client.chunk_register(tokens, ct.daemon, meta=meta, content=None)

    def _other_tokens(self, name: str, tokens: List[int]) -> bool:
        """Whether name is registered with tokens other than these."""
        try:
            return list(self.client.chunk_tokens(name)) != list(tokens)
        except _errors.NotFoundError:
            return False

    def _row(self, d: Dict[str, Any]) -> Dict[str, Any]:
        try:
            meta = json.loads(d.get("meta") or "{}")
        except ValueError:
            meta = {"_raw": d.get("meta")}
        copy = isinstance(meta, dict) and _chunk_copy.META in meta
        if copy:
            meta = {k: v for k, v in meta.items() if k != _chunk_copy.META}
        preview = (d.get("preview") or "").split("\0")[0]
        clen = int(d.get("content_len", 0)) - (_chunk_copy.TAG_LEN if copy else 0)
        if clen > len(preview.encode("utf-8")):
            preview += "..."
        created = int(d.get("created_ns", 0))
        last = int(d.get("last_access_ns", 0)) or created
        return {
            "chunk_id": d["id"],
            "chunk_type": ChunkType.from_daemon(d["type"]).value,
            "content_preview": preview,
            "token_count": int(d["tokens"]),
            "metadata": meta if isinstance(meta, dict) else {"_value": meta},
            "created_at": _iso(created),
            "last_accessed": _iso(last),
            "access_count": int(d.get("hits", 0)),
        }

    def list_chunks(self, chunk_type: Union[ChunkType, str, None] = None,
                    metadata_filter: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
        """Rows as seed 001 shows them (chunk_id, chunk_type, content_preview,
        token_count, metadata, created_at, last_accessed, access_count), of
        every chunk of this tenant, or of one type, or those whose metadata
        has every key of metadata_filter with an equal value."""
        t = ChunkType.of(chunk_type).daemon if chunk_type is not None else None
        f = json.dumps(metadata_filter, sort_keys=True) if metadata_filter else None
        with self._errs():
            rows = self.client.chunk_list(t, f)
        return [self._row(d) for d in rows]

    def get_chunk(self, chunk_id: str) -> Dict[str, Any]:
        """A list row plus ``content`` (the registered text), ``token_ids``,
        ``state``, ``entries`` (KV entries: its root and links), ``pages`` and
        ``bytes``. ChunkNotFoundError when it is not registered."""
        cid = self._check_id(chunk_id)
        with self._errs(cid):
            d = self.client.chunk_get(cid)
            content = self.client.chunk_content(cid)
            toks = self._model_tokens(self.client.chunk_tokens(cid))
        row = self._row(d)
        try:        # registered with enable_deduplication=False
            row["copy"] = _chunk_copy.META in json.loads(d.get("meta") or "{}")
        except (ValueError, TypeError):
            row["copy"] = False
        if row["copy"]:
            content = _chunk_copy.strip(content)
        row.update(content=content.decode("utf-8", "replace"), token_ids=toks,
                   state=d.get("state"), entries=d.get("entries"), pages=d.get("pages"),
                   bytes=d.get("bytes"), holders=d.get("holders"), root=d.get("root"))
        return row

    def delete_chunk(self, chunk_id: str) -> None:
        """Delete a chunk: its root and every entry made from it (links under
        system prompts) and everything composed after those. Their frames go
        back to the pool as soon as no one holds them."""
        cid = self._check_id(chunk_id)
        with self._errs(cid):
            self.client.chunk_delete(cid)
        self._names.pop(cid, None)

    def clear_chunks(self, chunk_type: Union[ChunkType, str, None] = None) -> int:
        """Delete every chunk (of a type); returns how many."""
        t = ChunkType.of(chunk_type).daemon if chunk_type is not None else None
        with self._errs():
            n = self.client.chunk_clear(t)
        self._names.clear()
        return int(n)

    def evict_unused_chunks(self, max_age_seconds: float = 3600) -> int:
        """Delete chunks nobody holds that were not used for max_age_seconds;
        returns how many."""
        with self._errs():
            n = self.client.chunk_evict_unused(int(max_age_seconds))
        self._names.clear()
        return int(n)

    def get_chunk_stats(self) -> Dict[str, Any]:
        """total_chunks, chunks_by_type, total_tokens, memory_used_mb (the
        pages of every chunk entry), cache_hits / cache_lookups / hit_rate
        (the daemon's chunk registrations, links, acquires and compositions
        that found the KV there), evicted, limits, and this object's own
        counters (prefill/recompute/decode tokens, links created/hit)."""
        with self._errs():
            rows = self.client.chunk_list()
            st = self.client.stats()
        by_type = {t.value: 0 for t in ChunkType}
        for r in rows:
            by_type[ChunkType.from_daemon(r["type"]).value] += 1
        flat = st.get("device", st) if isinstance(st, dict) else {}
        g = (lambda k: int(st.get(k, flat.get(k, 0)) if isinstance(st, dict) else 0))
        hits, lookups = g("chunk_hits"), g("chunk_lookups")
        mem = g("chunk_bytes") or sum(int(r.get("bytes", 0)) for r in rows)
        return {
            "total_chunks": len(rows),
            "chunks_by_type": by_type,
            "total_tokens": sum(int(r["tokens"]) for r in rows),
            "memory_used_mb": mem / 2 ** 20,
            "memory_used_bytes": mem,
            "chunk_pages": g("chunk_pages"),
            "cache_hits": hits,
            "cache_lookups": lookups,
            "hit_rate": hits / lookups if lookups else 0.0,
            "evicted": g("chunk_evicted"),
            "limits": dict(self.limits) if isinstance(self.limits, dict) else {},
            **{f"local_{k}": v for k, v in self.counters.items()},
        }

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

    # ------------------------------------------------------------ generation
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

    def _sample(self, logits: torch.Tensor, sp: SamplingParams,
                gen: Optional[torch.Generator]) -> List[int]:
        if sp.temperature <= 0:
            return logits.argmax(-1).tolist()
        x = logits.float().cpu() / sp.temperature
        if sp.top_k and sp.top_k < x.shape[-1]:
            kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        if sp.top_p < 1.0:
            sx, si = torch.sort(x, dim=-1, descending=True)
            cum = sx.softmax(-1).cumsum(-1)
            drop = cum - sx.softmax(-1) > sp.top_p
            sx = sx.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(-1, si, sx)
        probs = x.softmax(-1)
        return torch.multinomial(probs, 1, generator=gen).reshape(-1).tolist()

    def _generate(self, levels: List[Level], base: List[int], sp: SamplingParams, *,
                  logits0: Optional[torch.Tensor] = None,
                  recompute: Optional[List[int]] = None,
                  feed: Optional[List[List[int]]] = None,
                  prefix: Optional[List[Tuple[str, ...]]] = None
                  ) -> Iterator[Tuple[int, List[Optional[int]], List[Optional[str]]]]:
        """The decode loop over B rows whose chains (``levels``) hold base[b]
        tokens. The first logits: given (logits0 [B, V]), or recomputed for
        the chain's last token (recompute: its ids; the last level is
        trimmed by one for it), or from a prefill of ``feed`` (per row, equal
        lengths) into the rows' own sequences. Yields (step, the token each
        row produced this step or None once finished, finish reasons);
        on exit the rows' sequences are committed and recorded in
        ``self._gen_rows``."""
        B = len(base)
        P = self.page_tokens
        M = sp.max_tokens
        nfeed = len(feed[0]) if feed else 0
        cap = max(nfeed + M - 1, 1)   # a sequence even for one token: it holds it as pending
        eos = None if sp.ignore_eos else self.eos_token_id
        stops = set(sp.stop_token_ids) | ({eos} if eos is not None else set())
        gen = torch.Generator().manual_seed(int(sp.seed)) if sp.seed is not None else None
        leases: List[Any] = []
        seqs: List[int] = []
        out: List[List[int]] = [[] for _ in range(B)]
        reason: List[Optional[str]] = [None] * B
        tables: List[torch.Tensor] = []
        failed = False
        try:
            for _ in range(B):
                s = self._new_seq_id()
                with self._errs():
                    leases.append(self.client.seq_create(s, [], cap))
                seqs.append(s)
            tables = [ls.kv_indices() for ls in leases]
            own = Level.from_tables([(t, cap, 1) for t in tables], P)

            def plan(n: int, written: int, extra_levels: List[Level],
                     store: bool) -> Plan:
                lv = list(extra_levels)
                if own is not None and written:
                    lv.append(own.with_lengths(written))
                # Through libkvpool: each row's lease checks its writes.
                st = [(ls, written) for ls in leases] if store else None
                return Plan(self._caches, B, n, lv, store=st, device=self.device)

            base_t = torch.tensor(base, dtype=torch.int64)
            # ---- the first logits
            if logits0 is not None:
                logits = logits0.reshape(B, -1)
            elif recompute is not None:
                trimmed = levels[:-1] + [levels[-1].trimmed(1)]
                p = Plan(self._caches, B, 1, trimmed, device=self.device)
                logits = self._forward(torch.tensor(recompute, dtype=torch.int64)[:, None],
                                       (base_t - 1)[:, None], p)
                self.counters["recompute_tokens"] += B
            else:
                assert feed is not None and nfeed > 0
                done = 0
                logits = None
                while done < nfeed:
                    m = min(self.prefill_chunk, nfeed - done)
                    p = plan(m, done, levels, True)
                    t = torch.tensor([f[done:done + m] for f in feed], dtype=torch.int64)
                    pos = base_t[:, None] + torch.arange(done, done + m)[None, :]
                    logits = self._forward(t, pos, p)
                    done += m
                self.counters["prefill_tokens"] += B * nfeed
            # ---- decode
            if self.keep_chain_kv:
                levels = [Level(lv.pages, lv.lengths, lv.row_group, lv.page_tokens,
                                keep_kv=True) for lv in levels]
            step = 0
            while True:
                toks = self._sample(logits, sp, gen)
                live: List[Optional[int]] = []
                for b in range(B):
                    if reason[b] is not None:
                        live.append(None)
                        continue
                    out[b].append(toks[b])
                    live.append(toks[b])
                    if toks[b] in stops:
                        reason[b] = "stop"
                    elif len(out[b]) >= M:
                        reason[b] = "length"
                yield step, live, list(reason)
                if all(r is not None for r in reason):
                    break
                # feed each row's last token (finished rows repeat theirs; unused)
                written = nfeed + step
                p = plan(1, written, levels, True)
                cur = torch.tensor([o[-1] for o in out], dtype=torch.int64)[:, None]
                pos = (base_t + nfeed + step)[:, None]
                logits = self._forward(cur, pos, p)
                self.counters["decode_tokens"] += B
                step += 1
        except GeneratorExit:   # a stream closed after (or before) its last token
            raise
        except BaseException:
            failed = True
            raise
        finally:
            self._sync()
            rows: List[_Seq] = []
            if failed:          # nothing half-written is kept: the sequences go
                for b, ls in enumerate(leases):
                    with contextlib.suppress(Exception):
                        ls.release()
                    self._free_seq(seqs[b])
                leases = []
            for b in range(len(leases)):
                kv = nfeed + max(len(out[b]) - 1, 0)   # tokens of this row with KV
                ls = leases[b]
                try:
                    if kv:
                        ls.commit(kv)
                finally:
                    with contextlib.suppress(Exception):
                        ls.release()
                tab = tables[b] if b < len(tables) else ls.kv_indices()
                st = _Seq(seq=seqs[b], table=tab, start=base[b], tokens=kv,
                          pending=out[b][-1:] if out[b] else [],
                          prefix=prefix[b] if prefix else (),
                          token_ids=(feed[b] if feed else []) + out[b])
                self._seqs[seqs[b]] = st
                rows.append(st)
            self._gen_rows = rows
            self._gen_out = out
            self._gen_reason = reason

    def _run(self, it: Iterator[Any]) -> None:
        for _ in it:
            pass

    def _result(self, b: int, prompt_tokens: int, **extra: Any) -> Dict[str, Any]:
        ids = list(self._gen_out[b])
        return {"text": self._decode(ids), "token_ids": ids,
                "finish_reason": self._gen_reason[b], "prompt_tokens": prompt_tokens,
                "completion_tokens": len(ids), **extra}

    def _chain_levels(self, comp: Any, rows: int) -> List[Level]:
        return [Level.from_csr(lv, self.page_tokens, rows=rows, qo_len=1)
                for lv in comp.levels]

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
        from .vseq import VirtualSequence  # noqa: PLC0415
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
