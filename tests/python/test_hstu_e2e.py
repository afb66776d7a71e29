# SPDX-License-Identifier: MIT
"""The HSTU end-to-end replay (issue 29), CPU-sized: tools/hstu_e2e.py with
2 pipelines against real kvpoolds (one shared, one private per pipeline),
every request's scores equal to recompute's, and histories one pipeline
computed reused by the other through the shared kvpoold."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import SRC, Daemon, _find

torch = pytest.importorskip("torch")


def test_replay_two_pipelines_share_histories(tmp_path) -> None:
    out = tmp_path / "hstu.json"
    kvpoold = _find("kvpoold")
    env = dict(os.environ, KVPOOLD=kvpoold)
    r = subprocess.run([sys.executable, str(SRC / "tools" / "hstu_e2e.py"), "--cpu",
                        "--pipelines", "2", "--requests", "48", "--route", "rr",
                        "--block-reps", "2",
                        "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    res = json.loads(out.read_text())
    assert res["scores_match"] is True
    assert res["scores_max_abs_diff"] <= 1e-5
    for k in ("device", "model", "rows", "block_speedup_b1", "command"):
        assert k in res
    rows = {row["system"]: row for row in res["rows"]}
    assert set(rows) == {"recompute", "private", "kvpool"}
    for row in rows.values():
        assert row["pipelines"] == 2 and row["requests"] == 48
        assert row["requests_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
    assert rows["recompute"]["hit_rate"] == 0
    # The shared pool: a history computed in one process reused in the other.
    assert rows["kvpool"]["cross_process_hits"] > 0
    assert rows["kvpool"]["hit_rate"] > 0
    # Private caches never see another process's history, so they hit less.
    assert rows["private"]["cross_process_hits"] == 0
    assert rows["kvpool"]["hit_rate"] >= rows["private"]["hit_rate"]
    assert res["block"]["cached_tokens"] == 248 and res["block"]["history_tokens"] == 256
    assert res["block_speedup_b1"] > 1


def test_cached_scores_equal_recompute_and_bad_history_is_refused() -> None:
    """The model alone: a history grown over three requests (one with no new
    tokens) scores as recompute does; a cache that is no prefix of the
    history sent is dropped and recomputed, not trusted."""
    from kvpool.hstu import KVCacheManager
    from kvpool.hstu_model import HSTUConfig, HSTURanker, Request
    cfg = HSTUConfig.cpu()
    d = Daemon(layout=cfg.layout(), device_mem="1M", host_mem="1M")
    try:
        model = HSTURanker(cfg)
        g = torch.Generator().manual_seed(5)
        items = torch.randint(0, 10**6, (60,), generator=g).tolist()
        acts = torch.randint(0, 256, (60,), generator=g).tolist()
        times = [10_000 * i for i in range(60)]

        def req(key: int, n: int, its=items) -> Request:
            return Request(key, its[:n], acts[:n], times[:n], [1, 2, 3, 4, 5, 6],
                           list(range(cfg.candidates)), times[n - 1] + 500)
        with KVCacheManager(socket=d.sock) as mgr:
            for n, want in ((10, 0), (30, 26), (30, 66), (60, 66)):
                ref = model.rank([req(7, n)])[0]
                got, cached = model.rank_cached(mgr, [req(7, n)])
                assert cached == [want]
                assert torch.allclose(got[0], ref, atol=1e-5, rtol=0)
            # A shorter history than the one cached (a new day's cut): the
            # cache is no prefix of it, so it is evicted and recomputed.
            got, cached = model.rank_cached(mgr, [req(7, 20)])
            assert cached == [0]
            assert torch.allclose(got[0], model.rank([req(7, 20)])[0], atol=1e-5, rtol=0)
            assert mgr.get_user_kvdata_info(7) == (0, 46)
            with pytest.raises(ValueError, match="appears twice"):
                model.rank_cached(mgr, [req(8, 5), req(8, 6)])
    finally:
        d.stop()


def test_trace_port_is_kvbench_trace(tmp_path) -> None:
    """tools/hstu_trace.py draws kvbench's trace: the same requests (date,
    time, user, interval end) in the same order, with the same items and
    actions, for the same seed."""
    kvbench = _find("kvbench")
    path = tmp_path / "t.kvtrace"
    subprocess.run([kvbench, "trace", "--users", "30", "--days", "5", "--seed", "7",
                    "-o", str(path)], check=True, capture_output=True, timeout=60)
    sys.path.insert(0, str(SRC / "tools"))
    import hstu_trace
    tr = hstu_trace.generate(users=30, days=5, seed=7)
    rows = [line.split() for line in path.read_text().splitlines()
            if not line.startswith("#")]
    assert len(rows) == len(tr.requests) > 100
    last: dict = {}
    for f, r in zip(rows, tr.requests):
        assert tuple(map(int, f[:4])) == (r.date, r.ts_ms, r.user, r.end)
        begin = last.get((r.user, r.date), 0)
        last[(r.user, r.date)] = r.end
        assert f[4:] == [f"{i}:{a}" for i, a in tr.day_events(r.user, r.date)[begin:r.end]]


def test_hstu_csv_layout_is_read(tmp_path) -> None:
    """The HSTU example's processed_*.csv (WORKLOADS.md) read as a trace:
    lists as pandas writes them (a one-element list unquoted), intervals
    replayed in (date, interval_end_ts) order; a batch row with no sequence
    row is refused by name."""
    sys.path.insert(0, str(SRC / "tools"))
    import hstu_trace
    (tmp_path / "processed_seqs_inference.csv").write_text(
        "user_id,date,video_id,time_ms,action_weights,play_time_ms\n"
        '3,20220408,"[11, 12, 13]","[1000, 2000, 90000]","[1, 0, 64]","[5, 6, 7]"\n'
        "4,20220408,[21],[1500],[2],[9]\n")
    (tmp_path / "processed_batches.csv").write_text(
        "user_id,date,interval_end_ts,interval_indptr\n"
        "3,20220408,90000,3\n3,20220408,2000,2\n4,20220408,1500,1\n")
    tr = hstu_trace.load_hstu_csv(str(tmp_path))
    assert [(r.user, r.ts_ms, r.end) for r in tr.requests] == \
        [(4, 1500, 1), (3, 2000, 2), (3, 90000, 3)]
    assert tr.day_events(3, 20220408) == [(11, 1), (12, 0), (13, 64)]
    assert tr.times[(4, 20220408)] == [1500]
    (tmp_path / "processed_batches.csv").write_text(
        "user_id,date,interval_end_ts,interval_indptr\n5,20220408,1,1\n")
    with pytest.raises(ValueError, match="user 5 date 20220408 has no row"):
        hstu_trace.load_hstu_csv(str(tmp_path))
