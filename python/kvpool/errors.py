# SPDX-License-Identifier: MIT
"""kvpool's exceptions.

Every libkvpool call returns ``-errno`` and leaves a message naming what was
wrong (``kvp_last_error``); the binding raises one of these with that message
as ``str(e)`` and the errno as ``e.errno``. All derive from :class:`KvpoolError`
(itself an :class:`OSError`), and where a builtin says the same thing they
derive from it too (``PermissionDeniedError`` is a ``PermissionError``,
``PoolFullError`` a ``MemoryError``, ``NotFoundError`` a ``LookupError``, the
continuity errors ``ValueError``)::

    KvpoolError (OSError)
    ├── ContinuityError (ValueError)   start_pos does not continue the history
    │   ├── GapError                   "... missing tokens from A to B (both inclusive)."
    │   ├── OverlapError               "... overlapping tokens from A to B (both inclusive)."
    │   └── TrimmedError               starts before the first cached token (also
    │                                  an InvalidArgumentError)
    ├── InvalidArgumentError (ValueError)   -EINVAL otherwise
    ├── PoolFullError (MemoryError)    -ENOMEM: everything pinned, nothing changed
    ├── TooBigError (ValueError)       -E2BIG: more than a setting allows (chunk content)
    ├── NotFoundError (LookupError)    -ENOENT: no such chunk / sequence / lease
    ├── StaleLeaseError                -ESTALE: the lease is released, committed or not yours
    ├── BusyError                      -EBUSY: leased, or async operations in flight
    ├── NotReadyError                  -EAGAIN: a chunk still being filled
    ├── AlreadyError                   -EALREADY: e.g. a second commit
    ├── PermissionDeniedError (PermissionError)  -EACCES / -EPERM
    ├── ConnectError (ConnectionError) no kvpoold, or it went away
    ├── ProtocolError                  -EPROTO: the daemon and library disagree
    ├── UnsupportedError               -EOPNOTSUPP / -ENODEV
    └── ClientClosedError              the Client was closed

The class comes from data, never from the message's words: the errno, where
the error was raised (connecting or not), and kvpoold's detail of the error
(kvpool.h ``struct kvp_error_info``: the completion carries its kind and the
token range, proto.h FAILURE DETAIL). ``first`` and ``last`` of a
ContinuityError are that range. The message is for people; its wording may
change.
"""
from __future__ import annotations

import errno as _errno
import re
from typing import Dict, Optional, Tuple, Type

__all__ = [
    "KvpoolError", "ContinuityError", "GapError", "OverlapError", "TrimmedError",
    "InvalidArgumentError", "PoolFullError", "TooBigError", "NotFoundError", "StaleLeaseError",
    "BusyError", "NotReadyError", "AlreadyError", "PermissionDeniedError",
    "ConnectError", "ProtocolError", "UnsupportedError", "ClientClosedError",
    "from_code", "ERROR_NONE", "ERROR_GAP", "ERROR_OVERLAP", "ERROR_TRIMMED",
]

# enum kvp_error_kind (kvpool.h): what kvpoold says an error is about.
ERROR_NONE, ERROR_GAP, ERROR_OVERLAP, ERROR_TRIMMED = 0, 1, 2, 3


class KvpoolError(OSError):
    """A libkvpool call failed. ``errno`` is the error number, ``message``
    (and ``str(e)``) the daemon's or the library's explanation."""

    default_errno = 0

    def __init__(self, code: "int | str" = 0, message: str = "") -> None:
        if isinstance(code, str):  # raised with a message only
            code, message = self.default_errno, code
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message or super().__str__()


class ContinuityError(KvpoolError, ValueError):
    """prepare(): start_pos does not continue the cached history.

    ``first`` and ``last`` are the token positions the error is about (both
    inclusive), from kvpoold's detail of the error (-1 when raised without
    one). ``cached`` (``(start, end)`` of what the cache holds) and
    ``user`` are read from the message for people's convenience, None when
    it does not say; nothing chooses a class or a range by them. Nothing
    was changed."""

    kind = ERROR_NONE

    default_errno = _errno.EINVAL

    def __init__(self, code: "int | str" = _errno.EINVAL, message: str = "",
                 first: int = -1, last: int = -1) -> None:
        super().__init__(code, message)
        self.first, self.last = int(first), int(last)
        self.cached = _parse_cached(self.message)
        self.user = _parse_user(self.message)

    @property
    def range(self) -> Tuple[int, int]:
        """``(first, last)``, both inclusive."""
        return (self.first, self.last)


class GapError(ContinuityError):
    """start_pos is past the end of the cached history: tokens ``first`` to
    ``last`` (both inclusive) are missing; ``first`` is the cached end, where
    the input should start."""

    kind = ERROR_GAP


class OverlapError(ContinuityError):
    """start_pos is inside the cached history: tokens ``first`` (start_pos)
    to ``last`` (both inclusive) are cached already. Remove them and send
    from the cached end."""

    kind = ERROR_OVERLAP


class InvalidArgumentError(KvpoolError, ValueError):
    """-EINVAL: an argument the daemon or the library rejected."""


