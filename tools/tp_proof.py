#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Tensor parallelism on one kvpool page table (issue 31, item 5): a
Llama-shaped model (random fp32 weights from a seed, no downloads) run
TP=2 with torch.distributed, each rank keeping its own KV heads in its own
GPU's pool of one tensor-parallel kvpoold pool (``tp = 2``), generates the
same tokens as the same model run TP=1.

Per step, rank 0 prepares the user's next tokens (one prepare for the
group), broadcasts the lease id, rank 1 joins it (kvp_lease_join): both get
one page table with the same frame numbers, valid in each rank's pool.
Each rank writes its own K/V heads of every layer through the lease
(Lease.append_layer: the library's lease checks), attends over the pages
it reads back from its pool (Lease.gather: history and new tokens), and
commits; the history grows when both ranks have committed. The prompt is
prefilled in two steps, so the second and every decode step read history
written by earlier steps from the pool. With --chunk the first step is
another group's: two other processes register the prompt's first half as a
chunk (rank 0 registers, rank 1 joins the fill lease, each writes its
heads, the last seal publishes it), and the generating group reads it from
its pools (chunk_acquire: the same frames on both ranks).

The model is the Llama block written out (RMSNorm, RoPE, GQA attention,
SwiGLU MLP), sharded Megatron-style: q/k/v and gate/up split by heads and
columns, o and down by rows, one all-reduce after each. TP=1 runs the same
code with the whole weights and an in-memory cache, no kvpool; where
transformers is importable its LlamaForCausalLM with the same weights
generates too (--hf), so the written-out block is checked against it.

    # CPU: gloo, the shm backend (devices 0,1 are two memfd pools), what
    # tests/python/test_tp_proof.py runs
    /usr/bin/python3 tools/tp_proof.py --cpu --kvpoold build/kvpoold
    # two GPUs: NCCL, the cuda backend, one pool striped over GPUs 0 and 1
    python3 tools/tp_proof.py --kvpoold build/kvpoold --hf --out tp2.json

Prints one JSON line (and writes --out): tp2_tokens_identical, the
tokens, the largest logit difference, the frames before and after.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

#: small enough for two CPU processes, Llama-shaped (GQA 2, head_dim 64)
CFG = dict(vocab=1024, hidden=256, layers=3, heads=4, kv_heads=2, head_dim=64,
           inter=512, rope_theta=10000.0, eps=1e-5, page_tokens=16)


# ---------------------------------------------------------------- weights
def make_weights(cfg: Dict[str, Any], seed: int) -> Dict[str, torch.Tensor]:
    """Random weights (std 0.02, norms 1 + noise), the same in every rank."""
    g = torch.Generator().manual_seed(seed)
    H, hd, I = cfg["hidden"], cfg["head_dim"], cfg["inter"]

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    w = {"embed": torch.randn(cfg["vocab"], H, generator=g) * 0.5,
         "norm": 1 + r(H), "lm_head": r(cfg["vocab"], H) * 5}
    for i in range(cfg["layers"]):
        w.update({f"{i}.ln1": 1 + r(H), f"{i}.ln2": 1 + r(H),
                  f"{i}.wq": r(cfg["heads"] * hd, H), f"{i}.wk": r(cfg["kv_heads"] * hd, H),
                  f"{i}.wv": r(cfg["kv_heads"] * hd, H), f"{i}.wo": r(H, cfg["heads"] * hd),
                  f"{i}.wg": r(I, H), f"{i}.wu": r(I, H), f"{i}.wd": r(H, I)})
    return w


def shard(cfg: Dict[str, Any], w: Dict[str, torch.Tensor], rank: int, tp: int
          ) -> Dict[str, torch.Tensor]:
    """Rank ``rank``'s part: its heads of q/k/v (rows) and o (columns), its
    columns of gate/up and rows of down; the rest whole."""
    hd = cfg["head_dim"]
    qh, kh, ih = cfg["heads"] // tp, cfg["kv_heads"] // tp, cfg["inter"] // tp
    s = {"embed": w["embed"], "norm": w["norm"], "lm_head": w["lm_head"]}
    for i in range(cfg["layers"]):
        q0, k0, m0 = rank * qh * hd, rank * kh * hd, rank * ih
        s.update({f"{i}.ln1": w[f"{i}.ln1"], f"{i}.ln2": w[f"{i}.ln2"],
                  f"{i}.wq": w[f"{i}.wq"][q0:q0 + qh * hd],
                  f"{i}.wk": w[f"{i}.wk"][k0:k0 + kh * hd],
                  f"{i}.wv": w[f"{i}.wv"][k0:k0 + kh * hd],
                  f"{i}.wo": w[f"{i}.wo"][:, q0:q0 + qh * hd],
                  f"{i}.wg": w[f"{i}.wg"][m0:m0 + ih], f"{i}.wu": w[f"{i}.wu"][m0:m0 + ih],
                  f"{i}.wd": w[f"{i}.wd"][:, m0:m0 + ih]})
    return {k: v.contiguous() for k, v in s.items()}


# ---------------------------------------------------------------- the block
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding (rotate_half form) of x [n, heads, hd]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
    """q [n, hq, hd] at positions past..past+n-1 over k/v [past+n, hkv, hd],
    causal; returns [n, hq * hd]."""
    n, hq, hd = q.shape
    rep = hq // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    t = torch.arange(k.shape[0], device=q.device)
    mask = t[None, :] > (past + torch.arange(n, device=q.device))[:, None]
    s = s.masked_fill(mask[None], float("-inf"))
    o = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)
    return o.reshape(n, hq * hd)


