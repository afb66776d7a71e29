# SPDX-License-Identifier: MIT
"""Issue 31, item 5 on the CPU: tools/tp_proof.py's Llama-shaped model run
TP=2 (two processes, gloo) on one tensor-parallel kvpoold pool (shm
backend, devices 0,1, tp = 2) generates the same tokens as TP=1, every
step's page table the same on both ranks, the history as long as the
tokens written. --memory runs the same ranks with in-memory caches, so a
failure of the kvpool run is told apart from one of the sharding."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import SRC, _find

TOOL = str(SRC / "tools" / "tp_proof.py")


def _run(*args: str) -> dict:
    r = subprocess.run([sys.executable, TOOL, "--cpu", "--steps", "6", *args],
                       capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    assert lines, f"tp_proof printed no result (exit {r.returncode}): {r.stderr[-3000:]}"
    res = json.loads(lines[-1])
    assert r.returncode == 0, f"tp_proof failed: {res}\n{r.stderr[-3000:]}"
    return res


def test_tp2_sharding_alone_matches_tp1() -> None:
    res = _run("--memory")
    assert res["tp2_tokens_identical"] and res["ranks_agree"]
    assert res["max_logit_diff"] < 1e-3


def test_tp2_on_one_kvpool_page_table_matches_tp1() -> None:
    res = _run("--kvpoold", _find("kvpoold"))
    assert res["errors"] == []
    assert res["tp2_tokens_identical"], (res["tp1_tokens"], res["tp2_tokens"])
    assert res["same_page_tables"]
    assert res["history_len"] == res["history_len_expected"]
    assert res["max_logit_diff"] < 1e-3


def test_tp2_with_a_chunk_another_group_registered_matches_tp1() -> None:
    """Item 5's chunks: one group of two processes registers the prompt's
    first half as a chunk (rank 0 registers, rank 1 joins the fill lease,
    both seal); another group reads it from its pools and generates."""
    res = _run("--kvpoold", _find("kvpoold"), "--chunk")
    assert res["errors"] == []
    assert res["tp2_tokens_identical"], (res["tp1_tokens"], res["tp2_tokens"])
    ch = res["chunk"]
    assert sorted(ch["seal_answers"]) == [0, 1]     # one pending, the last published it
    assert ch["same_frames_on_ranks"]
    assert not set(ch["registered_by_pids"]) & set(ch["generated_by_pids"])
    assert res["same_page_tables"]
    assert res["history_len"] == res["history_len_expected"]
