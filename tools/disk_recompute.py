#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""disk_recompute: bring a history back from kvpool's disk tier, or recompute it?

Issue 15's device-machine figure. One kvpoold with a disk tier and a
Llama-3-8B-shaped layout (32 layers, 8 KV heads, head_dim 128, bf16: 128 KiB
of K/V per token). A client writes --tokens tokens of seeded random K/V for
one user, `kvctl offload --tier disk` pushes the history to disk and frees
its memory, and once the disk thread has written it (kvctl stats says so) a
reader prepare brings it back disk -> host -> device; the prepare's wall time
is the read-back (the bytes are then compared with what
was written). In the same run, a LlamaForCausalLM built from Llama-3-8B's
config with random weights (no download) prefills the same number of tokens
on the GPU: the time kvpool saves is recompute - read-back.

    python3 tools/disk_recompute.py --build build --disk-dir /var/tmp/kvdisk \
        --json bench/results/disk-recompute-DATE.json

--backend shm --no-recompute runs the kvpool half where there is no GPU or
no transformers (a smaller --layout keeps it quick).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

LLAMA3_8B_LAYOUT = "layers=32,kv_heads=8,head_dim=128,dtype=bf16,page_tokens=16"


def start_daemon(args: argparse.Namespace, tmp: str) -> subprocess.Popen:
    sock = os.path.join(tmp, "kvpoold.sock")
    log = open(os.path.join(tmp, "kvpoold.log"), "w")
    cmd = [os.path.join(args.build, "kvpoold"), f"--socket={sock}",
           f"--backend={args.backend}", "--foreground", f"--layout={args.layout}",
           f"--device_mem={args.device_mem}", f"--host_mem={args.host_mem}",
           f"--disk_dir={args.disk_dir}", f"--disk_size={args.disk_size}"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"disk_recompute: kvpoold did not start: {' '.join(cmd)}\n"
                     + open(log.name).read())
        time.sleep(0.05)
    return proc


def kvctl(args: argparse.Namespace, sock: str, *words: str) -> str:
    r = subprocess.run([os.path.join(args.build, "kvctl"), f"--socket={sock}", *words],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"disk_recompute: kvctl {' '.join(words)} failed: {r.stderr.strip()}")
    return r.stdout


def wait_written(args: argparse.Namespace, sock: str, pages: int) -> None:
    """offload --tier disk returns once the pages are staged: wait until the
    disk thread has written them, so the prepare reads them from disk."""
    deadline = time.monotonic() + 60
    while json.loads(kvctl(args, sock, "stats", "--json"))["disk_demoted_pages"] < pages:
        if time.monotonic() > deadline:
            sys.exit("disk_recompute: the disk tier did not write the history in 60 s")
        time.sleep(0.005)


def kv_of(client: Any, tokens: int, seed: int, torch: Any) -> List[Any]:
    """[layers] of (K, V), each [tokens, kv_heads, head_dim], seeded."""
    L = client.layout
    g = torch.Generator(device="cpu").manual_seed(seed)
    dev = client.device
    dt = client.torch_dtype
    out = []
    for _ in range(L["layers"]):
        k = torch.randn(tokens, L["kv_heads"], L["head_dim"], generator=g).to(dt).to(dev)
        v = torch.randn(tokens, L["kv_heads"], L["head_dim"], generator=g).to(dt).to(dev)
        out.append((k, v))
    return out


def read_back(client: Any, user: int, tokens: int) -> Dict[str, Any]:
    """Time a reader prepare of a history only on disk; gather it while the
    lease pins it."""
    t0 = time.perf_counter()
    lease = client.prepare(user, tokens, 0)
    t1 = time.perf_counter()
    try:
        if lease.len != tokens:
            sys.exit(f"disk_recompute: user {user} came back with {lease.len} of "
                     f"{tokens} tokens")
        got = [lease.gather(layer, tokens) for layer in range(client.layout["layers"])]
    finally:
        lease.release()
    return {"seconds": t1 - t0, "onloaded_pages": lease.onloaded_pages, "kv": got}


