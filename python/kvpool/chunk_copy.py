# SPDX-License-Identifier: MIT
"""kvpool.chunk_copy: ``ChunkedLLM(enable_deduplication=False)``, a chunk of
its own for every registration.

kvpoold keys a chunk's KV by its tokens (an entry's id is the hash of the
layout, the tenant's salt, the parent entry and the token ids) and names it
by its content, so the same content registered again is the same chunk. A
copy therefore differs in both, by a random 8-byte nonce:

- its token ids carry the nonce's bytes in bits 24-31 (the first byte never
  0): the daemon makes an entry of its own, with its own pages, and links
  under it are its own too; ChunkedLLM masks the ids back before the model
  sees them (``TOKEN_MASK``), so only models with token ids below 2**24 can
  make copies;
- its content is the text, a NUL, ``kvpool-copy `` and the nonce in hex, so
  its id (the chunk_id) is SHA-256 of that rather than of the text
  (get_chunk and list_chunks show the text without it);
- its metadata has ``kvpool_copy``: the nonce (list_chunks hides it).

A chunk of fewer than 8 tokens has fewer nonce bytes in its ids (a 1-token
chunk 255 values): a nonce whose ids another copy has is a hit on that copy
(its access count goes up) and another nonce is tried; such a copy gets its
metadata by a second registration (a hit on itself: access_count 1).
"""
from __future__ import annotations

import json
import os
import random
from typing import Any, List, Mapping, Optional, Sequence, Tuple

SHIFT = 24
TOKEN_MASK = (1 << SHIFT) - 1
TAG = b"\0kvpool-copy "
TAG_LEN = len(TAG) + 16          # the tag and the nonce in hex
META = "kvpool_copy"
TRIES = 32


def tokens_of(tokens: Sequence[int], nonce: bytes) -> List[int]:
    """The token ids of a copy (the first len(nonce) carry its bytes)."""
    return [t | (nonce[i] << SHIFT) if i < len(nonce) else t for i, t in enumerate(tokens)]


def strip(content: bytes) -> bytes:
    """A copy's content without its tag."""
    i = content.rfind(TAG)
    return content[:i] if i >= 0 and len(content) - i == TAG_LEN else content


def register(llm: Any, tokens: List[int], ct: Any, metadata: Optional[Mapping[str, Any]],
             data: Optional[bytes]) -> Tuple[str, bool]:
    """Register and prefill a copy; (its chunk id, True)."""
    from .llm import OutOfMemoryError  # noqa: PLC0415 - llm imports this module
    if max(tokens) > TOKEN_MASK:
        raise ValueError(f"enable_deduplication=False stores a nonce in bits {SHIFT}-31 of "
                         f"the token ids; this content has token id {max(tokens)} >= "
                         f"2**{SHIFT}")
    for _ in range(TRIES):
        nonce = bytes([random.randrange(1, 256)]) + os.urandom(7)
        meta = json.dumps(dict(metadata or {}, **{META: nonce.hex()}), sort_keys=True)
        content = None if data is None else data + TAG + nonce.hex().encode()
        # 8 tokens or more carry the whole nonce: ids no other copy has. A
        # shorter chunk's may be another copy's, and a hit merges the
        # metadata given: it registers without, then adds it (a hit on its
        # own entry, counted as one access).
        short = len(tokens) < len(nonce)
        with llm._lock, llm._errs():
            reg = llm.client.chunk_register(tokens_of(tokens, nonce), ct.daemon,
                                            meta=None if short else meta, content=content)
            if not reg["created"]:
                continue
            llm.counters["roots_created"] += 1
            llm._fill(reg, tokens, [])
            try:
                if short:
                    llm.client.chunk_register(tokens_of(tokens, nonce), ct.daemon,
                                              meta=meta, content=content)
            except BaseException:
                llm.client.chunk_delete(reg["name"])
                raise
        llm._names[reg["name"]] = (ct, tokens, reg["id"], 0)
        return reg["name"], True
    raise OutOfMemoryError(f"enable_deduplication=False: no unused nonce for a "
                           f"{len(tokens)}-token chunk after {TRIES} tries (each copy of a "
                           "short chunk needs ids of its own): delete some copies")