class Model:
    """The written-out block over one rank's weights. ``kv(layer, k, v)``
    stores the new tokens' K/V and returns the K/V to attend over."""

    def __init__(self, cfg: Dict[str, Any], w: Dict[str, torch.Tensor], tp: int,
                 device: torch.device) -> None:
        self.cfg, self.tp = cfg, tp
        self.w = {k: t.to(device) for k, t in w.items()}
        self.device = device

    def forward(self, ids: torch.Tensor, past: int, kv) -> torch.Tensor:
        c, w = self.cfg, self.w
        hd = c["head_dim"]
        qh, kh = c["heads"] // self.tp, c["kv_heads"] // self.tp
        pos = torch.arange(past, past + ids.shape[0], device=self.device)
        h = w["embed"][ids]
        for i in range(c["layers"]):
            a = rms(h, w[f"{i}.ln1"], c["eps"])
            q = rope((a @ w[f"{i}.wq"].T).view(-1, qh, hd), pos, c["rope_theta"])
            k = rope((a @ w[f"{i}.wk"].T).view(-1, kh, hd), pos, c["rope_theta"])
            v = (a @ w[f"{i}.wv"].T).view(-1, kh, hd)
            K, V = kv(i, k, v)
            o = attend(q, K, V, past) @ w[f"{i}.wo"].T
            if self.tp > 1:
                dist.all_reduce(o)
            h = h + o
            m = rms(h, w[f"{i}.ln2"], c["eps"])
            d = (torch.nn.functional.silu(m @ w[f"{i}.wg"].T) * (m @ w[f"{i}.wu"].T)) \
                @ w[f"{i}.wd"].T
            if self.tp > 1:
                dist.all_reduce(d)
            h = h + d
        return rms(h[-1:], w["norm"], c["eps"]) @ w["lm_head"].T


# ---------------------------------------------------------------- TP=1
def generate_tp1(cfg: Dict[str, Any], w: Dict[str, torch.Tensor], prompt: List[int],
                 steps: int, device: torch.device) -> Dict[str, Any]:
    """The reference: the whole model in one process, an in-memory cache."""
    return _generate_memory(Model(cfg, w, 1, device), prompt, steps, device)


