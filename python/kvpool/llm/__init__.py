# SPDX-License-Identifier: MIT
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

The package, one job a module: ``adapter`` (:class:`ModelAdapter`, the
interface; nothing else of kvpool.llm), ``chunks`` (:class:`ChunkType`, the
errors, the chunk methods), ``generate`` (:class:`SamplingParams`, forwards,
prefills, the decode loop), ``blocks`` (:class:`Block`, the block methods),
``core`` (:class:`ChunkedLLM`, composed of those). The names below are
imported from them when first asked for, so ``kvpool.llm.adapter`` (which
``kvpool.hf_llm`` imports) comes without the rest, and ChunkedLLM's lazy
import of kvpool.hf_llm makes no cycle.
"""
from __future__ import annotations

import importlib
from typing import Any, List

__all__ = ["ChunkType", "ModelAdapter", "ChunkedLLM", "Block", "SamplingParams",
           "ChunkNotFoundError", "IncompatibleChunksError", "OutOfMemoryError",
           "register_model_loader", "load_model"]

# Where each name lives (the private ones are kvpool.vseq's and the tests').
_WHERE = {
    "ModelAdapter": ".adapter",
    "ChunkType": ".chunks", "ChunkNotFoundError": ".chunks",
    "IncompatibleChunksError": ".chunks", "OutOfMemoryError": ".chunks",
    "_is_hex_id": ".chunks", "_iso": ".chunks",
    "SamplingParams": ".generate", "_is_sampling": ".generate",
    "Block": ".blocks", "_Seq": ".blocks",
    "ChunkedLLM": ".core",
    "register_model_loader": "..loaders", "load_model": "..loaders",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value     # found once; later lookups do not come here
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_WHERE))
