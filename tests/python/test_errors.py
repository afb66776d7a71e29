# SPDX-License-Identifier: MIT
"""kvpool.errors chooses an exception from data, never from the message's
words (issue 25 item 10): the errno, whether the error is kvp_connect's, and
kvpoold's detail of the error (kvpool.h struct kvp_error_info: kind and
token range, carried in the failed completion's val0/val1). The gap,
overlap and trimmed-head ranges are that data, read back through the sync
calls and the async completions of a real kvpoold."""
from __future__ import annotations

import errno

import pytest

import kvpool
from conftest import Daemon
from kvpool.errors import ERROR_GAP, ERROR_NONE, ERROR_OVERLAP, ERROR_TRIMMED, from_code

SEED_GAP = "The input sequence has missing tokens from 1 to 2 (both inclusive)."


def test_the_class_comes_from_the_detail_not_the_words():
    e = from_code(errno.EINVAL, "reworded: no range in here", kind=ERROR_GAP, first=10,
                  last=19)
    assert type(e) is kvpool.GapError and e.range == (10, 19)
    assert (e.first, e.last, e.errno, str(e)) == (10, 19, errno.EINVAL,
                                                  "reworded: no range in here")
    # words that say the opposite do not matter
    e = from_code(errno.EINVAL, SEED_GAP, False, ERROR_OVERLAP, 5, 9)
    assert type(e) is kvpool.OverlapError and e.range == (5, 9)
    e = from_code(errno.EINVAL, "anything", kind=ERROR_TRIMMED, first=4, last=15)
    assert type(e) is kvpool.TrimmedError and e.range == (4, 15)
    assert isinstance(e, kvpool.ContinuityError) and isinstance(e, kvpool.InvalidArgumentError)
    assert isinstance(e, ValueError)
    # seed 002's sentence without the detail is just an invalid argument
    e = from_code(errno.EINVAL, SEED_GAP)
    assert type(e) is kvpool.InvalidArgumentError
    assert type(from_code(errno.EINVAL, SEED_GAP, kind=ERROR_NONE)) is \
        kvpool.InvalidArgumentError
    # a kind belongs to -EINVAL: another errno keeps its own class
    assert type(from_code(errno.ENOMEM, "full", kind=ERROR_GAP, first=1, last=2)) is \
        kvpool.PoolFullError


def test_the_mapping_tables_cover_every_kind_and_errno():
    kinds = kvpool.errors._BY_KIND
    assert kinds == {ERROR_GAP: kvpool.GapError, ERROR_OVERLAP: kvpool.OverlapError,
                     ERROR_TRIMMED: kvpool.TrimmedError}
    for kind, cls in kinds.items():
        assert cls.kind == kind
        assert type(from_code(errno.EINVAL, "", kind=kind, first=0, last=0)) is cls
    for code, cls in kvpool.errors._BY_ERRNO.items():
        assert type(from_code(code, "The input sequence has overlapping tokens from 5 "
                                    "to 9 (both inclusive). no kvpoold connect")) is cls


def test_connect_errors_come_from_where_they_were_raised():
    # -ENOENT is a missing chunk or lease, whatever its message says ...
    assert type(from_code(errno.ENOENT, "no kvpoold at /x: connect")) is kvpool.NotFoundError
    # ... and no daemon at the socket when kvp_connect says so
    e = from_code(errno.ENOENT, "reworded", connecting=True)
    assert type(e) is kvpool.ConnectError and isinstance(e, ConnectionError)
    assert type(from_code(errno.EACCES, "uid", connecting=True)) is \
        kvpool.PermissionDeniedError


def test_connect_to_no_daemon_raises_connect_error(tmp_path):
    with pytest.raises(kvpool.ConnectError) as e:
        kvpool.connect(str(tmp_path / "nothing.sock"), "pytest")
    assert e.value.errno in (errno.ENOENT, errno.ECONNREFUSED)


@pytest.fixture(scope="module")
def trimming():
    """A daemon whose histories keep 16 tokens (max_tokens_per_user)."""
    d = Daemon(extra=["--max_tokens_per_user=16"])
    yield d
    d.stop()


def _grow(c, user, start, n):
    with c.prepare(user, start, n) as lease:
        lease.commit()


def test_real_daemon_ranges_are_the_completions_data(trimming):
    with kvpool.connect(trimming.sock, "pytest") as c:
        _grow(c, 1, 0, 10)
        cases = [((1, 20, 5), kvpool.GapError, (10, 19)),
                 ((1, 11, 1), kvpool.GapError, (10, 10)),
                 ((1, 5, 20), kvpool.OverlapError, (5, 9)),
                 ((1, 5, 3), kvpool.OverlapError, (5, 7))]
        _grow(c, 2, 0, 16)
        _grow(c, 2, 16, 16)
        info = c.info(2)
        assert info.start > 4, "max_tokens_per_user did not trim user 2's head"
        # the trimmed head: the message names no "missing"/"overlapping"
        # range, so only the completion's detail can give these
        cases.append(((2, 4, 1), kvpool.TrimmedError, (4, info.start - 1)))
        for (user, start, n), cls, rng in cases:
            with pytest.raises(kvpool.ContinuityError) as e:
                c.prepare(user, start, n)
            assert type(e.value) is cls, (user, start, n, str(e.value))
            assert e.value.range == rng and e.value.errno == errno.EINVAL
        assert c.info(1).len == 10
        # a range past 2^63 (no prepare takes one) comes without detail
        with pytest.raises(kvpool.InvalidArgumentError) as e:
            c.prepare(1, 2 ** 63 + 5, 1)
        assert not isinstance(e.value, kvpool.ContinuityError)
        # the async path: a queued prepare's gap carries its range too
        c.queue_prepare(1, 30, 2, 7)
        c.queue_prepare(3, 0, 2, 8)
        c.submit()
        done = {}
        while len(done) < 2:
            for cq in c.reap():
                done[cq.tag] = cq
        assert type(done[7].error) is kvpool.GapError and done[7].error.range == (10, 29)
        assert done[8].error is None
        done[8].lease.release()