def _generate_memory(m: "Model", prompt: List[int], steps: int, device: torch.device
                     ) -> Dict[str, Any]:
    cfg = m.cfg
    cache: List[Optional[List[torch.Tensor]]] = [None] * cfg["layers"]

    def kv(i: int, k: torch.Tensor, v: torch.Tensor):
        if cache[i] is not None:
            k = torch.cat([cache[i][0], k])
            v = torch.cat([cache[i][1], v])
        cache[i] = [k, v]
        return k, v

    return _generate(m, kv, prompt, steps, device)


def _generate(m: Model, kv, prompt: List[int], steps: int, device: torch.device,
              step_begin=None, step_end=None, from_chunk: bool = False) -> Dict[str, Any]:
    """Greedy: the prompt in two steps (so the second reads history), then
    one token per step. step_begin(past, n) / step_end() bracket each.
    from_chunk: the first half is a chunk's already (--chunk): start at the
    second step, past = the chunk's tokens."""
    cut = len(prompt) // 2
    chunks = [prompt[:cut], prompt[cut:]]
    past, toks, logits = (cut if from_chunk else 0), [], []
    with torch.no_grad():
        for s in range(1 if from_chunk else 0, steps + 1):
            ids = chunks[s] if s < 2 else [toks[-1]]
            if step_begin:
                step_begin(past, len(ids))
            out = m.forward(torch.tensor(ids, device=device), past, kv)
            if step_end:
                step_end()
            past += len(ids)
            if s >= 1:
                logits.append(out[0].float().cpu())
                toks.append(int(out[0].argmax()))
    return {"tokens": toks, "logits": logits}


# ---------------------------------------------------------------- TP=2 ranks
def register_chunk(client: Any, m: "Model", rank: int, a: argparse.Namespace,
                   device: torch.device) -> Dict[str, Any]:
    """--chunk, the registering group: rank 0 registers the prompt's first
    half as a chunk, rank 1 joins its fill lease; each rank computes and
    writes its own heads of every layer (attending over what it reads back
    from its pool), then seals; the chunk is published with the last seal."""
    cut = len(a.prompt) // 2
    box = [None, None]
    if rank == 0:
        reg = client.chunk_register(a.prompt[:cut], "system",
                                    meta={"what": "tp_proof prefix"})
        if not reg["created"]:
            raise RuntimeError(f"chunk {reg['id']} exists already; a fresh kvpoold expected")
        lease = reg["lease"]
        box = [lease.id, reg["id"]]
    dist.broadcast_object_list(box, src=0)
    if rank != 0:
        lease = client.join(box[0])

    def kv(i: int, k: torch.Tensor, v: torch.Tensor):
        lease.append_layer(i, k, v)
        return lease.gather(i, len(k))

    with torch.no_grad():
        m.forward(torch.tensor(a.prompt[:cut], device=device), 0, kv)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    sealed = lease.seal()
    dist.barrier()            # every rank sealed: the chunk is ready
    return {"entry": box[1], "sealed": sealed, "frames": list(lease.indices),
            "pid": os.getpid()}