class TrimmedError(ContinuityError, InvalidArgumentError):
    """start_pos is before the first cached token (max_tokens_per_user
    trimmed the history's head): the input's tokens ``first`` (start_pos)
    to ``last`` can never be cached again; the history goes on from its
    cached end (``Client.info(user)``: start + len)."""

    kind = ERROR_TRIMMED


class PoolFullError(KvpoolError, MemoryError):
    """-ENOMEM: the device tier cannot take it even after eviction (everything
    is pinned); nothing was changed."""


class NotFoundError(KvpoolError, LookupError):
    """-ENOENT: no such chunk, sequence or lease (never, deleted or evicted)."""


class StaleLeaseError(KvpoolError):
    """-ESTALE: the lease was released, fully committed, ended by the daemon, or
    is another client's. Prepare a new one."""

    default_errno = _errno.ESTALE


class BusyError(KvpoolError):
    """-EBUSY: the user is leased, or asynchronous operations are in flight
    (reap them before a synchronous call)."""


class NotReadyError(KvpoolError):
    """-EAGAIN: a chunk is still being filled; acquire again with a wait."""


class AlreadyError(KvpoolError):
    """-EALREADY: done already (a second commit of a lease)."""


class PermissionDeniedError(KvpoolError, PermissionError):
    """-EACCES / -EPERM: not allowed (not in the daemon's allowed uids, an admin
    operation, another client's sequence)."""


class ConnectError(KvpoolError, ConnectionError):
    """No kvpoold at the socket, or the daemon went away."""


class ProtocolError(KvpoolError):
    """-EPROTO: the daemon and the library do not speak the same protocol."""


class UnsupportedError(KvpoolError):
    """-EOPNOTSUPP / -ENODEV: not on this backend or for this client."""


class ClientClosedError(KvpoolError):
    """The Client was closed; connect again."""

    default_errno = _errno.EBADF

    def __init__(self, message: "str | int" = "this kvpool client is closed",
                 *args: object) -> None:
        if isinstance(message, int):  # (errno, text)
            message = str(args[0]) if args else ""
        super().__init__(_errno.EBADF, message)


class TooBigError(KvpoolError, ValueError):
    """-E2BIG: more than a setting or the device tier allows (chunk content
    over kvpoold's chunk_content_max, a chunk of more pages than the tier,
    an input larger than the arena)."""

    default_errno = _errno.E2BIG


_BY_ERRNO: Dict[int, Type[KvpoolError]] = {
    _errno.ENOMEM: PoolFullError,
    _errno.E2BIG: TooBigError,
    _errno.ENOENT: NotFoundError,
    _errno.ESTALE: StaleLeaseError,
    _errno.EBUSY: BusyError,
    _errno.EAGAIN: NotReadyError,
    _errno.EALREADY: AlreadyError,
    _errno.EACCES: PermissionDeniedError,
    _errno.EPERM: PermissionDeniedError,
    _errno.ECONNREFUSED: ConnectError,
    _errno.ECONNRESET: ConnectError,
    _errno.EPIPE: ConnectError,
    _errno.ENOTCONN: ConnectError,
    _errno.ESHUTDOWN: ConnectError,
    _errno.EPROTO: ProtocolError,
    _errno.EOPNOTSUPP: UnsupportedError,
    _errno.ENODEV: UnsupportedError,
    _errno.EINVAL: InvalidArgumentError,
}

# What kvpoold says an error is about -> the class (errno EINVAL).
_BY_KIND: Dict[int, Type[ContinuityError]] = {
    ERROR_GAP: GapError,
    ERROR_OVERLAP: OverlapError,
    ERROR_TRIMMED: TrimmedError,
}

# Connecting: these errnos mean no daemon to talk to (kvp_connect's -ENOENT
# is "no socket at the path"; elsewhere -ENOENT is a missing chunk or lease).
_CONNECT_ERRNOS = frozenset({_errno.ENOENT, _errno.ECONNREFUSED, _errno.ECONNRESET,
                             _errno.EPIPE, _errno.ENOTCONN, _errno.ESHUTDOWN})

# For people only (ContinuityError.cached / .user): never picks a class.
_CACHED = re.compile(r"cache holds (?:tokens )?\[(\d+), (\d+)\)")
_USER = re.compile(r"\buser (\d+)")


def _parse_cached(message: str) -> Optional[Tuple[int, int]]:
    m = _CACHED.search(message)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _parse_user(message: str) -> Optional[int]:
    m = _USER.search(message)
    return int(m.group(1)) if m else None


def from_code(code: int, message: str, connecting: bool = False, kind: int = ERROR_NONE,
              first: int = 0, last: int = 0) -> KvpoolError:
    """The exception for errno ``code`` (positive) and ``message``.

    The class is chosen from data only: ``connecting`` (the error is
    kvp_connect's), ``kind``, ``first`` and ``last`` (kvpoold's detail of
    the error, kvpool.h ``struct kvp_error_info``: a gap, an overlap or a
    trimmed head, with its token range), then the errno. The message's
    words are never looked at.
    """
    cls = _BY_KIND.get(int(kind)) if code == _errno.EINVAL else None
    if cls is not None:
        return cls(code, message, first, last)
    if connecting and code in _CONNECT_ERRNOS:
        return ConnectError(code, message)
    return _BY_ERRNO.get(code, KvpoolError)(code, message)
