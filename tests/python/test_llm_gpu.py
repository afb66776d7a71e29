# SPDX-License-Identifier: MIT
"""kvpool.llm.ChunkedLLM with the real transformers on a GPU (ctest label
gpu): tools/chunk_proof.py --quick against a kvpoold --backend=cuda -- greedy
tokens from chunks identical to transformers (fp32: one full prefill; bf16:
DynamicCache with the same chunk boundaries), cascade attention equal to
attention over the concatenated sequence, delete_chunk giving its frames back
and no CUDA memory growth over register/generate/delete rounds.

Skips, saying why, where torch has no CUDA device, transformers >= 5 is not
installed or no kvpoold is found (CI has none of them). As a script (how
ctest runs it) a skip is exit status 77. The full figures:
tools/chunk_proof.py -> bench/results/chunked-llm-*.json."""
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
    return _why_skip("kvpool.llm")


pytestmark = pytest.mark.skipif(why_skip() is not None, reason=str(why_skip()))


def test_chunked_llm_on_llama() -> None:
    out = Path(tempfile.mkdtemp(prefix="chunk-gpu-")) / "chunks.json"
    r = subprocess.run([sys.executable, str(SRC / "tools" / "chunk_proof.py"), "--quick",
                        "--kvpoold", _kvpoold(), "--out", str(out)],
                       capture_output=True, text=True, timeout=540)
    assert out.exists(), f"chunk_proof.py exited {r.returncode}:\n{r.stderr[-6000:]}"
    res = json.loads(out.read_text())
    print(json.dumps({k: res.get(k) for k in ("outputs_identical", "cascade_max_err", "ttft",
                                              "frames_freed", "cuda_mem_growth_bytes", "device")}))
    assert not res["errors"], "\n".join(res["errors"])
    assert res["outputs_identical"]["all_consistent"] is True, json.dumps(res["outputs_identical"])
    assert res["cascade_max_err"]["fp32"] <= 1e-5 and res["cascade_max_err"]["bf16"] <= 1e-2
    assert res["frames_freed"] is True, json.dumps(res["memory"])
    assert res["cuda_mem_growth_bytes"] <= 0, json.dumps(res["memory"])
    assert res["ttft"] and all(t["kvpool_ms"] > 0 for t in res["ttft"])
    assert r.returncode == 0, r.stderr[-3000:]


if __name__ == "__main__":
    reason = why_skip()
    if reason:
        print(f"skip: {reason}")
        sys.exit(77)
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-s", __file__]))
