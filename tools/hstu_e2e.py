#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The recommender main job end to end (issue 29): an HSTU ranker replaying a
KuaiRand-1K-shaped trace in N pipeline processes, three ways in one run:

- recompute: no cache, every request computes its whole history;
- private:   kvpool.hstu.KVCacheManager over a kvpoold of each pipeline's own
             (the anchor's one-manager-per-process semantics; the device and
             host tiers split N ways, as N processes on one GPU would split it);
- kvpool:    the same manager, every pipeline on one shared kvpoold.

A dispatcher hands each batch to an idle pipeline (least loaded, ties round
robin), never sticky, so a user's requests reach different processes; a
user's next request waits until the previous one is done (in the trace they
are >= 60 s apart). Every pipeline ranks with seed 002's call order
(get_batch_kvdata_info, prepare_kv_cache, per layer append_kvcache,
offload_kv_cache). Each request's scores are compared with recompute's.

The trace is tools/hstu_trace.py's port of `kvbench trace` (seeded, the same
requests as kvbench's); a history is the user's day (the cache key is user
and date: histories do not cross days, as in the example; --cross-days keys
by user and lets them run on), plus ``candidates`` candidate items drawn from
a stream keyed by the seed and the request. A request whose history is past
the model's max_seq_len is left out, as the example's dataset leaves it out.
--hstu-dir reads the HSTU example's CSVs instead.

    /usr/bin/python3 tools/hstu_e2e.py --cpu          # CPU-sized, shm backend
    python3 tools/hstu_e2e.py                         # anchor shapes, cuda backend
    python3 tools/hstu_e2e.py --cross-days --skip 20000   # long histories (~2k tokens)

Writes bench/results/hstu-e2e[-cpu]-DATE.json (see --out) and, when
matplotlib is importable, a PNG of requests/s beside it.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import multiprocessing as mp
import os
import shlex
import shutil
import statistics
import sys
import time
from multiprocessing.connection import wait as mp_wait
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import hstu_trace  # noqa: E402
from proof_daemon import Daemon as ProofDaemon  # noqa: E402

try:
    import kvpool  # noqa: F401
except ImportError:
    # Not installed: the build tree's package (cmake --build build).
    for _p in sorted(glob.glob(os.path.join(SRC, "build*", "python"))):
        if os.path.exists(os.path.join(_p, "kvpool", "__init__.py")):
            sys.path.insert(0, _p)
            os.environ["PYTHONPATH"] = os.pathsep.join(
                x for x in (_p, os.environ.get("PYTHONPATH")) if x)
            break

SYSTEMS = ("recompute", "private", "kvpool")
ELT = {"fp32": 4, "bf16": 2}
# bf16: 8 mantissa bits. Cached and recomputed K/V come from matmuls over
# different row counts, so each layer may round a value one bf16 ulp apart
# (2^-8 relative); over the layers and the head that reaches ~1e-2 on O(1)
# logits. fp32 agrees to 1e-5.
TOLERANCE = {"fp32": 1e-5, "bf16": 5e-2}
WARM_KEY = 900_000_000_000   # the pipelines' warm-up histories (not trace keys)


