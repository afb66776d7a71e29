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
    │   └── OverlapError               "... overlapping tokens from A to B (both inclusive)."
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
"""
from __future__ import annotations

import errno as _errno
import re
from typing import Dict, Optional, Tuple, Type

__all__ = [
    "KvpoolError", "ContinuityError", "GapError", "OverlapError",
    "InvalidArgumentError", "PoolFullError", "TooBigError", "NotFoundError", "StaleLeaseError",
    "BusyError", "NotReadyError", "AlreadyError", "PermissionDeniedError",
    "ConnectError", "ProtocolError", "UnsupportedError", "ClientClosedError",
    "from_code",
]


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

    ``first`` and ``last`` are the token positions named (both inclusive);
    ``cached`` is ``(start, end)`` of what the cache holds when the message
    says so, else None. Nothing was changed."""

    kind = ""

    default_errno = _errno.EINVAL

    def __init__(self, code: "int | str" = _errno.EINVAL, message: str = "") -> None:
        super().__init__(code, message)
        message = self.message
        self.first, self.last = _parse_range(message, self.kind) or (-1, -1)
        self.cached = _parse_cached(message)
        self.user = _parse_user(message)

    @property
    def range(self) -> Tuple[int, int]:
        """``(first, last)``, both inclusive."""
        return (self.first, self.last)


class GapError(ContinuityError):
    """start_pos is past the end of the cached history: tokens ``first`` to
    ``last`` (both inclusive) are missing. Send the history from the cached
    end (``cached[1]``)."""

    kind = "missing"


class OverlapError(ContinuityError):
    """start_pos is inside the cached history: tokens ``first`` to ``last``
    (both inclusive) are cached already. Remove them and send from the cached
    end."""

    kind = "overlapping"


class InvalidArgumentError(KvpoolError, ValueError):
    """-EINVAL: an argument the daemon or the library rejected."""


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

# Seed 002's sentence, in whatever context kvpool puts around it.
_RANGE = re.compile(r"(missing|overlapping) tokens from (\d+) to (\d+) \(both inclusive\)",
                    re.IGNORECASE)
_CACHED = re.compile(r"cache holds (?:tokens )?\[(\d+), (\d+)\)")
_USER = re.compile(r"\buser (\d+)")


def _parse_range(message: str, kind: str) -> Optional[Tuple[int, int]]:
    m = _RANGE.search(message)
    if not m or (kind and m.group(1).lower() != kind):
        return None
    return int(m.group(2)), int(m.group(3))


def _parse_cached(message: str) -> Optional[Tuple[int, int]]:
    m = _CACHED.search(message)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _parse_user(message: str) -> Optional[int]:
    m = _USER.search(message)
    return int(m.group(1)) if m else None


def from_code(code: int, message: str, connecting: bool = False) -> KvpoolError:
    """The exception for errno ``code`` (positive) and ``message``.

    Continuity errors are recognised by seed 002's sentence ("The input
    sequence has missing/overlapping tokens from A to B (both inclusive)").
    """
    if code == _errno.EINVAL:
        m = _RANGE.search(message)
        if m:
            cls: Type[KvpoolError] = GapError if m.group(1).lower() == "missing" \
                else OverlapError
            return cls(code, message)
    if code == _errno.ENOENT and ("no kvpoold" in message or "connect" in message):
        return ConnectError(code, message)
    return _BY_ERRNO.get(code, KvpoolError)(code, message)
