#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""remote_llm_proof: a real model on node B generating from KV node A computed.

Issue 17's proof with a model (tests/python/test_remote.py is the same with
the TinyDecoder, in CI). Two kvpoolds, A and B, on one Redis Cluster (three
redis-server nodes on loopback started here, or --remote URL); the same
model drives both through kvpool.llm.ChunkedLLM (one object per daemon):

1. A registers a system prompt and --docs documents (roots, prefilled:
   timed) and a query, and generates from (system, every document, query);
2. A's chunks are evicted (max_chunks 1, then one filler chunk: every
   sealed root written behind to the store) and A's write-behind queue
   drains (its /metrics);
3. B registers the same texts: the system prompt and each document are
   found sealed in the store (nothing prefilled on B), fetched and onloaded
   (timed); the query is prefilled (query chunks are not stored:
   remote_chunk_types); B generates the same composition, prefilling only
   the links (documents and query after the system prompt: links are not
   stored);
4. B's greedy tokens must equal A's, and, in fp32, one full prefill's of
   the concatenated prompt (the reference).

Reported: prefill tokens and seconds of the roots on A vs what B spent
getting them from the store (system prompt and documents), B's onloaded pages and the tier's fetch time,
each side's generation (--reps: B's side on that many fresh Bs, the
fastest reported). Exit 0 only when the tokens are identical and B
prefilled neither the system prompt nor a document; the times are recorded, not asserted.
Exit 77 (skip) without redis-server or redis-cli, or with a kvpoold built without the
remote tier.

--model tiny: examples/python/tinymodels.py's TinyDecoder, fp32, on the CPU
(--backend shm): the dry run anywhere. --model llama: LlamaForCausalLM from a
config with random weights (tools/chunk_proof.py's, no download) on the GPU
(--backend cuda), --size small|8b, --dtype fp32|bf16; needs transformers >= 5.

    PYTHONPATH=build/python python3 tools/remote_llm_proof.py --model tiny
    PYTHONPATH=build/python python3 tools/remote_llm_proof.py --model llama \\
        --size 8b --dtype bf16 --json bench/results/remote-llm-DATE.json
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "examples" / "python"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from chunk_proof import IdTokenizer, rand_ids, text  # noqa: E402
from hf_proof import determinism, find_kvpoold  # noqa: E402
from redis_cluster import RedisCluster, RedisMissing, drain, metrics  # noqa: E402


def log(msg: str) -> None:
    print(f"[remote_llm_proof {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr,
          flush=True)


class Node:
    """A kvpoold of this run's own, on the remote tier, its log in a temp dir."""

    def __init__(self, name: str, kvpoold: str, layout: str, backend: str,
                 device_mem: str, host_mem: str, remote: List[str]) -> None:
        import kvpool
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"kvpool-remote-llm-{name}-")
        self.sock = os.path.join(self.dir, "kvpoold.sock")
        self.log = os.path.join(self.dir, "kvpoold.log")
        args = [kvpoold, f"--socket={self.sock}", f"--backend={backend}", "--foreground",
                f"--layout={layout}", f"--device_mem={device_mem}", f"--host_mem={host_mem}",
                *remote]
        self.proc = subprocess.Popen(args, stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=lambda: ctypes.CDLL(None).prctl(
                                         1, signal.SIGKILL))
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpoold {name} exited {self.proc.returncode}: "
                                   + open(self.log).read()[-2000:])
            if os.path.exists(self.sock):
                try:
                    kvpool.connect(self.sock, "remote_llm_proof-ready").close()
                    return
                except kvpool.KvpoolError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvpoold {name} did not serve within 60 s: "
                                   + open(self.log).read()[-2000:])
            time.sleep(0.05)

    def remote(self) -> Dict[str, float]:
        return {k[len("kvpool_remote_"):]: v for k, v in metrics(self.log).items()
                if k.startswith("kvpool_remote_") and "{" not in k}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- models