# ---------------------------------------------------------------- requests
def build_requests(args, cfg) -> list:
    """--requests requests of the trace (after --skip) as hstu_model.Request;
    those whose history is longer than the model's window are left out."""
    from kvpool.hstu_model import N_CONTEXT, Request
    import torch
    if args.hstu_dir:
        tr = hstu_trace.load_hstu_csv(args.hstu_dir)
    else:
        tr = hstu_trace.generate(users=args.trace_users, days=args.days, seed=args.seed,
                                 hist_scale=args.hist_scale, only_users=args.users)
    cap = (cfg.max_seq_len - N_CONTEXT) // 2
    days: Dict[int, List[int]] = {}
    for (u, date) in sorted(tr.times):
        days.setdefault(u, []).append(date)
    out = []
    seen = 0
    over: set = set()   # histories past the window (they only grow)
    for i, r in enumerate(tr.requests):
        if len(out) == args.requests:
            break
        if (r.user if args.cross_days else (r.user, r.date)) in over:
            continue
        if args.cross_days:
            # Every earlier day of the user, then this day up to the interval.
            ev, times = [], []
            for date in days[r.user]:
                if date > r.date or len(ev) > cap:
                    break
                n = r.end if date == r.date else len(tr.times[(r.user, date)])
                ev += tr.day_events(r.user, date)[:n]
                times += tr.times[(r.user, date)][:n]
            key = r.user
        else:
            ev = tr.day_events(r.user, r.date)[:r.end]
            times = tr.times[(r.user, r.date)][:len(ev)]
            key = r.user * 1_000_000 + r.date % 1_000_000
        # A history past the model's window is skipped, as the example's
        # dataset skips an interval whose end is past max_seqlen.
        if len(ev) > cap:
            over.add(r.user if args.cross_days else (r.user, r.date))
            continue
        seen += 1
        if seen <= args.skip:
            continue
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + i)
        cands = torch.randint(0, hstu_trace.KUAIRAND_ITEMS, (cfg.candidates,),
                              generator=g).tolist()
        ctx = [(r.user * 7919 + f * 104729) % 1009 for f in range(N_CONTEXT)]
        out.append(Request(key=key,
                           items=[e[0] for e in ev], actions=[e[1] for e in ev],
                           times_ms=times, context=ctx, candidates=cands,
                           now_ms=r.ts_ms))
    return out


# ---------------------------------------------------------------- kvpoold
def find_kvpoold() -> str:
    env = os.environ.get("KVPOOLD")
    if env:
        return env
    for p in sorted(glob.glob(os.path.join(SRC, "build*", "kvpoold"))):
        if os.access(p, os.X_OK):
            return p
    raise SystemExit("hstu_e2e: no kvpoold: build it (cmake --build build --target "
                     "kvpoold) or set $KVPOOLD")


class Daemon(ProofDaemon):
    """hf_proof's kvpoold with this run's tiers and up to 120 s to pin them;
    its temp dir goes when it stops."""

    def __init__(self, layout: str, backend: str, device_mem: str, host_mem: str) -> None:
        super().__init__(find_kvpoold(), layout, device_mem, backend, host_mem=host_mem,
                         ready_s=120)

    def stats(self) -> dict:
        import kvpool
        with kvpool.connect(self.sock, "hstu_e2e") as c:
            return c.stats()

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _torch_dtype(name: str):
    import torch
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _bytes(size: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(size[:-1]) * mult[size[-1]]) if size[-1] in mult else int(size)


def _size(n: int) -> str:
    return f"{max(1, n >> 10)}K"


# ---------------------------------------------------------------- pipeline
def pipeline(idx: int, conn, cfg_dict: dict, socket: Optional[str], device: str,
             dtype: str, offload: bool, reqs: list) -> None:
    """One pipeline process: build the model (same seed: same weights), then
    rank every batch the dispatcher sends, answering (indices, scores,
    cached tokens, compute ms)."""
    import torch
    from kvpool.hstu import KVCacheManager
    from kvpool.hstu_model import HSTUConfig, HSTURanker
    torch.set_num_threads(1 if device == "cpu" else torch.get_num_threads())
    dev = torch.device(device)
    model = HSTURanker(HSTUConfig(**cfg_dict)).to(dev, _torch_dtype(dtype))
    mgr = KVCacheManager(socket=socket, device=dev) if socket else None
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    # Warm up (first-call allocations, kernels) on a history of this
    # pipeline's own, dropped again: nothing of it is measured or cached.
    from kvpool.hstu_model import Request
    n = min(len(reqs[0].items), 8) or 1
    warm = Request(WARM_KEY + idx, [1] * n, [0] * n, list(range(n)), [0] * 6,
                   list(reqs[0].candidates), n)
    for _ in range(2):
        model.rank([warm], dev)
        if mgr is not None:
            model.rank_cached(mgr, [warm], offload=offload)
            mgr.evict_kv_cache([warm.key])
    sync()
    conn.send(("ready", idx))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        batch = [reqs[i] for i in msg]
        t0 = time.perf_counter()
        if mgr is None:
            scores, cached = model.rank(batch, dev), [0] * len(batch)
        else:
            scores, cached = model.rank_cached(mgr, batch, offload=offload)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        conn.send(("done", idx, msg, [s.float().cpu() for s in scores], cached, ms))
    if mgr is not None:
        mgr.close()
    conn.send(("bye", idx))


