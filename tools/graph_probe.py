#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Diagnose issue 27's open fault on a GPU: a CUDA graph holding
kvpool.paged_attention's kernels replays its capture's answer instead of
re-reading its inputs (tests/python/test_paged_attention.py's graph tests).
Each probe captures on a side stream after a warm-up there (as HFAdapter
does), changes the input in place, replays and compares with eager:

  trivial   a one-line Triton kernel (y = 2x);
  merge     the merge kernel alone, its partial states changed in place;
  attend    paged_attention.attend (paged kernel + merge), q changed;
  attend+   the same with split buffers made before the capture (a torch
            allocation inside the capture is the one difference left).

    python3 tools/graph_probe.py      # prints one line per probe and a JSON line
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("pa", ROOT / "python" / "kvpool" / "paged_attention.py")
pa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pa)            # torch and triton only: no kvpool build needed
import triton                          # noqa: E402
import triton.language as tl          # noqa: E402


@triton.jit
def _double(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, tl.load(X + i) * 2)


def capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        fn()
    torch.cuda.synchronize()
    return g


def tables(L: int, n: int, P: int, dev: str):
    tok = torch.arange(L + n, dtype=torch.int32, device=dev)[None]
    return pa.Tables([pa.Launch(torch.zeros(1, 1, dtype=torch.int32, device=dev), tok,
                                torch.tensor([L + n], dtype=torch.int32, device=dev),
                                torch.tensor([L], dtype=torch.int32, device=dev), L + n)],
                     1, n, P)


def main() -> None:
    dev = "cuda"
    res = {"torch": torch.__version__, "triton": triton.__version__}
    # trivial
    x = torch.randn(64, device=dev)
    y = torch.empty_like(x)
    g = capture(lambda: _double[(1,)](x, y, N=64))
    x.mul_(-1)
    g.replay()
    torch.cuda.synchronize()
    res["trivial"] = bool(torch.allclose(y, x * 2))
    # attend
    P, Hkv, D, Hq, n, L = 16, 2, 64, 4, 4, 600
    F = (L + n) // P + 1
    cache = torch.randn(F, 2, P, Hkv, D, device=dev)
    t = tables(L, n, P, dev)
    q = torch.randn(1, n, Hq, D, device=dev)
    out = torch.empty_like(q)
    g = capture(lambda: pa.attend(q, cache, t, out=out))
    q.mul_(-1)
    g.replay()
    want = pa.attend(q, cache, t)
    torch.cuda.synchronize()
    res["attend"] = bool((out - want).abs().max().item() <= 1e-4)
    res["attend_max_diff"] = float((out - want).abs().max().item())
    # attend with the split buffers allocated before the capture
    real_empty = torch.empty
    bufs = {}

    def empty(*shape, **kw):
        key = (tuple(shape), kw.get("dtype"))
        if key not in bufs:
            bufs[key] = real_empty(*shape, **kw)
        return bufs[key]
    pa.torch.empty = empty
    try:
        out2 = real_empty(q.shape, dtype=q.dtype, device=dev)
        pa.attend(q, cache, t, out=out2)          # makes the buffers, outside
        g = capture(lambda: pa.attend(q, cache, t, out=out2))
        q.mul_(-1)
        g.replay()
    finally:
        pa.torch.empty = real_empty
    want = pa.attend(q, cache, t)
    torch.cuda.synchronize()
    res["attend_prealloc"] = bool((out2 - want).abs().max().item() <= 1e-4)
    # the merge kernel alone: partial states changed in place
    S = 3
    part = torch.randn(S, 1, n, Hq, D, device=dev)
    lse = torch.randn(S, 1, n, Hq, device=dev)
    res_t = torch.empty(1, n, Hq, D, device=dev)
    run = lambda: pa._merge_kernel[(n * Hq,)](part, lse, res_t, S, part.stride(0),  # noqa: E731
                                             lse.stride(0), D=D, BLOCK_S=4)
    g = capture(run)
    part.mul_(-1)
    g.replay()
    torch.cuda.synchronize()
    w = torch.softmax(lse, 0)[..., None]
    res["merge"] = bool(torch.allclose(res_t, (part * w).sum(0), atol=1e-4))
    for k in ("trivial", "merge", "attend", "attend_prealloc"):
        print(f"{k:16s} replay re-reads its inputs: {res[k]}")
    print(json.dumps(res))
    sys.exit(0)


if __name__ == "__main__":
    main()