class Model:
    """The model under test: an adapter for ChunkedLLM, its layout, and a
    reference (greedy tokens of one full prefill) where exact (fp32)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        self.cuda = args.model == "llama"
        if args.model == "tiny":
            from tinymodels import tiny_llm_parts
            self.model, self.adapter, _ = tiny_llm_parts()
            self.vocab = 258
            self.layout = "layers=2,kv_heads=2,head_dim=16,dtype=fp32,page_tokens=16"
            self.dtype = "fp32"
            self.token_bytes = 2 * 2 * 2 * 16 * 4
        else:
            from chunk_proof import configs, build_model, layout_of, LLAMA3_8B
            from kvpool.hf_llm import HFAdapter
            cfg = dict(LLAMA3_8B) if args.size == "8b" else configs(True)["fp32"]
            self.model = build_model(cfg, args.dtype, seed=1)
            self.adapter = HFAdapter(self.model)
            self.vocab = cfg["vocab_size"]
            self.layout = layout_of(cfg, args.dtype)
            self.dtype = args.dtype
            self.token_bytes = (cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] *
                                cfg["head_dim"] * (4 if args.dtype == "fp32" else 2))
        self.g = torch.Generator().manual_seed(1234)

    def sync(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()

    def reference(self, prompt: List[int], n: int) -> Optional[List[int]]:
        if self.dtype != "fp32":
            return None  # bf16: a split prefill rounds otherwise; A vs B only
        if not self.cuda:
            return self.model.greedy(prompt, n)
        from chunk_proof import ref_full
        return ref_full(self.model, prompt, n)["tokens"]


# ---------------------------------------------------------------- the run
def timed(m: Model, f: Any) -> Any:
    m.sync()
    t0 = time.perf_counter()
    r = f()
    m.sync()
    return r, time.perf_counter() - t0


def side(m: Model, node: Node, texts: Dict[str, Any], sp: Dict[str, Any]) -> Dict[str, Any]:
    """Register the texts on node (timed), then generate (timed)."""
    from kvpool.llm import ChunkedLLM, ChunkType
    llm = ChunkedLLM(model=m.adapter, tokenizer=IdTokenizer(), socket=node.sock,
                     max_chunks=100000, chunk_memory_ratio=1.0)
    r0 = node.remote()

    def register() -> Any:
        s = llm.register_chunk(texts["system"], ChunkType.SYSTEM_PROMPT, {"proof": "remote"})
        return s, [llm.register_chunk(x, ChunkType.CONTEXT) for x in texts["docs"]]

    (s, d), reg_s = timed(m, register)
    roots = dict(llm.counters)
    # The query: never in the store (remote_chunk_types' default), prefilled
    # on both sides, and its link after the chain in the generation.
    q, q_s = timed(m, lambda: llm.register_chunk(texts["query"], ChunkType.QUERY))
    pre = llm.counters["prefill_tokens"]
    out, gen_s = timed(m, lambda: llm.generate_from_chunks(s, d, q, sp))
    r1 = node.remote()
    res = {
        "register_s": round(reg_s, 4), "query_register_s": round(q_s, 4),
        "generate_s": round(gen_s, 4),
        "roots_created": roots["roots_created"], "roots_found": roots["root_hits"],
        "root_prefill_tokens": roots["prefill_tokens"],
        "query_prefill_tokens": pre - roots["prefill_tokens"],
        "link_prefill_tokens": llm.counters["prefill_tokens"] - pre,
        "tokens": out["token_ids"],
        "remote_onloaded_pages": r1["onloaded_pages_total"] - r0["onloaded_pages_total"],
        "remote_fetch_s": round(r1["fetch_seconds_total"] - r0["fetch_seconds_total"], 4),
        "remote_onload_s": round(r1["onload_seconds_total"] - r0["onload_seconds_total"], 4),
    }
    res["_llm"] = llm
    return res


def evict_all(llm: Any) -> None:
    """Every chunk of the daemon out of its device tier (and into the store):
    with max_chunks 1, a new name evicts every other one first."""
    from kvpool.llm import ChunkType
    llm.release_generations()
    llm.client.chunk_limits(max_chunks=1)
    llm.register_chunk(text([7, 7, 7]), ChunkType.CONTEXT)
    llm.client.chunk_limits(max_chunks=100000)


def workload(m: Model, args: argparse.Namespace) -> Tuple[Dict[str, Any], List[int]]:
    """The texts (token ids in decimal: IdTokenizer) of the system prompt,
    the documents and the query, and the whole prompt's ids."""
    g = m.g
    ids = {"system": rand_ids(g, args.system, m.vocab),
           "docs": [rand_ids(g, args.doc_tokens, m.vocab) for _ in range(args.docs)],
           "query": rand_ids(g, args.query, m.vocab)}
    texts = {"system": text(ids["system"]), "docs": [text(x) for x in ids["docs"]],
             "query": text(ids["query"])}
    return texts, ids["system"] + [t for x in ids["docs"] for t in x] + ids["query"]