def rank_main(rank: int, a: argparse.Namespace, sock: str, port: int, q,
              role: str = "generate", entry: Optional[str] = None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cpu = a.cpu
    if not cpu:
        torch.cuda.set_device(rank)
    device = torch.device("cpu" if cpu else f"cuda:{rank}")
    dist.init_process_group("gloo" if cpu else "nccl", rank=rank, world_size=a.tp)
    try:
        cfg = CFG
        w = shard(cfg, make_weights(cfg, a.seed), rank, a.tp)
        m = Model(cfg, w, a.tp, device)
        if sock is None:        # --memory: the sharding alone, caches in memory
            res = _generate_memory(m, a.prompt, a.steps, device)
            q.put({"rank": rank, "tokens": res["tokens"],
                   "logits": [x.tolist() for x in res["logits"]] if rank == 0 else None,
                   "same_page_tables": True, "history_len": a.prompt_len + a.steps - 1})
            return
        import kvpool
        client = kvpool.connect(sock, f"tp_proof-rank{rank}", rank=rank)
        assert client.tp == a.tp and client.rank == rank, (client.tp, client.rank)
        assert client.layout["kv_heads"] == cfg["kv_heads"] // a.tp, client.layout
        if role == "register":
            r = register_chunk(client, m, rank, a, device)
            client.close()
            q.put({"rank": rank, **r})
            return
        user = a.user
        cur: Dict[str, Any] = {}
        frames_seen: List[List[int]] = []
        prefix: List[Any] = []
        if entry is not None:
            # --chunk: the prompt's first half is the chunk another group
            # registered; this group reads each rank's heads of it from its
            # own pool (a read lease: the same frames on every rank).
            rd = client.chunk_acquire(entry)
            prefix = [rd.gather(i, rd.len) for i in range(cfg["layers"])]
            chunk_frames = list(rd.indices)

        base = len(a.prompt) // 2 if entry is not None else 0

        def step_begin(past: int, n: int) -> None:
            box = [0]
            if rank == 0:
                info = client.info(user)
                lease = client.prepare(user, info.start + info.len, n)
                box = [lease.id]
            dist.broadcast_object_list(box, src=0)
            if rank != 0:
                lease = client.join(box[0])
            assert lease.len == past - base, (lease.len, past, base)
            cur["lease"] = lease
            frames_seen.append(list(lease.indices))

        def kv(i: int, k: torch.Tensor, v: torch.Tensor):
            lease = cur["lease"]
            lease.append_layer(i, k, v)
            K, V = lease.gather(i)
            if prefix:
                K, V = torch.cat([prefix[i][0], K]), torch.cat([prefix[i][1], V])
            return K, V

        def step_end() -> None:
            lease = cur["lease"]
            lease.commit()
            dist.barrier()          # every rank committed: the history grew
            lease.release()

        res = _generate(m, kv, a.prompt, a.steps, device, step_begin, step_end,
                        from_chunk=entry is not None)
        if entry is not None:
            frames_seen.insert(0, chunk_frames)
            rd.release()
        lat = group_latency(client, rank, a)
        # the same page table on both ranks, every step
        tables: List[Any] = [None] * a.tp
        dist.all_gather_object(tables, frames_seen)
        info = client.info(user)
        client.close()
        q.put({"rank": rank, "tokens": res["tokens"],
               "logits": [x.tolist() for x in res["logits"]] if rank == 0 else None,
               "same_page_tables": all(t == tables[0] for t in tables),
               "history_len": info.len, "pages_last_step": len(frames_seen[-1]),
               "latency_ns": lat, "pid": os.getpid()})
    except BaseException as e:  # noqa: BLE001  (reported, then re-raised)
        q.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})
        raise
    finally:
        dist.destroy_process_group()


def group_latency(client: Any, rank: int, a: argparse.Namespace) -> Dict[str, List[int]]:
    """--prepare-reps group steps of one token on another user: rank 0's
    prepare, rank r's join, each rank's commit, timed where they run (the
    lease id's broadcast between them is the program's, not kvpool's)."""
    out: Dict[str, List[int]] = {"prepare": [], "join": [], "commit": []}
    user = a.user + 1
    for _ in range(a.prepare_reps):
        box = [0]
        if rank == 0:
            info = client.info(user)
            t = time.perf_counter_ns()
            lease = client.prepare(user, info.start + info.len, 1)
            out["prepare"].append(time.perf_counter_ns() - t)
            box = [lease.id]
        dist.broadcast_object_list(box, src=0)
        if rank != 0:
            t = time.perf_counter_ns()
            lease = client.join(box[0])
            out["join"].append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns()
        lease.commit(0)
        out["commit"].append(time.perf_counter_ns() - t)
        dist.barrier()
        lease.release()
    return out


