# SPDX-License-Identifier: MIT
"""The KuaiRand-1K-like recommender trace of `kvbench trace`, in Python.

The same generator as tools/kvbench/trace.c (splitmix64 streams keyed by the
seed, the user, the date and the event; log-normal history per user with
median 3,379 and sigma 0.894 clipped to [10, 49,332] items; a flat Dirichlet
share of each user's history per day; sessions of ~24 events at random times
of the day, 2 s + Exp(10 s) apart; intervals cut when an event is >= 60 s
after the first of the current one; one request per interval; requests in
(date, ts, user, end) order). With the defaults and ``hist_scale=1`` the
requests are kvbench's for the same seed (port of trace_generate and
trace_event). ``hist_scale`` shrinks every history (CPU-sized runs).

Also reads the HSTU example's ``processed_seqs_inference.csv`` and
``processed_batches.csv`` (WORKLOADS.md) with ``load_hstu_csv``.
"""
from __future__ import annotations

import ast
import csv
import datetime as _dt
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

M64 = (1 << 64) - 1
KUAIRAND_ITEMS = 4369953
SESSION_EVENTS = 24
GAP_MIN_MS = 2000
GAP_MEAN_MS = 10000.0
HIST_MEDIAN, HIST_SIGMA, HIST_MIN, HIST_MAX = 3379.0, 0.894, 10, 49332
INTERVAL_GAP_MS = 60000
P_ACT = (0.40, 0.02, 0.004, 0.004, 0.003, 0.002, 0.30, 0.02)


class _Rng:
    """splitmix64 as trace.c's mix64/unit."""

    __slots__ = ("s",)

    def __init__(self, s: int) -> None:
        self.s = s & M64

    def mix(self) -> int:
        self.s = (self.s + 0x9e3779b97f4a7c15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
        return z ^ (z >> 31)

    def unit(self) -> float:
        return ((self.mix() >> 11) + 0.5) / 9007199254740992.0


def _stream(seed: int, a: int, b: int) -> _Rng:
    r = _Rng(seed ^ ((a * 0xd1342543de82ef95) & M64) ^ ((b * 0x9e3779b97f4a7c15) & M64))
    r.mix()
    return r


def _norm_inv(p: float) -> float:
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
         3.754408661907416e+00)

    def tail(q: float) -> float:
        return ((((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5])
                / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1))
    if p < 0.02425:
        return tail(math.sqrt(-2 * math.log(p)))
    if p > 1 - 0.02425:
        return -tail(math.sqrt(-2 * math.log(1 - p)))
    q = p - 0.5
    r = q * q
    return ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
            / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1))


def event(seed: int, user: int, date: int, k: int) -> Tuple[int, int]:
    """(item, action bitmask) of event k of a user's day (trace_event)."""
    s = _stream(seed ^ 0x6974656d, ((user << 32) | date) & M64, k)
    u = s.unit()
    item = int(KUAIRAND_ITEMS * u * u * u)
    a = 0
    for i, p in enumerate(P_ACT):
        if s.unit() < p:
            a |= 1 << i
    return item, a