def dispatch(n_pipes: int, conns, reqs: list, batch: int,
             route: str = "least") -> Tuple[dict, float]:
    """Replay every request once: batches of up to ``batch`` ready requests
    (distinct users, each user's previous request done) to pipelines.
    route "least": to an idle pipeline, the one that served fewest first,
    ties round robin (a load balancer); "rr": strictly round robin, waiting
    for that pipeline (the same pipelines for the same trace on any
    machine). Returns per-request results and the wall time."""
    pending = list(range(len(reqs)))
    busy_keys: set = set()
    idle = list(range(n_pipes))
    rr = 0
    served = [0] * n_pipes
    res: Dict[int, dict] = {}
    t_sent: Dict[int, float] = {}
    start = time.perf_counter()
    while len(res) < len(reqs):
        while idle and pending and (route != "rr" or rr in idle):
            pick, keys = [], set()
            for i in pending:
                k = reqs[i].key
                if k in busy_keys or k in keys:
                    continue
                pick.append(i)
                keys.add(k)
                if len(pick) == batch:
                    break
            if not pick:
                break
            if route != "rr":
                idle.sort(key=lambda p: (served[p], (p - rr) % n_pipes))
            p = rr if route == "rr" else idle[0]
            idle.remove(p)
            rr = (p + 1) % n_pipes
            for i in pick:
                pending.remove(i)
            busy_keys |= keys
            now = time.perf_counter()
            for i in pick:
                t_sent[i] = now
            conns[p].send(pick)
        for c in mp_wait([conns[p] for p in range(n_pipes) if p not in idle]):
            msg = c.recv()
            if msg[0] != "done":
                raise RuntimeError(f"pipeline said {msg!r}")
            _, p, idxs, scores, cached, ms = msg
            now = time.perf_counter()
            for j, i in enumerate(idxs):
                res[i] = {"pipe": p, "scores": scores[j], "cached": cached[j],
                          "ms": (now - t_sent[i]) * 1e3, "compute_ms": ms / len(idxs)}
                busy_keys.discard(reqs[i].key)
            served[p] += 1
            idle.append(p)
    return res, time.perf_counter() - start


