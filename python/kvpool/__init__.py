# SPDX-License-Identifier: MIT
"""kvpool: attach Python inference processes to kvpoold, the shared KV-cache
daemon, with its pages as torch tensors.

    import kvpool

    with kvpool.connect() as c:                 # $KVPOOL_SOCKET, then the default
        info = c.info(user)                     # UserInfo(start, len, ...)
        with c.prepare(user, info.start + info.len, n_new) as lease:
            lease.append(kv)                    # [n_new, layers, 2, kv_heads, head_dim]
            lease.commit()
        cache = c.layer(0)                      # [frames, 2, page_tokens, heads, dim], no copy

Errors are exceptions from kvpool.errors (GapError, OverlapError, PoolFullError,
NotFoundError, StaleLeaseError, PermissionDeniedError, ...), all KvpoolError.
kvpool.hstu.KVCacheManager is a drop-in for the HSTU inference example's GPU
KV-cache manager.
kvpool.hf.KVPoolCache (import kvpool.hf; needs transformers >= 5) is a
HuggingFace transformers Cache whose K/V live in kvpool pages: pass it as
past_key_values to model.generate(). See kvpool(3) for the C calls each method wraps.
kvpool.llm.ChunkedLLM (also kvpool.ChunkedLLM, with ChunkType, ModelAdapter and
the chunk errors; imported on first use, with torch) is seed 001's chunk API on
a model: registration prefills, generation composes cached KV through cascade
attention (kvpool.cascade); ``python3 -m kvpool.chat`` is a REPL over it.
"""
from __future__ import annotations

from typing import Optional

from . import errors
from .errors import (AlreadyError, BusyError, ClientClosedError, ConnectError,
                     ContinuityError, GapError, InvalidArgumentError, KvpoolError,
                     NotFoundError, NotReadyError, OverlapError, PermissionDeniedError,
                     PoolFullError, ProtocolError, StaleLeaseError, TooBigError,
                     TrimmedError, UnsupportedError)
from . import _kvpool
from ._kvpool import (DEFAULT_SOCKET, SEL_ALL, SEL_DEVICE, SEL_HOST, Completion,
                      UserInfo, View, layout_parse)
from ._client import (Client, Composition, Lease, as_tensor, src_chunk, src_seq,
                      src_user, torch_dtype)

__version__ = "0.1.0"

__all__ = [
    "connect", "Client", "Lease", "View", "Composition", "UserInfo", "Completion",
    "as_tensor", "torch_dtype", "src_user", "src_chunk", "src_seq", "layout_parse",
    "library_version", "DEFAULT_SOCKET", "SEL_DEVICE", "SEL_HOST", "SEL_ALL",
    "errors", "KvpoolError", "ContinuityError", "GapError", "OverlapError", "TrimmedError",
    "InvalidArgumentError", "PoolFullError", "TooBigError", "NotFoundError", "StaleLeaseError",
    "BusyError", "NotReadyError", "AlreadyError", "PermissionDeniedError",
    "ConnectError", "ProtocolError", "UnsupportedError", "ClientClosedError",
    "ChunkedLLM", "ChunkType", "ModelAdapter", "ChunkNotFoundError",
    "IncompatibleChunksError", "OutOfMemoryError",
]

# kvpool.llm needs torch: its names are imported when first asked for.
_LLM_NAMES = ("ChunkedLLM", "ChunkType", "ModelAdapter", "ChunkNotFoundError",
              "IncompatibleChunksError", "OutOfMemoryError")


def __getattr__(name: str):
    if name in _LLM_NAMES:
        from . import llm  # noqa: PLC0415
        return getattr(llm, name)
    raise AttributeError(f"module 'kvpool' has no attribute {name!r}")


def connect(socket: Optional[str] = None, name: Optional[str] = None, *,
            pool: int = 0, sq_entries: int = 0, arena_bytes: int = 0,
            spin_us: int = 0, rank: int = 0) -> Client:
    """Attach to kvpoold (kvp_connect) and return a :class:`Client`.

    socket: the daemon's Unix socket; None means ``$KVPOOL_SOCKET``, else
    ``/run/kvpool/kvpoold.sock``. name: shown by ``kvctl clients`` (default:
    the program's name). pool: which of the daemon's pools (one per GPU with
    ``kvpoold --devices=0,1``). sq_entries / arena_bytes / spin_us: ring
    size, arena size and how long a wait spins before it sleeps (0: the
    daemon's defaults). rank: this process's rank in a tensor-parallel pool
    (kvpool.conf ``tp``; 0 otherwise): rank 0 prepares, the others
    :meth:`Client.join` its leases. Raises ConnectError when no daemon answers,
    PermissionDeniedError when it refuses this uid, ProtocolError on a
    version mismatch. Use the Client as a context manager::

        with kvpool.connect() as c:
            print(c.stats()["device"])
    """
    return Client(socket, name, pool=pool, sq_entries=sq_entries,
                  arena_bytes=arena_bytes, spin_us=spin_us, rank=rank)


def library_version() -> int:
    """libkvpool's version: major * 1000 + minor."""
    return _kvpool.version()
