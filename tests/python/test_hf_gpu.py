# SPDX-License-Identifier: MIT
"""kvpool.hf with the real transformers on a GPU (ctest label gpu): a Llama
model in bf16 generates the same greedy tokens with KVPoolCache as with
DynamicCache and the K/V kvpool hands back are bit-identical, in one process
and across two -- tools/hf_proof.py --quick against a kvpoold --backend=cuda.

Skips, saying why, where torch has no CUDA device, transformers >= 5 is not
installed or no kvpoold is found (CI has none of them). As a script (how
ctest runs it) a skip is exit status 77. The full figures:
tools/hf_proof.py -> bench/results/hf-cache-*.json."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from gpu_skip import SRC, kvpoold as _kvpoold, why_skip as _why_skip  # noqa: E402


def why_skip() -> Optional[str]:
    return _why_skip("kvpool.hf")


pytestmark = pytest.mark.skipif(why_skip() is not None, reason=str(why_skip()))


def _proof(out: Path) -> "tuple[subprocess.CompletedProcess, dict]":
    # 48 new tokens: the --quick model's third prompt has a near-tied greedy
    # step at token 59 that an H100 resolves either way from run to run,
    # with DynamicCache too (bench/results/hf-quick-reps10-2026-11-25.json),
    # so a comparison past it would test the device, not kvpool.
    r = subprocess.run([sys.executable, str(SRC / "tools" / "hf_proof.py"), "--quick",
                        "--new-tokens", "48",
                        "--kvpoold", _kvpoold(), "--out", str(out), "--md", "none"],
                       capture_output=True, text=True, timeout=540)
    assert out.exists(), f"hf_proof.py exited {r.returncode}:\n{r.stderr[-6000:]}"
    res = json.loads(out.read_text())
    print(json.dumps({k: res.get(k) for k in ("tokens_identical", "kv_bit_identical",
                                              "dynamic_cache_repeatable", "decode_ratio",
                                              "decode_ratios", "device")}))
    return r, res


def test_llama_greedy_and_kv_identical_to_dynamic_cache() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hf-gpu-"))
    r, res = _proof(tmp / "hf.json")
    assert not res["errors"], "\n".join(res["errors"])
    assert res["tokens_identical"] is True, json.dumps(res["single_process"] + res["two_processes"])
    assert res["pages_equal_attention_kv"] is True   # kvpool hands back what attention read
    for t in res["two_processes"]:
        assert t["second_opened_with_tokens"] == t["expected_cached"]
    if res["dynamic_cache_repeatable"] and not res["kv_bit_identical"]:
        # K/V compared with a separate DynamicCache run: two DynamicCache
        # runs agreeing once does not make the device deterministic: in
        # bench/results/hf-cache-2026-11-25-final.json DynamicCache differed
        # from itself on one prompt, and kvpool from DynamicCache (layers
        # 2-7) on another whose DynamicCache pair agreed; this test's first
        # comparison failed 1 of 3 H100 runs on 2026-11-25 while tokens and
        # pages agreed. A systematic difference fails both runs.
        r, res = _proof(tmp / "hf-again.json")
        if res["dynamic_cache_repeatable"]:
            assert res["kv_bit_identical"] is True, \
                json.dumps([s["kv"] for s in res["single_process"] + res["two_processes"]])
    assert r.returncode == 0, r.stderr[-3000:]


if __name__ == "__main__":
    reason = why_skip()
    if reason:
        print(f"skip: {reason}")
        sys.exit(77)
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-s", __file__]))