def recompute(tokens: int, reps: int) -> Dict[str, Any]:
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=8192, rope_theta=500000.0,
                      torch_dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), device="cuda")
    times = []
    with torch.inference_mode():
        for i in range(reps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            torch.cuda.synchronize()
            if i:                      # the first pass warms up kernels
                times.append(time.perf_counter() - t0)
            del out
    params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return {"seconds": statistics.median(times), "all_s": times,
            "params": params, "gpu": torch.cuda.get_device_name(0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="holds kvpoold and kvctl")
    ap.add_argument("--disk-dir", required=True, help="the disk tier's directory "
                    "(emptied first; on the device machine an ext4 directory)")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "shm"])
    ap.add_argument("--layout", default=LLAMA3_8B_LAYOUT)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device-mem", default="2G")
    ap.add_argument("--host-mem", default="2G")
    ap.add_argument("--disk-size", default="8G")
    ap.add_argument("--no-recompute", action="store_true",
                    help="skip the model (no GPU or no transformers here)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    import torch  # noqa: PLC0415
    import kvpool  # noqa: PLC0415

    shutil.rmtree(args.disk_dir, ignore_errors=True)
    os.makedirs(args.disk_dir)
    tmp = tempfile.mkdtemp(prefix="disk-recompute-")
    sock = os.path.join(tmp, "kvpoold.sock")
    proc = start_daemon(args, tmp)
    user = 1
    runs = []
    try:
        with kvpool.connect(sock, "disk_recompute") as c:
            kv = kv_of(c, args.tokens, 1234, torch)
            lease = c.prepare(user, 0, args.tokens)
            lease.append_layers([k for k, _ in kv], [v for _, v in kv])
            lease.commit()
            lease.release()
            token_bytes = c.layout["token_bytes"]
            for _ in range(args.reps):
                before = json.loads(kvctl(args, sock, "stats", "--json"))["disk_demoted_pages"]
                kvctl(args, sock, "offload", "--user", str(user), "--tier", "disk")
                wait_written(args, sock, before + -(-args.tokens // c.layout["page_tokens"]))
                info = c.info(user)
                r = read_back(c, user, args.tokens)
                same = all(torch.equal(gk, k) and torch.equal(gv, v)
                           for (gk, gv), (k, v) in zip(r.pop("kv"), kv))
                if not same:
                    sys.exit("disk_recompute: the bytes read back differ from those written")
                r["bytes"] = args.tokens * token_bytes
                r["info_before"] = str(info)    # where the history was: disk only
                runs.append(r)
            stats_txt = kvctl(args, sock, "stats", "--json")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    readback = statistics.median(r["seconds"] for r in runs)
    res: Dict[str, Any] = {
        "what": "time to bring --tokens tokens of K/V back from kvpool's disk tier "
                "(kvctl offload --tier disk, then a reader prepare: disk -> host -> "
                "device, bytes compared) vs recomputing them (LlamaForCausalLM "
                "prefill, Llama-3-8B config, random bf16 weights, same GPU, same run)",
        "date": datetime.date.today().isoformat(),
        "command": " ".join([sys.executable] + sys.argv),
        "host": platform.node(),
        "backend": args.backend, "layout": args.layout, "tokens": args.tokens,
        "bytes": args.tokens * token_bytes,
        "readback_s": readback,
        "readback_gbps": args.tokens * token_bytes / readback / 1e9,
        "readback_runs": runs,
        "daemon_stats": json.loads(stats_txt),
    }
    if not args.no_recompute:
        rc = recompute(args.tokens, args.reps)
        res["recompute_s"] = rc["seconds"]
        res["recompute"] = rc
        res["recompute_over_readback"] = rc["seconds"] / readback
    print(json.dumps({k: v for k, v in res.items()
                      if k not in ("readback_runs", "daemon_stats", "recompute")}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