def run_system(system: str, n_pipes: int, args, cfg, reqs: list) -> Tuple[dict, dict]:
    """One row: start the daemons, the pipelines, replay, collect."""
    layout = cfg.layout(args.dtype)
    daemons: List[Daemon] = []
    if system == "kvpool":
        daemons = [Daemon(layout, args.backend, args.device_mem, args.host_mem)]
        socks = [daemons[0].sock] * n_pipes
    elif system == "private":
        # The shared tiers split N ways, but never less than the pages of
        # two batches of full histories (a pool that cannot hold one
        # request would only fail).
        page_bytes = (2 * cfg.layers * cfg.page_tokens * cfg.heads * cfg.head_dim
                      * ELT[args.dtype])
        floor = 2 * args.batch * -(-cfg.max_seq_len // cfg.page_tokens) * page_bytes
        dm = _size(max(floor, _bytes(args.device_mem) // n_pipes))
        hm = _size(max(floor, _bytes(args.host_mem) // n_pipes))
        daemons = [Daemon(layout, args.backend, dm, hm) for _ in range(n_pipes)]
        socks = [d.sock for d in daemons]
    else:
        socks = [None] * n_pipes
    ctx = mp.get_context("fork" if args.device == "cpu" else "spawn")
    conns, procs = [], []
    try:
        for p in range(n_pipes):
            a, b = ctx.Pipe()
            proc = ctx.Process(target=pipeline, args=(p, b, cfg.as_dict(), socks[p],
                                                      args.device, args.dtype, args.offload,
                                                      reqs),
                               daemon=True)
            proc.start()
            conns.append(a)
            procs.append(proc)
        for c in conns:
            if c.recv()[0] != "ready":
                raise RuntimeError("a pipeline did not start")
        before = [d.stats() for d in daemons]
        res, wall = dispatch(n_pipes, conns, reqs, args.batch, args.route)
        after = [d.stats() for d in daemons]
        for c in conns:
            c.send(None)
        for c in conns:
            c.recv()
        for proc in procs:
            proc.join(30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for d in daemons:
            d.stop()
    page_bytes = 2 * cfg.layers * cfg.page_tokens * cfg.heads * cfg.head_dim * ELT[args.dtype]

    def delta(key: str) -> int:
        return sum(a[key] - b[key] for a, b in zip(after, before)) if daemons else 0
    onloaded = delta("onloaded_pages")
    # A hit is cross-process when more tokens were found cached than this
    # pipeline itself ever wrote for the history: another process wrote them
    # (never so with private caches).
    written: Dict[Tuple[int, int], int] = {}
    cross = 0
    for i in range(len(reqs)):
        r, k = res[i], reqs[i].key
        if r["cached"] > written.get((k, r["pipe"]), 0):
            cross += 1
        written[(k, r["pipe"])] = reqs[i].history_tokens
    lat = sorted(r["ms"] for r in res.values())
    hist = sum(q.history_tokens for q in reqs)
    row = {
        "system": system, "pipelines": n_pipes, "requests": len(reqs),
        "requests_per_s": len(reqs) / wall, "wall_s": wall,
        "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99),
        "hit_rate": sum(r["cached"] for r in res.values()) / hist,
        "request_hit_rate": sum(1 for r in res.values() if r["cached"]) / len(reqs),
        "cross_process_hits": cross,
        "onloaded_pages": onloaded, "bytes_onloaded": onloaded * page_bytes,
        "demoted_pages": delta("demoted_pages"),
        "offloaded_pages": delta("offloaded_pages"),
        # The pipeline's time in rank/rank_cached (device synchronized), per
        # request of its batch: the GPU ms per request on the device.
        "compute_ms_per_request": statistics.mean(r["compute_ms"] for r in res.values()),
    }
    return row, res


def _pct(xs: Sequence[float], p: float) -> float:
    if not xs:
        return 0.0
    k = min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


# ---------------------------------------------------------------- block
def block_speedup(args, cfg, reps: int) -> dict:
    """The HSTU block (every layer, append and page reads included) for one
    request of max_seq_len history tokens of which all but the last
    max_seq_len/32 are cached (anchor: 3,968 of 4,096), plus the candidates,
    against the same request with nothing cached; batch 1. Median of reps."""
    import torch
    from kvpool.hstu import KVCacheManager
    from kvpool.hstu_model import N_CONTEXT, HSTURanker, Request
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    model = HSTURanker(cfg).to(dev, _torch_dtype(args.dtype))
    T = cfg.max_seq_len
    new = T // 32
    items_full = (T - N_CONTEXT) // 2
    items_cached = (T - new - N_CONTEXT) // 2
    g = torch.Generator().manual_seed(args.seed)
    items = torch.randint(0, hstu_trace.KUAIRAND_ITEMS, (items_full,), generator=g).tolist()
    acts = torch.randint(0, 256, (items_full,), generator=g).tolist()
    times = [1_600_000_000_000 + 5000 * i for i in range(items_full)]
    cands = torch.randint(0, hstu_trace.KUAIRAND_ITEMS, (cfg.candidates,), generator=g).tolist()

    def req(key: int, n: int) -> Request:
        return Request(key, items[:n], acts[:n], times[:n], [1, 2, 3, 4, 5, 6], cands,
                       times[n - 1] + 1000)
    d = Daemon(cfg.layout(args.dtype), args.backend, args.block_device_mem, "0")
    try:
        mgr = KVCacheManager(socket=d.sock, device=dev)
        keys = list(range(1, reps + 2))
        for k in keys:
            model.rank_cached(mgr, [req(k, items_cached)], offload=False)
        t_cached, t_full = [], []
        for k in keys:   # the first of each is a warm-up
            r = req(k, items_full)
            starts, lens = mgr.get_batch_kvdata_info([k])
            c = int(lens[0])
            mgr.prepare_kv_cache([k], [c], [r.history_tokens - c])
            meta = mgr.get_cache_metadata([k])
            b = model._batch([r], [c], dev)
            sync()
            t0 = time.perf_counter()
            with torch.no_grad():
                model._forward(b, mgr, meta)
            sync()
            t_cached.append(time.perf_counter() - t0)
            b = model._batch([r], [0], dev)
            sync()
            t0 = time.perf_counter()
            with torch.no_grad():
                model._forward(b)
            sync()
            t_full.append(time.perf_counter() - t0)
        mgr.close()
    finally:
        d.stop()
    tc, tf = statistics.median(t_cached[1:]), statistics.median(t_full[1:])
    return {"history_tokens": T, "cached_tokens": T - new - (T - new - N_CONTEXT) % 2,
            "candidates": cfg.candidates, "batch": 1, "reps": reps,
            "cached_ms": tc * 1e3, "no_cache_ms": tf * 1e3, "speedup": tf / tc}


# ---------------------------------------------------------------- main
def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true",
                    help="CPU-sized: 2 layers, hidden 64, 256-token histories, 16 "
                         "candidates, 8-token pages, shm backend, few requests")
    ap.add_argument("--pipelines", default="1,4,8", help="pipeline counts (comma list)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--requests", type=int, help="requests replayed per row")
    ap.add_argument("--users", type=int, help="users of the trace replayed")
    ap.add_argument("--trace-users", type=int, default=1000,
                    help="users the trace is drawn for (kvbench's default 1000)")
    ap.add_argument("--days", type=int, help="days of the trace")
    ap.add_argument("--hist-scale", type=float, help="history length factor (1: kvbench's)")
    ap.add_argument("--skip", type=int, default=0,
                    help="leave out the trace's first N requests (with --cross-days: "
                         "start the replay where histories are long)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hstu-dir", help="read processed_*.csv of the HSTU example here")
    ap.add_argument("--batch", type=int, default=1, help="requests per forward")
    ap.add_argument("--route", choices=("least", "rr"), default="least",
                    help="least: an idle pipeline, fewest served first (default); "
                         "rr: strict round robin")
    ap.add_argument("--device", help="torch device (cpu / cuda)")
    ap.add_argument("--backend", help="kvpoold backend (shm / cuda)")
    ap.add_argument("--device-mem", help="shared device tier (private: split N ways)")
    ap.add_argument("--host-mem", help="shared host tier (private: split N ways)")
    ap.add_argument("--block-device-mem", help="device tier of the block measurement")
    ap.add_argument("--block-reps", type=int, default=5)
    ap.add_argument("--no-offload", dest="offload", action="store_false",
                    help="commit without offloading after each batch")
    ap.add_argument("--no-block", dest="block", action="store_false")
    ap.add_argument("--dtype", choices=sorted(ELT), default="fp32",
                    help="model and pool dtype (anchor: bf16)")
    ap.add_argument("--tolerance", type=float,
                    help="largest |score - recompute's| (default fp32 1e-5, bf16 5e-2)")
    ap.add_argument("--cross-days", action="store_true",
                    help="a user's history runs across days (key: the user); default "
                         "the example's: one history per user and day")
    ap.add_argument("--out", help="result JSON (default bench/results/hstu-e2e[-cpu]-DATE.json)")
    args = ap.parse_args(argv)
    if args.tolerance is None:
        args.tolerance = TOLERANCE[args.dtype]
    # The device tier holds 8 pipelines' pinned full histories (8 x 32
    # pages; anchor 8 x 128 pages of 2 MiB) and less than the users' day
    # histories, so demotion and onload happen.
    cpu = {"requests": 120, "users": 24, "days": 2, "hist_scale": 0.1, "device": "cpu",
           "backend": "shm", "device_mem": "1M", "host_mem": "16M",
           "block_device_mem": "4M"}
    gpu = {"requests": 1000, "users": 128, "days": 31, "hist_scale": 1.0,
           "device": "cuda", "backend": "cuda", "device_mem": "2560M", "host_mem": "32G",
           "block_device_mem": "4G"}
    for k, v in (cpu if args.cpu else gpu).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse(argv)
    import torch
    from kvpool.hstu_model import HSTUConfig
    cfg = HSTUConfig.cpu() if args.cpu else HSTUConfig.anchor()
    if args.device == "cpu":
        torch.set_num_threads(1)
    reqs = build_requests(args, cfg)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"hstu_e2e: --systems: unknown system '{s}' "
                             f"(one of {', '.join(SYSTEMS)})")
    if "recompute" not in systems:
        raise SystemExit("hstu_e2e: --systems must include recompute (its scores are "
                         "the reference every other row is checked against)")
    pipes = [int(p) for p in args.pipelines.split(",")]
    rows: List[dict] = []
    ref: Optional[dict] = None
    worst = 0.0
    match = True
    # Recompute first: its scores are the reference of the others.
    for system in sorted(systems, key=lambda s: s != "recompute"):
        for n in pipes:
            row, res = run_system(system, n, args, cfg, reqs)
            if ref is None and system == "recompute":
                ref = {i: r["scores"] for i, r in res.items()}
            if ref is not None and system != "recompute":
                diff = max(float((res[i]["scores"] - ref[i]).abs().max()) for i in res)
                row["max_abs_diff"] = diff
                worst = max(worst, diff)
                if diff > args.tolerance:
                    match = False
            rows.append(row)
            print(f"{system:9s} x{n}: {row['requests_per_s']:8.2f} req/s  p50 "
                  f"{row['p50_ms']:8.2f} ms  p99 {row['p99_ms']:8.2f} ms  hit "
                  f"{row['hit_rate']:.3f}  cross {row['cross_process_hits']}  onloaded "
                  f"{row['bytes_onloaded']} B", flush=True)
    block = block_speedup(args, cfg, args.block_reps) if args.block else None
    dev_name = (torch.cuda.get_device_name(0) if args.device.startswith("cuda")
                else f"cpu ({os.cpu_count()} cores, torch {torch.__version__})")
    out = {
        "device": dev_name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sized": "cpu (scaled down: see model; histories x%g, %d users)"
                 % (args.hist_scale, args.users) if args.cpu else "anchor",
        "model": cfg.as_dict(),
        "dtype": args.dtype,
        "histories": "per user, across days" if args.cross_days else "per user and day",
        "backend": args.backend,
        "batch": args.batch,
        "route": args.route,
        "device_mem": args.device_mem, "host_mem": args.host_mem,
        "offload_each_batch": args.offload,
        "trace": {"generator": "tools/hstu_trace.py (kvbench trace port)" if not args.hstu_dir
                  else f"HSTU CSVs in {args.hstu_dir}", "seed": args.seed,
                  "users": args.users, "days": args.days, "hist_scale": args.hist_scale,
                  "requests": len(reqs), "skip": args.skip,
                  "history_tokens_mean": statistics.mean(r.history_tokens for r in reqs)},
        "rows": rows,
        "block_speedup_b1": block["speedup"] if block else None,
        "block": block,
        "scores_match": match,
        "scores_max_abs_diff": worst,
        "tolerance": args.tolerance,
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
                   if argv is None else " ".join(["tools/hstu_e2e.py", *argv]),
    }
    path = args.out or os.path.join(
        SRC, "bench", "results",
        f"hstu-e2e{'-cpu' if args.cpu else ''}-{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")
    png = os.path.splitext(path)[0] + ".png"
    try:
        plot(rows, png, out["device"])
        print(f"wrote {png}")
    except ImportError:
        print("no PNG: matplotlib is not installed (Debian: python3-matplotlib)")
    if block:
        print(f"block b1: {block['cached_ms']:.2f} ms cached vs {block['no_cache_ms']:.2f} ms "
              f"no cache: {block['speedup']:.2f}x")
    print(f"scores match recompute: {match} (max |diff| {worst:.3g})")
    return out


def plot(rows: List[dict], png: str, device: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    systems = sorted({r["system"] for r in rows})
    pipes = sorted({r["pipelines"] for r in rows})
    w = 0.8 / max(1, len(systems))
    for j, s in enumerate(systems):
        ys = [next((r["requests_per_s"] for r in rows
                    if r["system"] == s and r["pipelines"] == p), 0) for p in pipes]
        ax.bar([i + j * w for i in range(len(pipes))], ys, w, label=s)
    ax.set_xticks([i + w * (len(systems) - 1) / 2 for i in range(len(pipes))])
    ax.set_xticklabels([str(p) for p in pipes])
    ax.set_xlabel("pipelines")
    ax.set_ylabel("requests/s")
    ax.set_title(f"HSTU ranking, KuaiRand-1K-like replay ({device})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    o = main()
    sys.exit(0 if o["scores_match"] else 1)
