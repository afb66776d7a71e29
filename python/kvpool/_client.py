# SPDX-License-Identifier: MIT
"""Client and Lease: the C types of kvpool._kvpool plus the torch side.

The calls themselves (info, prepare, commit, ...) are the C methods, so they
cost what the C call costs plus argument conversion. What is added here is
Python: the device tier as torch tensors and numpy arrays without a copy,
appends from tensors, the page-table tensors FlashInfer and the HSTU kernels
take, and compositions as objects.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _kvpool

if TYPE_CHECKING:  # torch is imported only when a tensor is asked for
    import torch

_DTYPE_IDS = {"bf16": 1, "fp16": 2, "fp8_e4m3": 3, "fp32": 4}


def _torch():
    import torch  # noqa: PLC0415 - optional dependency, imported on use
    return torch


def torch_dtype(name: str) -> "torch.dtype":
    """The torch dtype of a kvpool dtype name (fp8_e4m3: float8_e4m3fn where
    torch has it, else uint8 holding the bits)."""
    torch = _torch()
    if name == "fp8_e4m3":
        return getattr(torch, "float8_e4m3fn", torch.uint8)
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def as_tensor(view: "_kvpool.View") -> "torch.Tensor":
    """A torch tensor sharing the view's memory (DLPack; no copy). The tensor
    keeps the view, and so the client's mapping, alive."""
    torch = _torch()
    t = torch.utils.dlpack.from_dlpack(view)
    if view.dtype == "fp8_e4m3" and hasattr(torch, "float8_e4m3fn"):
        t = t.view(torch.float8_e4m3fn)
    return t


