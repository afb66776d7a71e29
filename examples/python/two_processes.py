#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Two processes sharing one history through kvpoold.

The first process prefills a prompt and generates tokens with a small torch
decoder (RoPE, GQA, fp32, fixed seed), its KV in kvpool pages as user U's
history; it exits. The second attaches on its own, finds U's history in the
cache and continues generating from it, computing only the new tokens. This
process then checks that all generated tokens are identical to recomputing
everything from the prompt.

    kvpoold --socket=/tmp/kvp/kvpoold.sock --backend=shm --foreground \\
        --layout=layers=2,kv_heads=2,head_dim=16,dtype=fp32,page_tokens=16 &
    KVPOOL_SOCKET=/tmp/kvp/kvpoold.sock python3 examples/python/two_processes.py

(--role write|continue runs one side: what the two child processes run.)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]


def role(args: argparse.Namespace) -> None:
    import kvpool
    from tinymodels import TinyDecoder, generate_cached

    model = TinyDecoder(seed=0)
    seq = json.loads(args.seq) if args.seq else PROMPT
    with kvpool.connect(args.socket, f"two_processes:{args.role}") as c:
        if args.role == "write" and c.info(args.user).len:
            c.evict(args.user)  # a fresh history for this run
        out = generate_cached(c, model, args.user, seq, args.steps, append=args.append)
        info = c.info(args.user)
    print(json.dumps({"tokens": out, "cached": info.len}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", default=None, help="kvpoold's socket (default $KVPOOL_SOCKET)")
    ap.add_argument("--user", type=int, default=4242)
    ap.add_argument("--steps", type=int, default=8, help="tokens each process generates")
    ap.add_argument("--role", choices=["write", "continue"])
    ap.add_argument("--seq", help="continue: the sequence so far (JSON list)")
    ap.add_argument("--append", choices=["layer", "all"], default="layer",
                    help="append K/V per layer (torch ops) or all layers at once (kvp_append)")
    args = ap.parse_args()
    if args.role:
        role(args)
        return 0

    def child(*extra: str) -> dict:
        cmd = [sys.executable, os.path.abspath(__file__), "--user", str(args.user),
               "--steps", str(args.steps), *extra]
        if args.socket:
            cmd += ["--socket", args.socket]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = child("--role", "write", "--append", "all")
    seq = PROMPT + first["tokens"]
    second = child("--role", "continue", "--seq", json.dumps(seq), "--append", "layer")
    got = first["tokens"] + second["tokens"]

    from tinymodels import TinyDecoder
    want = TinyDecoder(seed=0).greedy(PROMPT, 2 * args.steps)
    print(f"process 1 (pid-separate) wrote {len(PROMPT)} prompt tokens + generated "
          f"{first['tokens']}")
    print(f"process 2 continued from {first['cached']} cached tokens: {second['tokens']}")
    print(f"recomputed from the prompt:           {want}")
    same = got == want
    print("identical" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
