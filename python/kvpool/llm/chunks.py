# SPDX-License-Identifier: MIT
"""kvpool.llm.chunks: what a chunk is (:class:`ChunkType`), the errors of the
chunk API, and :class:`ChunkedLLM`'s chunk methods (naming, registration,
listing, deletion, statistics) as a mixin. Registration prefills through the
decode mixin's ``_fill`` (kvpool.llm.generate)."""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno as _errno
import hashlib
import json
import threading
from enum import Enum
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from .. import chunk_copy as _chunk_copy
from .. import errors as _errors

__all__ = ["ChunkType", "ChunkNotFoundError", "IncompatibleChunksError", "OutOfMemoryError"]


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


class ChunkMixin:
    """ChunkedLLM's chunks: a chunk's name (the SHA-256 of its content) and
    its tokens, registration (a root entry, prefilled at position 0), the
    seed's listing and deletion calls, and the mapping of the daemon's
    errors to the chunk API's."""

    # Set by ChunkedLLM.__init__.
    client: Any
    enable_deduplication: bool
    limits: Any
    counters: Dict[str, int]
    _lock: threading.RLock
    _names: Dict[str, Tuple[ChunkType, List[int], Optional[str], int]]

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