def _date_to_day(date: int) -> int:
    return (_dt.date(date // 10000, date // 100 % 100, date % 100)
            - _dt.date(1970, 1, 1)).days


def _day_to_date(day: int) -> int:
    d = _dt.date(1970, 1, 1) + _dt.timedelta(days=day)
    return d.year * 10000 + d.month * 100 + d.day


@dataclass
class TraceRequest:
    """One interval's request: the user's day history is events [0, end)."""

    ts_ms: int
    user: int
    date: int
    end: int


@dataclass
class Trace:
    """Requests in replay order and each (user, date)'s event times (ms)."""

    requests: List[TraceRequest]
    times: Dict[Tuple[int, int], List[int]]
    seed: int
    events: Dict[Tuple[int, int], List[Tuple[int, int]]] = field(default_factory=dict)

    def day_events(self, user: int, date: int) -> List[Tuple[int, int]]:
        """(item, action) of every event of the user's day (drawn on demand,
        or read from the CSV)."""
        key = (user, date)
        ev = self.events.get(key)
        if ev is None:
            n = len(self.times[key])
            ev = [event(self.seed, user, date, k) for k in range(n)]
            self.events[key] = ev
        return ev


def _day_times(s: _Rng, c: int) -> List[int]:
    sessions = 1 + c // SESSION_EVENTS
    ms: List[int] = []
    for j in range(sessions):
        m = c // sessions + (1 if j < c % sessions else 0)
        tms = int(s.unit() * 80000.0) * 1000
        for _ in range(m):
            ms.append(tms)
            tms += GAP_MIN_MS + int(-math.log(s.unit()) * GAP_MEAN_MS)
    ms.sort()
    return ms


def generate(users: int = 1000, days: int = 31, seed: int = 1,
             first_date: int = 20220408, hist_scale: float = 1.0,
             only_users: Optional[int] = None) -> Trace:
    """The trace (trace_generate). only_users: keep the first n users' requests
    (the histories are drawn for all ``users`` so each user's length is the
    same as in the full trace)."""
    U, D = users, days
    mu = math.log(HIST_MEDIAN)
    s = _stream(seed, 0x68697374, 0)
    hist = []
    for i in range(U):
        h = math.exp(mu + HIST_SIGMA * _norm_inv((i + s.unit()) / U))
        h = HIST_MIN if h < HIST_MIN else HIST_MAX if h > HIST_MAX else h
        hist.append(int(h + 0.5))
    for i in range(U, 1, -1):
        j = s.mix() % i
        hist[i - 1], hist[j] = hist[j], hist[i - 1]
    day0 = _date_to_day(first_date)
    reqs: List[TraceRequest] = []
    times: Dict[Tuple[int, int], List[int]] = {}
    for u in range(U if only_users is None else min(U, only_users)):
        total = max(1, int(hist[u] * hist_scale + 0.5)) if hist_scale != 1.0 else hist[u]
        s = _stream(seed, 0x75736572, u)
        w = [-math.log(s.unit()) for _ in range(D)]
        sw = sum(w)
        per_day = [int(total * x / sw) for x in w]
        given = sum(per_day)
        while given < total:
            per_day[s.mix() % D] += 1
            given += 1
        for d in range(D):
            c = per_day[d]
            if not c:
                continue
            ms = _day_times(s, c)
            date = _day_to_date(day0 + d)
            base = (day0 + d) * 86400000
            times[(u, date)] = [base + t for t in ms]
            first = ms[0]
            for i in range(1, c + 1):
                if i < c and ms[i] - first < INTERVAL_GAP_MS:
                    continue
                reqs.append(TraceRequest(base + ms[i - 1], u, date, i))
                if i < c:
                    first = ms[i]
    reqs.sort(key=lambda r: (r.date, r.ts_ms, r.user, r.end))
    return Trace(reqs, times, seed)


def _list(text: str) -> list:
    text = text.strip()
    return list(ast.literal_eval(text)) if text else []


def load_hstu_csv(directory: str) -> Trace:
    """The HSTU example's processed_seqs_inference.csv (one row per user and
    date: video_id, time_ms, action_weights lists) and processed_batches.csv
    (one row per interval: user_id, date, interval_end_ts, interval_indptr),
    replayed in (date, interval_end_ts) order."""
    times: Dict[Tuple[int, int], List[int]] = {}
    events: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}
    with open(os.path.join(directory, "processed_seqs_inference.csv"), newline="") as f:
        for row in csv.DictReader(f):
            key = (int(row["user_id"]), int(row["date"]))
            vids, ts = _list(row["video_id"]), _list(row["time_ms"])
            acts = _list(row["action_weights"])
            if not len(vids) == len(ts) == len(acts):
                raise ValueError(f"processed_seqs_inference.csv: user {key[0]} date "
                                 f"{key[1]}: video_id, time_ms and action_weights differ "
                                 "in length")
            times[key] = [int(t) for t in ts]
            events[key] = [(int(v), int(a)) for v, a in zip(vids, acts)]
    reqs = []
    with open(os.path.join(directory, "processed_batches.csv"), newline="") as f:
        for row in csv.DictReader(f):
            key = (int(row["user_id"]), int(row["date"]))
            if key not in times:
                raise ValueError(f"processed_batches.csv: user {key[0]} date {key[1]} "
                                 "has no row in processed_seqs_inference.csv")
            reqs.append(TraceRequest(int(row["interval_end_ts"]), key[0], key[1],
                                     int(row["interval_indptr"])))
    reqs.sort(key=lambda r: (r.date, r.ts_ms, r.user, r.end))
    return Trace(reqs, times, 0, events)