class Lease(_kvpool.Lease):
    """A lease: pinned pages, their page table and the slots of its new tokens.

    Made by :meth:`Client.prepare` (and seq_alloc / seq_create / seq_extend /
    chunk_register / chunk_acquire). Use it as a context manager: it is
    released at the end of the block and committed only when you call
    :meth:`commit`::

        with client.prepare(user, info.start + info.len, n) as lease:
            lease.append(kv)          # [n, layers, 2, kv_heads, head_dim]
            lease.commit()

    Token ``i`` of the lease's new tokens is history position ``len + i``
    (counted from the history's start): page ``(len + i) // page_tokens`` of
    the page table, slot ``(len + i) % page_tokens`` in that frame.
    """

    __slots__ = ()

    # ------------------------------------------------------------ page table
    def kv_indices(self, device: Any = None) -> "torch.Tensor":
        """The page table as an int32 tensor (FlashInfer's ``kv_indices``)."""
        torch = _torch()
        t = torch.frombuffer(bytearray(self._table), dtype=torch.int32) \
            if self.npages else torch.empty(0, dtype=torch.int32)
        return t.to(device) if device is not None else t

    def kv_indptr(self, device: Any = None) -> "torch.Tensor":
        """``[0, npages]`` as int32 (one request)."""
        torch = _torch()
        return torch.tensor([0, self.npages], dtype=torch.int32, device=device)

    def kv_last_page_len(self, device: Any = None) -> "torch.Tensor":
        """``[last_page_len]`` as int32."""
        torch = _torch()
        return torch.tensor([self.last_page_len], dtype=torch.int32, device=device)

    def slots(self, first: int = 0, n: Optional[int] = None,
              device: Any = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """``(frames, slots)``, int64 tensors: where new tokens
        ``[first, first + n)`` go (default: all n_new)."""
        torch = _torch()
        if n is None:
            n = self.n_new - first
        pos = torch.arange(self.len + first, self.len + first + n, dtype=torch.int64)
        P = self.client.layout["page_tokens"]
        table = self.kv_indices().to(torch.int64)
        frames, slot = table[pos // P], pos % P
        if device is not None:
            frames, slot = frames.to(device), slot.to(device)
        return frames, slot

    # ------------------------------------------------------------ views
    def page(self, i: int, layer: Optional[int] = None) -> "torch.Tensor":
        """Page ``i`` of the lease as a tensor on the pool (no copy):
        ``[layers, 2, page_tokens, kv_heads, head_dim]``, or one layer's
        ``[2, page_tokens, kv_heads, head_dim]``."""
        if not 0 <= i < self.npages:
            raise IndexError(f"page {i} of a lease of {self.npages} pages")
        frame = self.indices[i]
        t = self.client.page(frame)
        return t if layer is None else t[layer]

    def gather(self, layer: int, n_tokens: Optional[int] = None
               ) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """K and V of the first ``n_tokens`` tokens of the page table (default:
        ``len + n_new``, history and new tokens) of one layer, as contiguous
        ``[n_tokens, kv_heads, head_dim]`` tensors: a copy (what an attention
        kernel without paging would read)."""
        torch = _torch()
        if n_tokens is None:
            n_tokens = self.len + self.n_new
        P = self.client.layout["page_tokens"]
        pos = torch.arange(n_tokens, dtype=torch.int64)
        table = self.kv_indices().to(torch.int64)
        cache = self.client.layer(layer)
        frames, slot = table[pos // P].to(cache.device), (pos % P).to(cache.device)
        return cache[frames, 0, slot], cache[frames, 1, slot]

    # ------------------------------------------------------------ append
    def append(self, kv: Any, first: int = 0) -> None:
        """Write K and V of new tokens ``[first, first + n)``, all layers, from
        ``kv`` of shape ``[n, layers, 2, kv_heads, head_dim]`` in the pool's
        dtype: a torch tensor where the pool is (cpu on shm, the pool's GPU on
        cuda), a DLPack capsule or ``__dlpack__`` object, or a buffer (numpy
        array, bytes) of whole tokens. Anything else is a TypeError. A
        tensor is read only within its storage (its claimed shape is checked
        against what is allocated). On the cuda backend a torch tensor is
        copied on the current torch stream (kvp_append_async); commit()
        waits for it. The lease checks are the library's: a released,
        committed or foreign lease raises StaleLeaseError and writes nothing."""
        _kvpool.Lease.append(self, kv, first)

    def append_layers(self, k: Sequence[Any], v: Sequence[Any], first: int = 0) -> None:
        """Write new tokens ``[first, first + n)`` from per-layer tensors:
        ``k[layer]`` and ``v[layer]`` of shape ``[n, kv_heads, head_dim]``
        (kvp_append_layers_async; current torch stream on cuda)."""
        _kvpool.Lease.append_layers(self, list(k), list(v), first)

    def append_layer(self, layer: int, k: "torch.Tensor", v: "torch.Tensor",
                     first: int = 0) -> None:
        """Write one layer's K and V (``[n, kv_heads, head_dim]``) of new tokens
        ``[first, first + n)`` into the pages (kvp_append_layer_async: the
        library's lease checks and commit ordering, on the current torch
        stream on cuda) -- the HSTU model's per-layer append. Torch K and V
        are converted to the pool's dtype and made contiguous when they are
        not."""
        if _is_tensor(k) and _is_tensor(v):
            want = torch_dtype(self.client.layout["dtype"])
            try:
                k = k.detach().to(want).contiguous()
                v = v.detach().to(want).contiguous()
            except RuntimeError as e:   # torch's own checks (sizes past the storage)
                raise ValueError(f"append_layer: torch cannot use this tensor ({e}); "
                                 "nothing was written") from e
        _kvpool.Lease.append_layer(self, layer, k, v, first)

    def commit(self, n: Optional[int] = None) -> int:
        """Make the first ``n`` new tokens (default: all) part of the history
        (kvp_commit); the other reserved slots are given back. Once per lease
        (AlreadyError on a second). Appends through the lease raise
        StaleLeaseError afterwards; the pages stay pinned until release()."""
        if self.client.cuda_device >= 0:
            _sync_device(self.client.cuda_device)
        return _kvpool.Lease.commit(self, n)


def _is_tensor(t: Any) -> bool:
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(t, torch.Tensor)


def _sync_device(device: int) -> None:
    """Torch-side writes into the pool (append_layer) are on the current
    stream, which libkvpool does not see: finish them before a commit makes
    the tokens visible to other processes."""
    torch = _torch()
    if torch.cuda.is_available():
        torch.cuda.current_stream(device).synchronize()


_kvpool._register_lease_class(Lease)


class Composition:
    """Cascade page tables of kvp_compose (FlashInfer's multi-level cascade):
    ``levels[i]`` is a dict of int32 tensors ``qo_indptr``, ``kv_indptr``,
    ``kv_indices``, ``kv_last_page_len`` and ``ngroups``. The chunks stay
    held until :meth:`release` (or the end of a with block); a preview holds
    nothing (``lease == 0``)."""

    def __init__(self, client: "Client", d: Dict[str, Any]) -> None:
        self.client = client
        self.lease: int = d["lease"]
        self.nlevels: int = d["nlevels"]
        self.nrequests: int = d["nrequests"]
        self.tokens: int = d["tokens"]
        self.pages: int = d["pages"]
        self.bytes: int = d["bytes"]
        self._raw = d["levels"]

    @property
    def levels(self) -> List[Dict[str, Any]]:
        torch = _torch()

        def t(b: bytes) -> "torch.Tensor":
            return torch.frombuffer(bytearray(b), dtype=torch.int32) if b \
                else torch.empty(0, dtype=torch.int32)
        return [{k: (t(v) if isinstance(v, bytes) else v) for k, v in lv.items()}
                for lv in self._raw]

    def preview(self) -> Dict[str, int]:
        """seed 001's preview: total tokens, cascade levels, memory bytes."""
        return {"total_tokens": self.tokens, "num_levels": self.nlevels,
                "memory_bytes": self.bytes, "pages": self.pages}

    def release(self) -> None:
        """Stop holding the chunks (kvp_release of the composition's lease)."""
        if self.lease and not self.client.closed:
            lease, self.lease = self.lease, 0
            self.client.release(lease)

    def __enter__(self) -> "Composition":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Client(_kvpool.Client):
    """One attach to kvpoold. Make it with :func:`kvpool.connect`; use it as a
    context manager (closed on exit). Every C call of kvpool.h is a method
    (info, prepare, commit, release, offload, evict, stats, users, clients,
    queue_*/submit/reap, prefix_lookup, seq_*, chunk_*, compose); the device
    tier is available as tensors without a copy (:meth:`tier`,
    :meth:`layer`, :meth:`page`). One thread at a time uses the library: a
    lock serialises calls made from several threads."""

    # ------------------------------------------------------------ views
    def tier_view(self) -> "_kvpool.View":
        """The whole device tier: ``[frames, layers, 2, page_tokens, kv_heads,
        head_dim]`` (a View: DLPack, buffer protocol, CUDA array interface)."""
        L = self.layout
        shape = (self.device_frames, L["layers"], 2, L["page_tokens"], L["kv_heads"],
                 L["head_dim"])
        return self._view(0, shape, _contiguous_strides(shape))

    def layer_view(self, layer: int) -> "_kvpool.View":
        """One layer in FlashInfer's NHD paged shape ``[frames, 2, page_tokens,
        kv_heads, head_dim]``, page stride = the page's elements."""
        L = self.layout
        if not 0 <= layer < L["layers"]:
            raise IndexError(f"layer {layer} of {L['layers']}")
        e = L["elem_bytes"]
        shape = (self.device_frames, 2, L["page_tokens"], L["kv_heads"], L["head_dim"])
        strides = (L["page_bytes"] // e, L["kv_stride"] // e, L["token_stride"] // e,
                   L["head_stride"] // e, 1)
        return self._view(layer * L["layer_stride"], shape, strides)

    def page_view(self, frame: int) -> "_kvpool.View":
        """One frame: ``[layers, 2, page_tokens, kv_heads, head_dim]``."""
        L = self.layout
        if not 0 <= frame < self.device_frames:
            raise IndexError(f"frame {frame} of {self.device_frames}")
        shape = (L["layers"], 2, L["page_tokens"], L["kv_heads"], L["head_dim"])
        return self._view(frame * L["page_bytes"], shape, _contiguous_strides(shape))

    def tier(self) -> "torch.Tensor":
        """The device tier as one torch tensor (no copy) on the pool's device:
        ``[frames, layers, 2, page_tokens, kv_heads, head_dim]``."""
        return as_tensor(self.tier_view())

    def layer(self, layer: int) -> "torch.Tensor":
        """Layer ``layer``'s paged KV cache as a torch tensor (no copy):
        ``[frames, 2, page_tokens, kv_heads, head_dim]`` (FlashInfer NHD),
        the ``paged_kv_cache`` to pass with a lease's ``kv_indices``. A new
        tensor object each call (all of them share the one mapping): keep it
        rather than the Client asking again in a hot loop."""
        return as_tensor(self.layer_view(layer))

    def page(self, frame: int) -> "torch.Tensor":
        """Frame ``frame`` as a tensor (no copy): ``[layers, 2, page_tokens,
        kv_heads, head_dim]``."""
        return as_tensor(self.page_view(frame))

    def kv_caches(self) -> List["torch.Tensor"]:
        """Every layer's paged KV cache (see :meth:`layer`)."""
        return [self.layer(i) for i in range(self.layout["layers"])]

    @property
    def torch_dtype(self) -> "torch.dtype":
        """The pool's element type as a torch dtype."""
        return torch_dtype(self.layout["dtype"])

    @property
    def device(self) -> "torch.device":
        """Where the pool's tensors live: cpu (shm backend) or cuda:N."""
        torch = _torch()
        return torch.device("cpu") if self.cuda_device < 0 else \
            torch.device("cuda", self.cuda_device)

    # ------------------------------------------------------------ chunks
    def chunk_register(self, tokens: Any, type: Union[str, int],
                       meta: Union[None, str, Dict[str, Any]] = None,
                       content: Union[None, str, bytes] = None) -> Dict[str, Any]:
        """Register a root entry (kvp_chunk_put): ``tokens`` at positions 0..,
        named by SHA-256 of ``content`` (or of the tokens without it), with
        ``meta`` a dict or JSON object text (legacy ``'k=v,k2=v2'`` works
        too). Returns ``{'id': entry hex, 'name': name hex, 'created': bool,
        'state': 'filling'|'ready', 'start': 0, 'tokens': n, 'lease': Lease or
        None}``; when created, fill ``lease`` (append) and seal it
        (:meth:`chunk_seal`, ``lease.seal()`` or the end of its with block).
        A hit allocates nothing. InvalidArgumentError when the name is
        registered with other tokens or type; TooBigError content over
        kvpoold's chunk_content_max; PoolFullError limits or device full."""
        if isinstance(meta, dict):
            meta = json.dumps(meta)
        return self._chunk_register(tokens, type, meta, content)

    def chunk_seal(self, reg: Any) -> Optional[int]:
        """Seal what :meth:`chunk_register` / :meth:`chunk_link` created: the
        dict they returned, or its fill Lease (or one :meth:`join` returned
        for a chunk's fill lease). Nothing to do for a hit (None). Returns 0,
        or 1 (pending) while other ranks of a tensor-parallel group have yet
        to seal."""
        lease = reg.get("lease") if isinstance(reg, dict) else reg
        if lease is not None:
            return lease.seal()
        return None

    def chunk_list(self, type: Union[None, str, int] = None,
                   filter: Union[None, str, Dict[str, Any]] = None) -> List[Dict[str, Any]]:
        """Every name of a type (None: all) whose metadata holds every key of
        ``filter`` (a dict or JSON object text; legacy ``'k=v'``) with an
        equal value, in name order, as :meth:`chunk_get` dicts (all pages)."""
        if isinstance(filter, dict):
            filter = json.dumps(filter)
        return self._chunk_list(type, filter)

    # ------------------------------------------------------------ compose
    def compose(self, requests: Iterable[Any]) -> Composition:
        """Cascade page tables for a batch of requests (kvp_compose): each a
        dict ``{'system': id, 'contexts': [ids], 'query': id, 'qo_len': n}``
        of ENTRY ids that chain (each context linked after the entry before
        it, the query after the last). At every level consecutive requests
        with the same entry share one group. Holds the entries until the
        Composition is released. NotFoundError names an entry that is not
        registered; NotReadyError one being filled; InvalidArgumentError a
        broken chain (with the actual parent) or a wrong type."""
        return Composition(self, self._compose(list(requests)))

    def compose_preview(self, requests: Iterable[Any]) -> Composition:
        """The same without holding anything: tokens, levels, bytes
        (kvp_compose_preview)."""
        return Composition(self, self._compose_preview(list(requests)))


def _contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def src_user(user: int, tokens: int = 0) -> Tuple[str, int, int]:
    """A seq_create source: the first ``tokens`` committed tokens of a user
    history (0: all of them)."""
    return ("user", user, tokens)


def src_chunk(chunk_id: str) -> Tuple[str, str]:
    """A seq_create source: a ready chunk, all of its tokens."""
    return ("chunk", chunk_id)


def src_seq(seq: int) -> Tuple[str, int]:
    """A seq_create source: the committed tokens of another sequence."""
    return ("seq", seq)