def _p(xs: List[int], q: float) -> Optional[int]:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_tp(a: argparse.Namespace, sock: str, role: str = "generate",
           entry: Optional[str] = None, port_off: int = 0) -> List[Dict[str, Any]]:
    """One group of a.tp rank processes (its own torch.distributed group)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 2000 + port_off
    procs = [ctx.Process(target=rank_main, args=(r, a, sock, port, q, role, entry))
             for r in range(a.tp)]
    for p in procs:
        p.start()
    out = []
    deadline = time.monotonic() + a.timeout
    while len(out) < a.tp and time.monotonic() < deadline:
        try:
            out.append(q.get(timeout=1))
        except Exception:  # noqa: BLE001  (queue.Empty: check the ranks)
            if any(p.exitcode not in (None, 0) for p in procs) and q.empty():
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return sorted(out, key=lambda r: r["rank"])


def hf_tokens(cfg: Dict[str, Any], w: Dict[str, torch.Tensor], prompt: List[int], steps: int,
              device: torch.device) -> Optional[List[int]]:
    """transformers' LlamaForCausalLM with the same weights, greedy."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    c = LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"],
                    intermediate_size=cfg["inter"], num_hidden_layers=cfg["layers"],
                    num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
                    head_dim=cfg["head_dim"], rms_norm_eps=cfg["eps"],
                    rope_theta=cfg["rope_theta"], tie_word_embeddings=False,
                    attn_implementation="eager")
    model = LlamaForCausalLM(c).to(torch.float32)
    sd = {"model.embed_tokens.weight": w["embed"], "model.norm.weight": w["norm"],
          "lm_head.weight": w["lm_head"]}
    names = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
             "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
             "wo": "self_attn.o_proj", "wg": "mlp.gate_proj", "wu": "mlp.up_proj",
             "wd": "mlp.down_proj"}
    for i in range(cfg["layers"]):
        for k, n in names.items():
            sd[f"model.layers.{i}.{n}.weight"] = w[f"{i}.{k}"]
    model.load_state_dict(sd, strict=False)
    model.to(device).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=device), max_new_tokens=steps,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvpoold")
    ap.add_argument("--cpu", action="store_true", help="gloo and the shm backend")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16, help="tokens generated")
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--user", type=int, default=31)
    ap.add_argument("--hf", action="store_true", help="also transformers' LlamaForCausalLM")
    ap.add_argument("--chunk", action="store_true",
                    help="the prompt's first half a chunk registered by another group "
                         "of processes (group fill, seal by every rank)")
    ap.add_argument("--memory", action="store_true",
                    help="TP ranks with in-memory caches, no kvpool: the sharding alone")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--prepare-reps", type=int, default=200,
                    help="group prepare/join/commit steps timed (group_prepare_p99_ns)")
    ap.add_argument("--out")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(a.seed + 1)
    a.prompt = torch.randint(0, CFG["vocab"], (a.prompt_len,), generator=g).tolist()
    if not a.cpu and torch.cuda.device_count() < a.tp:
        print(f"tp_proof: {torch.cuda.device_count()} GPU(s); TP={a.tp} needs {a.tp} "
              "(--cpu runs it on gloo and the shm backend)", file=sys.stderr)
        sys.exit(77)
    from proof_daemon import Daemon
    L = CFG
    layout = (f"layers={L['layers']},kv_heads={L['kv_heads']},head_dim={L['head_dim']},"
              f"dtype=fp32,page_tokens={L['page_tokens']}")
    devs = ",".join(str(i) for i in range(a.tp))
    d = None if a.memory else Daemon(
        a.kvpoold, layout, "16M", "shm" if a.cpu else "cuda", host_mem="32M",
        extra=[f"--devices={devs}", f"--tp={a.tp}"])
    t0 = time.monotonic()
    try:
        w = make_weights(CFG, a.seed)
        dev0 = torch.device("cpu" if a.cpu else "cuda:0")
        ref = generate_tp1(CFG, w, a.prompt, a.steps, dev0)
        hf = hf_tokens(CFG, w, a.prompt, a.steps, dev0) if a.hf else None
        reg: List[Dict[str, Any]] = []
        entry = None
        if a.chunk and d:
            # another group of processes registers the prompt's first half
            reg = run_tp(a, d.sock, role="register", port_off=3000)
            entry = reg[0].get("entry") if reg and "error" not in reg[0] else None
        ranks = run_tp(a, d.sock if d else None, entry=entry) if (entry or not a.chunk) \
            else reg
    finally:
        if d:
            d.stop()
    errors = [r["error"] for r in ranks if "error" in r]
    if len(ranks) < a.tp and not errors:
        errors.append(f"only {len(ranks)} of {a.tp} ranks reported"
                      + (f": {d.tail()[-1500:]}" if d else ""))
    res: Dict[str, Any] = {
        "what": "TP=2 Llama-shaped model on one kvpool page table vs TP=1 (issue 31)"
        + (" -- --memory: in-memory caches, no kvpool" if a.memory else ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": "cpu (gloo, shm backend)" if a.cpu else
        ", ".join(torch.cuda.get_device_name(i) for i in range(a.tp)) + " (NCCL, cuda backend)",
        "model": CFG, "tp": a.tp, "prompt_len": a.prompt_len, "steps": a.steps,
        "tp1_tokens": ref["tokens"], "errors": errors,
        "chunk": ({"entry": reg[0].get("entry"),
                   "registered_by_pids": [r.get("pid") for r in reg],
                   "generated_by_pids": [r.get("pid") for r in ranks],
                   "seal_answers": [r.get("sealed") for r in reg],
                   "same_frames_on_ranks": len({tuple(r.get("frames") or ()) for r in reg}) == 1}
                  if a.chunk and reg else None),
        "seconds": round(time.monotonic() - t0, 1),
    }
    if hf is not None:
        res["hf_tokens"] = hf
        res["hf_matches_tp1"] = hf == ref["tokens"][:len(hf)]
    if not errors:
        toks = [r["tokens"] for r in ranks]
        lg = torch.tensor(ranks[0]["logits"])
        res.update({
            "tp2_tokens": toks[0],
            "tp2_tokens_identical": all(t == ref["tokens"] for t in toks),
            "ranks_agree": all(t == toks[0] for t in toks),
            "same_page_tables": all(r["same_page_tables"] for r in ranks),
            "history_len": ranks[0]["history_len"],
            "history_len_expected": a.prompt_len + a.steps - 1
            - (a.prompt_len // 2 if a.chunk else 0),
            "max_logit_diff": float((lg - torch.stack(ref["logits"])).abs().max()),
        })
        if not a.memory:
            prep = ranks[0]["latency_ns"]["prepare"]
            joins = [x for r in ranks[1:] for x in r["latency_ns"]["join"]]
            # the group's prepare: rank 0's prepare, then the slowest join
            per = [p + max(r["latency_ns"]["join"][i] for r in ranks[1:])
                   for i, p in enumerate(prep)] if a.tp > 1 else prep
            res["group_latency_ns"] = {
                "reps": a.prepare_reps,
                "prepare_p50": _p(prep, 0.5), "prepare_p99": _p(prep, 0.99),
                "join_p50": _p(joins, 0.5), "join_p99": _p(joins, 0.99),
                "commit_p99": _p([x for r in ranks for x in r["latency_ns"]["commit"]], 0.99)}
            res["group_prepare_p99_ns"] = _p(per, 0.99)
    line = json.dumps(res)
    print(line)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    ok = not errors and res.get("tp2_tokens_identical") and res.get("same_page_tables") \
        and res.get("history_len") == res.get("history_len_expected") \
        and res.get("hf_matches_tp1", True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
