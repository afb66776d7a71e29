#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""remote_recompute: get a prompt's KV from kvpool's remote tier, or recompute it?

Issue 17's device-machine figure, modelled on tools/disk_recompute.py. The
kvpool half is `kvbench remote --json`: two kvpoolds with a Llama-3-8B-shaped
layout (32 layers, 8 KV heads, head_dim 128, bf16: 128 KiB of K/V per token)
and --remote on one Redis Cluster (three redis-server processes kvbench
starts on loopback, or --remote URL); A computes --tokens tokens of a prompt
and evicts them (written behind to the store); B's prefix lookup of the same
tokens fetches them in one batched round and onloads them (every byte
compared), timed; raw pipelined GET/SET of the same values in the same run.
The other half, in the same run: a LlamaForCausalLM built from Llama-3-8B's
config with random weights (no download) prefills the same number of tokens
on the GPU (disk_recompute.recompute): the time the remote tier saves is
recompute - fetch.

    python3 tools/remote_recompute.py --build build \\
        --json bench/results/remote-recompute-DATE.json

Where kvbench was built without hiredis or redis-server is missing (the GPU
machine today), --remote-json FILE takes the kvpool half from an earlier
`kvbench remote --json` (say so when quoting the ratio: two machines);
--no-recompute runs only the kvpool half.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from disk_recompute import LLAMA3_8B_LAYOUT, recompute  # noqa: E402


def kvbench_remote(args: argparse.Namespace) -> Dict[str, Any]:
    cmd = [os.path.join(args.build, "kvbench"), "remote", "--json",
           f"--layout={args.layout}", f"--tokens={args.tokens}", f"--rounds={args.reps}"]
    if args.remote:
        cmd.append(f"--remote={args.remote}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"remote_recompute: {' '.join(cmd)} failed ({r.returncode}): "
                 f"{r.stderr.strip()}\n(no hiredis or redis-server here? run "
                 "kvbench remote where they are and pass --remote-json)")
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="holds kvbench and kvpoold")
    ap.add_argument("--layout", default=LLAMA3_8B_LAYOUT)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--remote", help="redis-cluster://host:port,... (default: "
                    "kvbench starts three redis-server processes on loopback)")
    ap.add_argument("--remote-json", help="the kvpool half from this `kvbench remote "
                    "--json` file instead of running it here")
    ap.add_argument("--no-recompute", action="store_true",
                    help="skip the model (no GPU or no transformers here)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    if args.remote_json:
        with open(args.remote_json) as f:
            kv = json.load(f)
        same_run = False
    else:
        kv = kvbench_remote(args)
        same_run = True
    fetch = kv["fetch_s"]
    res: Dict[str, Any] = {
        "what": "time for a second kvpoold to get --tokens tokens of K/V another "
                "computed from the remote tier (a Redis Cluster: one batched round, "
                "checked, onloaded, bytes compared) vs recomputing them "
                "(LlamaForCausalLM prefill, Llama-3-8B config, random bf16 weights)",
        "date": datetime.date.today().isoformat(),
        "command": " ".join([sys.executable] + sys.argv),
        "host": platform.node(),
        "layout": args.layout, "tokens": kv["tokens"], "bytes": kv["bytes"],
        "fetch_s": fetch, "fetch_gbps": kv["fetch_gbps"],
        "raw_get_s": kv["raw_get_s"], "raw_set_s": kv["raw_set_s"],
        "kvpool_half_same_run": same_run,
        "kvbench_remote": kv,
    }
    if not args.no_recompute:
        rc = recompute(kv["tokens"], args.reps)
        res["recompute_s"] = rc["seconds"]
        res["recompute"] = rc
        res["recompute_over_fetch"] = rc["seconds"] / fetch
    print(json.dumps({k: v for k, v in res.items()
                      if k not in ("kvbench_remote", "recompute")}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