def run(args: argparse.Namespace) -> Dict[str, Any]:
    m = Model(args)
    determinism(True)
    total = args.system + args.docs * args.doc_tokens + args.query
    kv_bytes = total * m.token_bytes   # the roots'; links about as much again
    # Roots and links (about twice the prompt) and the decode, with room.
    dev = f"{max(16, 3 * kv_bytes // 2 ** 20 + 64)}M"
    queue = f"{max(64, 2 * kv_bytes // 2 ** 20 + 16)}M"   # every root evicted at once
    host = args.host_mem or f"{max(256, 2 * kv_bytes // 2 ** 20 + 16)}M"
    backend = "cuda" if m.cuda else "shm"
    texts, prompt = workload(m, args)
    sp = {"temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True}

    cluster = None
    if not args.remote:
        cluster = RedisCluster(3)
    url = args.remote or cluster.url
    remote = [f"--remote={url}", f"--remote_timeout_ms={args.remote_timeout_ms}",
              f"--remote_queue={queue}", "--metrics=127.0.0.1:0"]
    kvpoold = find_kvpoold(args.kvpoold)
    nodes: List[Node] = []
    try:
        for name in ("A", "B"):
            nodes.append(Node(name, kvpoold, m.layout, backend, dev, host, remote))
        a, b = nodes
        log(f"A and B on {url}: {total} prompt tokens, {kv_bytes / 2 ** 20:.1f} MiB of KV")
        # Warm-up on A (kernels, allocator): a chunk of its own, evicted too.
        from kvpool.llm import ChunkedLLM, ChunkType
        with ChunkedLLM(model=m.adapter, tokenizer=IdTokenizer(), socket=a.sock) as w:
            w.register_chunk(text(rand_ids(m.g, min(args.system, 512), m.vocab)),
                             ChunkType.SYSTEM_PROMPT)
        ra = side(m, a, texts, sp)
        evict_all(ra["_llm"])
        t0 = time.perf_counter()
        ma = drain(a.log, timeout=600)
        drain_s = time.perf_counter() - t0
        ra["_llm"].close()
        log(f"A: {ra['root_prefill_tokens']} root tokens prefilled in {ra['register_s']} s; "
            f"{ma['kvpool_remote_written_pages_total']:.0f} pages written behind")
        # B's side --reps times, each on a fresh B (the first finds nothing
        # but the store; a B that holds the chunks would not ask it).
        reps: List[Dict[str, Any]] = []
        for i in range(args.reps):
            if i:
                b.stop()
                b = Node("B", kvpoold, m.layout, backend, dev, host, remote)
                nodes.append(b)
            rb = side(m, b, texts, sp)
            rb["_llm"].close()
            del rb["_llm"]
            reps.append(rb)
            log(f"B: {rb['root_prefill_tokens']} root tokens prefilled, "
                f"{rb['remote_onloaded_pages']:.0f} pages from the store in "
                f"{rb['register_s']} s")
        rb = min(reps, key=lambda r: r["register_s"])
        ref = m.reference(prompt, args.max_tokens)
    finally:
        for n in nodes:
            n.stop()
        if cluster:
            cluster.stop()
    del ra["_llm"]
    res: Dict[str, Any] = {
        "what": "node B generates from chunks node A computed, fetched through the "
                "remote tier (a Redis Cluster), vs A computing them",
        "date": datetime.date.today().isoformat(),
        "command": " ".join([sys.executable] + sys.argv),
        "host": platform.node(),
        "model": args.model if args.model == "tiny" else f"llama-{args.size}",
        "dtype": m.dtype, "backend": backend, "layout": m.layout,
        "prompt_tokens": {"system": args.system, "docs": [args.doc_tokens] * args.docs,
                          "query": args.query, "total": total},
        "kv_bytes": kv_bytes,
        "A": ra, "A_written_pages": ma["kvpool_remote_written_pages_total"],
        "A_drain_s": round(drain_s, 4), "B": rb,
        "identical_A_B": ra["tokens"] == rb["tokens"],
        "identical_reference": None if ref is None else rb["tokens"] == ref,
        "prefill_tokens_saved_on_B": ra["root_prefill_tokens"] - rb["root_prefill_tokens"],
        # Everything each side prefilled, links included (a document's KV
        # after the system prompt is a link, computed on both sides).
        "prefill_tokens_total_A_B": [sum(r[k] for k in ("root_prefill_tokens",
                                                        "query_prefill_tokens",
                                                        "link_prefill_tokens"))
                                     for r in (ra, rb)],
        "root_s_A_prefill_vs_B_fetch": [ra["register_s"], rb["register_s"]],
        "B_register_s_reps": [r["register_s"] for r in reps],
        "identical_A_B_every_rep": all(r["tokens"] == ra["tokens"] for r in reps),
    }
    if m.cuda:
        import torch
        res["device"] = torch.cuda.get_device_name(0)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("tiny", "llama"), default="tiny")
    ap.add_argument("--size", choices=("small", "8b"), default="small",
                    help="llama: a 4-layer model, or Llama-3-8B's shapes")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--kvpoold", help="default $KVPOOLD, else build*/kvpoold")
    ap.add_argument("--remote", help="redis-cluster://host:port,... (default: three "
                    "redis-server nodes on loopback, started here)")
    ap.add_argument("--remote-timeout-ms", dest="remote_timeout_ms", type=int, default=2000)
    ap.add_argument("--host-mem", dest="host_mem",
                    help="each daemon's host tier (on cuda the remote tier's pages go "
                    "through it; default twice the prompt's KV, at least 256M)")
    ap.add_argument("--system", type=int, default=512, help="system prompt tokens")
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--doc-tokens", dest="doc_tokens", type=int, default=256)
    ap.add_argument("--query", type=int, default=32)
    ap.add_argument("--max-tokens", dest="max_tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=1,
                    help="B's side this many times, each on a fresh B (B: the fastest)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    try:
        res = run(args)
    except RedisMissing as e:
        print(f"remote_llm_proof: skip: {e}; or pass --remote URL", file=sys.stderr)
        return 77
    except RuntimeError as e:
        if "hiredis" not in str(e):
            raise
        print(f"remote_llm_proof: skip: kvpoold has no remote tier: {e}", file=sys.stderr)
        return 77
    print(json.dumps({k: v for k, v in res.items() if k not in ("A", "B")}, indent=2))
    for k in ("A", "B"):
        print(k, json.dumps({x: y for x, y in res[k].items() if x != "tokens"}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    ok = res["identical_A_B_every_rep"] and res["identical_reference"] is not False and \
        res["B"]["root_prefill_tokens"] == 0 and res["B"]["roots_created"] == 0
    if not ok:
        print("remote_llm_proof: FAILED: B's tokens differ or B prefilled roots",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
