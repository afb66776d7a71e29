# SPDX-License-Identifier: MIT
"""``python3 -m kvpool.chat --tiny`` driven through stdin (seed 000's /infer,
seed 001's chunks), and examples/python/chunked_rag.py (two processes: one
registers the documents, one answers) with its full-prefill check."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import SRC, Daemon, run_py

EXAMPLES = SRC / "examples" / "python"


@pytest.fixture(scope="module")
def kd():
    d = Daemon(device_mem="8M", host_mem="4M")
    yield d
    d.stop()


def _env(kd) -> dict:
    e = kd.env()
    e["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""),
                                                   str(EXAMPLES)] if p)
    return e


def chat(kd, script: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "kvpool.chat", "--tiny", "--quiet",
                        "--max-tokens", "12", *args], input=script, env=_env(kd),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_chat_repl(kd):
    out = chat(kd, "\n".join([
        "/help",
        "/register system You are a terse assistant.",
        "/register context kvpool shares KV pages between processes.",
        "/register query What does kvpool share?",
        "/chunks",
        "/generate",
        "/blocks",
        "/infer",
        "/infer And how?",
        "/register document nope",
        "/stats",
        "/quit",
        "/chunks",  # after /quit: not run
    ]) + "\n")
    lines = out.splitlines()
    assert any("/infer [TEXT]" in ln for ln in lines)  # the help
    ids = re.findall(r"^registered (system_prompt|context|query) ([0-9a-f]{64})$", out, re.M)
    assert [k for k, _ in ids] == ["system_prompt", "context", "query"]
    assert "3 chunks" in out
    answers = [ln for ln in lines if ln.startswith("assistant: ")]
    assert len(answers) == 3
    stats = re.findall(r"^\[(\d+) tokens, (\w+), (\d+) cached, (\d+) prefilled\]$", out, re.M)
    assert stats and stats[0][0] == "12" and stats[0][1] == "length"
    prompt = sum(len(t.encode()) for t in ("You are a terse assistant.",
                                           "kvpool shares KV pages between processes.",
                                           "What does kvpool share?"))
    assert int(stats[0][2]) + int(stats[0][3]) == prompt
    blocks = re.search(r"^4 blocks, (\d+) tokens$", out, re.M)
    assert blocks and int(blocks.group(1)) == prompt + 11
    infers = re.findall(r"^\[(\d+) tokens, (\w+), after (\d+) cached tokens in (\d+) blocks\]$",
                        out, re.M)
    assert [(int(c), int(b)) for _, _, c, b in infers] == [(prompt + 11, 4),
                                                          (prompt + 11 + 12, 5)]
    assert "error: ValueError: chunk type 'document'" in out
    assert '"total_chunks": 3' in out
    assert out.count("chunks\n") == 1 or "3 chunks" in out


def test_chat_reports_errors_and_goes_on(kd):
    out = chat(kd, "/generate hello\n/use system " + "ab" * 32 + "\n/generate hi\n/frob\n")
    assert "error: ValueError: no system prompt" in out
    assert "error: ChunkNotFoundError" in out
    assert "unknown command /frob" in out


def test_chunked_rag_two_processes(kd):
    r = run_py(str(EXAMPLES / "chunked_rag.py"), "both", "What is Django and its pattern?",
               "--check", env=_env(kd), timeout=180)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[answer process ")]
    assert lines, r.stdout
    res = json.loads(lines[0][len("[answer process "):-1])
    assert res["identical"] is True
    assert res["sources"][0] == "docs/django"
    assert res["cached_tokens"] > 0   # the system prompt's KV came from the indexer
    # a second answer reuses the links the first one made: nothing but the question
    r2 = run_py(str(EXAMPLES / "chunked_rag.py"), "answer", "What is Django and its pattern?",
                "--check", env=_env(kd), timeout=180)
    res2 = json.loads(r2.stdout.strip().splitlines()[-1])
    assert res2["token_ids"] == res["token_ids"] and res2["prefilled_tokens"] == 0
