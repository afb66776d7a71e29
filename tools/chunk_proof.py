#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The GPU proof of the chunk API on a real transformer (issue 13, part 4).

kvpool.llm.ChunkedLLM drives transformers' LlamaForCausalLM (random weights
from a fixed seed, built from a config: no downloads) through
kvpool.hf_llm.HFAdapter, with its KV in a kvpoold --backend=cuda started here.
It checks and measures, and writes bench/results/chunked-llm-DATE.json:

1. outputs_identical.fp32: a small Llama-family model in fp32; greedy tokens
   from chunks == one full prefill of the concatenated prompt + DynamicCache
   decode (transformers' model.generate), for: one composition, a batch
   sharing the system with different contexts, a batch sharing system and
   context, generate(persist_chunks=True) then reuse (the reuse prefills
   nothing but the query's last token), and a composition made in a process
   other than the one that registered the chunks. At a divergence: the
   position and the reference's top-1/top-2 logit margin there.
2. outputs_identical.bf16: a model of Llama-3-8B's shapes in bf16; the same
   compositions vs DynamicCache prefilled with the same chunk boundaries
   (system, each context, query: one forward each) then decoded one token a
   step -- like for like, since bf16 rounding differs between a split and an
   unsplit prefill.
3. cascade_max_err: kvpool.cascade's level-by-level attention over pool pages
   vs attention over the concatenated sequence, fp32 and bf16, on the GPU.
4. ttft: time to first token of a 32-token query after a cached system +
   context of 1k/4k/16k/32k tokens: full prefill of the whole prompt
   (full_ms), transformers' own in-process DynamicCache reuse (inprocess_ms,
   the ceiling) and kvpool, in a process other than the one that prefilled
   the chunks (kvpool_ms) -- all three in that process, interleaved.
5. frames_freed / cuda_mem_growth_bytes: delete_chunk gives its frames back
   (daemon stats) and torch.cuda.memory_allocated() does not grow over 100
   register/generate/delete rounds.

    PYTHONPATH=build/python python3 tools/chunk_proof.py --kvpoold build/kvpoold

--quick: smaller models and contexts (what tests/python/test_llm_gpu.py runs).
Exit status 0 only when every identity check holds and the cascade errors are
within bounds (fp32 1e-5, bf16 1e-2); the speed figures are recorded, not
asserted (a busy machine must not fail the tests).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from hf_proof import Daemon, determinism, device_info, find_kvpoold  # noqa: E402


def log(msg: str) -> None:
    print(f"[chunk_proof {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sync() -> None:
    import torch
    torch.cuda.synchronize()


# ---------------------------------------------------------------- text
class IdTokenizer:
    """Text is token ids written in decimal, separated by spaces: a real
    tokenizer for a model with random weights (whatever the caller passes is
    what kvpool uses; no downloads)."""

    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        return [int(x) for x in text.split()]

    def decode(self, ids: Sequence[int], **kw: Any) -> str:
        return " ".join(str(int(i)) for i in ids)


def text(ids: Sequence[int]) -> str:
    return " ".join(str(int(i)) for i in ids)


def rand_ids(g: Any, n: int, vocab: int) -> List[int]:
    import torch
    return torch.randint(3, vocab, (n,), generator=g).tolist()


# ---------------------------------------------------------------- models
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, rope_theta=500000.0)


def configs(quick: bool) -> Dict[str, Dict[str, Any]]:
    small = dict(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=64, rope_theta=10000.0)
    if quick:
        big = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                   num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                   head_dim=64, rope_theta=500000.0)
    else:
        big = dict(LLAMA3_8B)
    return {"fp32": small, "bf16": big}


def build_model(cfg_kw: Dict[str, Any], dtype_name: str, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    cfg = LlamaConfig(max_position_embeddings=40960, bos_token_id=1, eos_token_id=None,
                      pad_token_id=0, tie_word_embeddings=False, **cfg_kw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.eval()
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.do_sample = None, 0, False
    for k in ("temperature", "top_p", "top_k"):
        if hasattr(gc, k):
            setattr(gc, k, None)
    return model


def layout_of(cfg_kw: Dict[str, Any], dtype_name: str) -> str:
    return (f"layers={cfg_kw['num_hidden_layers']},kv_heads={cfg_kw['num_key_value_heads']},"
            f"head_dim={cfg_kw['head_dim']},dtype={dtype_name},page_tokens=16")


class Counting:
    """Wraps an adapter: counts forwards and the tokens they computed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.forwards = 0
        self.tokens = 0
        for k in ("layers", "kv_heads", "head_dim", "dtype", "device", "vocab_size",
                  "eos_token_id", "heads"):
            if hasattr(inner, k):
                setattr(self, k, getattr(inner, k))

    def forward(self, tokens, positions, plan):
        self.forwards += 1
        self.tokens += int(tokens.numel())
        return self.inner.forward(tokens, positions, plan)

    def __getattr__(self, k: str) -> Any:
        return getattr(self.inner, k)


def make_llm(sock: str, model: Any, count: bool = True, attention: str = "paged"):
    """attention: "paged" (kvpool's kernel over pool pages, CUDA graphs) for
    fp32 identity and timing; "sdpa" (gather + transformers' SDPA) for the
    bf16 like-for-like checks, which need DynamicCache's own kernel."""
    import kvpool
    from kvpool.hf_llm import HFAdapter
    from kvpool.llm import ChunkedLLM
    adapter = HFAdapter(model, attention=attention)
    if count:
        adapter = Counting(adapter)
    client = kvpool.connect(sock, f"chunk_proof-{os.getpid()}")
    llm = ChunkedLLM(model=adapter, tokenizer=IdTokenizer(), client=client, max_chunks=100000,
                     chunk_memory_ratio=1.0)
    return llm, adapter, client


GREEDY = {"temperature": 0.0}


# ---------------------------------------------------------------- references
@__import__("torch").no_grad()
def ref_full(model: Any, prompt: List[int], n: int,
             forced: Optional[List[int]] = None) -> Dict[str, Any]:
    """One prefill of the whole prompt, then DynamicCache decode of n
    greedy tokens, or of the tokens ``forced`` (teacher forcing: the logits
    the reference gives after exactly that prefix), with each step's logits."""
    return _ref(model, [prompt], n, forced)


@__import__("torch").no_grad()
def ref_split(model: Any, parts: List[List[int]], n: int,
              forced: Optional[List[int]] = None) -> Dict[str, Any]:
    """DynamicCache prefilled one chunk per forward (the chunk boundaries),
    then one token per forward: what kvpool does, in transformers."""
    return _ref(model, parts, n, forced)


def _ref(model: Any, parts: List[List[int]], n: int, forced: Optional[List[int]]
         ) -> Dict[str, Any]:
    import torch
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    pos = 0
    logits = None
    for p in parts:
        ids = torch.tensor([p], device="cuda")
        posn = torch.arange(pos, pos + len(p), device="cuda")[None]
        logits = model(input_ids=ids, position_ids=posn, past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[0, -1].float()
        pos += len(p)
    toks, scores = [], []
    for i in range(n if forced is None else len(forced)):
        scores.append(logits)
        t = int(logits.argmax()) if forced is None else int(forced[i])
        toks.append(t)
        ids = torch.tensor([[t]], device="cuda")
        logits = model(input_ids=ids, position_ids=torch.tensor([[pos]], device="cuda"),
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()
        pos += 1
    return {"tokens": toks, "scores": scores}


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at |x| (8 significant bits)."""
    import math
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def compare(got: List[int], ref: Dict[str, Any], forced: Dict[str, Any],
            ulps: int = 0) -> Dict[str, Any]:
    """identical: got == the reference's own greedy tokens. consistent:
    every token got is an argmax of the reference's logits after got's own
    prefix (teacher forcing) -- the same as identical unless the reference
    meets an exact tie between its top two logits (common in bf16, whose
    logits have 8 significant bits), where either token is greedy. At the
    first difference: the position, both tokens and the reference's
    top-1/top-2 margin there."""
    want = ref["tokens"]
    r: Dict[str, Any] = {"identical": got == want, "n": len(want)}
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            top = ref["scores"][i].topk(2)
            r.update(first_diff=i, got=a, want=b,
                     ref_top1_top2_margin=float(top.values[0] - top.values[1]))
            break
    else:
        if len(got) != len(want):
            r.update(first_diff=min(len(got), len(want)), lengths=[len(got), len(want)])
    bad = None
    worst = 0.0
    for i, t in enumerate(got):
        sc = forced["scores"][i]
        top = float(sc.max())
        worst = max(worst, (top - float(sc[t])) / bf16_ulp(top))
        if float(sc[t]) < top - ulps * bf16_ulp(top):
            top = sc.topk(2)
            bad = {"position": i, "got": t, "forced_ref_argmax": int(top.indices[0]),
                   "margin": float(top.values[0] - sc[t])}
            break
    r["consistent"] = bad is None and len(got) == len(want)
    r["max_bf16_ulps_below_top"] = round(worst, 2)
    if ulps:
        r["consistent_within_bf16_ulps"] = ulps
    if bad:
        r["first_inconsistent"] = bad
    return r


def all_consistent(node: Any) -> bool:
    if isinstance(node, dict):
        if "consistent" in node:
            return bool(node["consistent"])
        return all(all_consistent(v) for v in node.values() if isinstance(v, (dict, list)))
    if isinstance(node, list):
        return all(all_consistent(v) for v in node)
    return True


# ---------------------------------------------------------------- identity
def identity_cases(llm: Any, adapter: Any, model: Any, g: Any, vocab: int, N: int,
                   split_ref: bool, other_proc: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    from kvpool.llm import ChunkType
    sp = dict(GREEDY, max_tokens=N)
    S, C1, C2, Q1, Q2 = (rand_ids(g, n, vocab) for n in (37, 101, 70, 19, 23))
    def check(got: List[int], parts: List[List[int]]) -> Dict[str, Any]:
        if split_ref:
            # A batch is not like for like with a one-row DynamicCache: its
            # rows attend through the cascade (fp32 levels merged by
            # log-sum-exp where the reference runs bf16 flash attention) and
            # its projections are GEMMs of B rows (cuBLAS picks other kernels
            # than for 1 row). Its rows are compared all the same; how far
            # below the teacher-forced reference's top logit their tokens
            # went, in bf16 steps, is recorded (max_bf16_ulps_below_top).
            return compare(got, ref_split(model, parts, N), ref_split(model, parts, N, got))
        flat = [t for p in parts for t in p]
        return compare(got, ref_full(model, flat, N), ref_full(model, flat, N, got))
    sid = llm.register_chunk(text(S), ChunkType.SYSTEM_PROMPT, {"case": "identity"})
    c1 = llm.register_chunk(text(C1), ChunkType.CONTEXT)
    c2 = llm.register_chunk(text(C2), ChunkType.CONTEXT)
    q1 = llm.register_chunk(text(Q1), ChunkType.QUERY)
    q2 = llm.register_chunk(text(Q2), ChunkType.QUERY)
    out: Dict[str, Any] = {}

    got = llm.generate_from_chunks(system_chunk_id=sid, context_chunk_ids=[c1, c2],
                                   query_chunk_id=q1, sampling_params=sp)
    out["single"] = check(got["token_ids"], [S, C1, C2, Q1])

    batch = llm.batch_generate_from_chunks(
        requests=[{"system_chunk_id": sid, "context_chunk_ids": [c1], "query_chunk_id": q1},
                  {"system_chunk_id": sid, "context_chunk_ids": [c2], "query_chunk_id": q2}],
        sampling_params=sp)
    out["batch_shared_system"] = [check(batch[0]["token_ids"], [S, C1, Q1]),
                                  check(batch[1]["token_ids"], [S, C2, Q2])]

    batch = llm.batch_generate_from_chunks(
        requests=[{"system_chunk_id": sid, "context_chunk_ids": [c1], "query_chunk_id": q1},
                  {"system_chunk_id": sid, "context_chunk_ids": [c1], "query_chunk_id": q2}],
        sampling_params=sp)
    out["batch_shared_system_context"] = [check(batch[0]["token_ids"], [S, C1, Q1]),
                                          check(batch[1]["token_ids"], [S, C1, Q2])]

    S3, C3, Q3 = (rand_ids(g, n, vocab) for n in (29, 77, 15))
    f0, t0 = adapter.forwards, adapter.tokens
    first = llm.generate(system_prompt=text(S3), context=[text(C3)], query=text(Q3),
                         sampling_params=sp, persist_chunks=True)
    f1, t1 = adapter.forwards, adapter.tokens
    ids = first["chunk_ids"]
    again = llm.generate_from_chunks(system_chunk_id=ids["system"], context_chunk_ids=ids["context"],
                                     query_chunk_id=ids["query"], sampling_params=sp)
    f2, t2 = adapter.forwards, adapter.tokens
    out["persist_then_reuse"] = {
        "first": check(first["token_ids"], [S3, C3, Q3]),
        "reuse": check(again["token_ids"], [S3, C3, Q3]),
        "first_forwards": f1 - f0, "first_tokens_computed": t1 - t0,
        "reuse_forwards": f2 - f1, "reuse_tokens_computed": t2 - t1,
        # reuse: the query's last token once (for the first logits), then N - 1 decode steps
        "reuse_prefilled_nothing": (t2 - t1) == 1 + (N - 1),
    }
    if other_proc is not None:
        ids = other_proc["ids"]
        got = llm.generate_from_chunks(system_chunk_id=ids["system"], context_chunk_ids=ids["context"],
                                       query_chunk_id=ids["query"], sampling_params=sp)
        r = check(got["token_ids"], other_proc["parts"])
        r.update(registered_by_pid=other_proc["pid"], composed_by_pid=os.getpid())
        out["other_process"] = r
    return out


def all_identical(node: Any) -> bool:
    if isinstance(node, dict):
        if "identical" in node:
            return bool(node["identical"])
        return all(all_identical(v) for k, v in node.items() if isinstance(v, (dict, list)))
    if isinstance(node, list):
        return all(all_identical(v) for v in node)
    return True


# ---------------------------------------------------------------- children
def child(spec_path: str, role: str) -> None:
    import torch
    spec = json.load(open(spec_path))
    determinism(spec.get("deterministic", True))
    model = build_model(spec["config"], spec["dtype"], spec["seed"])
    llm, adapter, client = make_llm(spec["socket"], model,
                                    attention=spec.get("attention", "paged"))
    g = torch.Generator().manual_seed(spec["seed"] + 7)
    V = spec["config"]["vocab_size"]
    if role == "register":
        from kvpool.llm import ChunkType
        S, C, Q = (rand_ids(g, n, V) for n in (41, 88, 17))
        ids = {"system": llm.register_chunk(text(S), ChunkType.SYSTEM_PROMPT),
               "context": [llm.register_chunk(text(C), ChunkType.CONTEXT)],
               "query": llm.register_chunk(text(Q), ChunkType.QUERY)}
        res = {"ids": ids, "parts": [S, C, Q], "pid": os.getpid()}
    elif role == "ttft":
        res = ttft_child(spec, llm, adapter, model, g)
    else:
        raise SystemExit(f"unknown role {role}")
    client.close()
    print(json.dumps(res))


def run_child(spec: Dict[str, Any], role: str, tmp: str, timeout: int = 1200) -> Dict[str, Any]:
    path = os.path.join(tmp, f"spec-{role}.json")
    json.dump(spec, open(path, "w"))
    r = subprocess.run([sys.executable, __file__, "--child", role, "--spec", path],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"child {role} exited {r.returncode}: {r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- ttft
def ttft_child(spec: Dict[str, Any], llm: Any, adapter: Any, model: Any, g: Any) -> Dict[str, Any]:
    """In a process that did not prefill the chunks: per context length, the
    three ways to the first token of a fresh 32-token query, interleaved."""
    import torch
    from transformers import DynamicCache
    determinism(False)   # timing: the library's fastest kernels, for all three alike
    V = spec["config"]["vocab_size"]
    reps = spec["reps"]
    rows = []
    for row in spec["contexts"]:
        S, C = row["system"], row["context"]
        L = len(S) + len(C)
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=torch.tensor([S + C], device="cuda"), past_key_values=cache,
                  use_cache=True, logits_to_keep=1)
        t_full, t_in, t_kv, agree = [], [], [], []
        for r in range(-2, reps):           # passes -2, -1 warm up (-1 captures the graph)
            q = rand_ids(g, 32, V)
            model.set_attn_implementation("sdpa")      # the baselines: transformers alone
            with torch.no_grad():
                sync()
                t0 = time.perf_counter()
                lf = model(input_ids=torch.tensor([S + C + q], device="cuda"), use_cache=False,
                           logits_to_keep=1).logits[0, -1]
                tok_full = int(lf.argmax())
                sync()
                t1 = time.perf_counter()
                li = model(input_ids=torch.tensor([q], device="cuda"), past_key_values=cache,
                           use_cache=True, logits_to_keep=1).logits[0, -1]
                tok_in = int(li.argmax())
                sync()
                t2 = time.perf_counter()
                cache.crop(L)
            model.set_attn_implementation("kvpool")
            sync()
            t3 = time.perf_counter()
            out = llm.generate(system_prompt=text(S), context=[text(C)], query=text(q),
                               sampling_params=dict(GREEDY, max_tokens=1), persist_chunks=False)
            sync()
            t4 = time.perf_counter()
            if r >= 0:
                t_full.append(t1 - t0)
                t_in.append(t2 - t1)
                t_kv.append(t4 - t3)
                agree.append([tok_full, tok_in, out["token_ids"][0]])
        del cache
        torch.cuda.empty_cache()
        med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
        full, inp, kv = med(t_full), med(t_in), med(t_kv)
        rows.append({"ctx": L, "system_tokens": len(S), "context_tokens": len(C), "query_tokens": 32,
                     "full_ms": round(full, 2), "inprocess_ms": round(inp, 2),
                     "kvpool_ms": round(kv, 2), "speedup_vs_full": round(full / kv, 2),
                     "inprocess_speedup_vs_full": round(full / inp, 2),
                     "kvpool_vs_inprocess": round(inp / kv, 3),
                     "samples_ms": {"full": [round(x * 1e3, 2) for x in t_full],
                                    "inprocess": [round(x * 1e3, 2) for x in t_in],
                                    "kvpool": [round(x * 1e3, 2) for x in t_kv]},
                     "first_tokens_full_inprocess_kvpool": agree,
                     "cuda_graphs": {k: getattr(adapter.inner, k, None) for k in
                                     ("graph_captures", "graph_replays", "graph_failures")}})
        log(f"ttft ctx {L}: full {full:.1f} ms, in-process {inp:.1f} ms, kvpool {kv:.1f} ms")
    return {"rows": rows, "pid": os.getpid()}


# ---------------------------------------------------------------- cascade
def cascade_errors(device: str, dtype: Any, seed: int = 0) -> float:
    """kvpool.cascade.Plan over paged KV on the GPU vs attention over each
    row's concatenated sequence: 3 rows sharing a system level (one group),
    a context level (a group per row, one of them shared by rows 1 and 2),
    partial last pages, GQA 32/8, head_dim 128, 5 new tokens per row
    (causal). Returns the largest absolute error."""
    import torch
    from kvpool.cascade import Level, Plan, attention_reference
    P, H, D, Hq, n = 16, 8, 128, 32, 5
    g = torch.Generator().manual_seed(seed)
    frames = 512
    cache = torch.randn(frames, 2, P, H, D, generator=g).to(dtype).to(device)
    free = torch.randperm(frames, generator=g).tolist()

    def table(tokens: int) -> List[int]:
        nonlocal free
        k = -(-tokens // P)
        out, free = free[:k], free[k:]
        return out

    def kv(tab: List[int], tokens: int):
        pos = torch.arange(tokens)
        fr = torch.tensor(tab)[pos // P].to(device)
        sl = (pos % P).to(device)
        return cache[fr, 0, sl].transpose(0, 1), cache[fr, 1, sl].transpose(0, 1)

    sys_tab = table(1000)
    ctx = [(table(777), 777), (table(2050), 2050)]
    rows_ctx = [0, 1, 1]                 # rows 1 and 2 share the second context
    levels = [Level.from_tables([(sys_tab, 1000, 3)], P, device=device),
              Level.from_tables([(ctx[0][0], ctx[0][1], [0]), (ctx[1][0], ctx[1][1], [1, 2])],
                                P, device=device)]
    q = torch.randn(3, Hq, n, D, generator=g).to(dtype).to(device)
    k = torch.randn(3, H, n, D, generator=g).to(dtype).to(device)
    v = torch.randn(3, H, n, D, generator=g).to(dtype).to(device)
    plan = Plan([cache], rows=3, n=n, levels=levels)
    out = plan.attend(0, q, k, v)                                # [3, n, Hq, D]
    err = 0.0
    for r in range(3):
        ks, vs = kv(sys_tab, 1000)
        ck, cv = kv(*ctx[rows_ctx[r]])
        K = torch.cat([ks, ck, k[r]], dim=1)
        V = torch.cat([vs, cv, v[r]], dim=1)
        want = attention_reference(q[r].float().cpu(), K.float().cpu(), V.float().cpu(),
                                   past=K.shape[1] - n)
        err = max(err, float((out[r].float().cpu() - want.float()).abs().max()))
    return err


# ---------------------------------------------------------------- memory
def memory_rounds(llm: Any, adapter: Any, client: Any, g: Any, vocab: int,
                  rounds: int) -> Dict[str, Any]:
    import torch
    from kvpool.llm import ChunkType

    def used() -> int:
        return int(client.stats()["device"]["frames_used"])

    sp = dict(GREEDY, max_tokens=4)
    llm.release_generations()
    base_frames = used()
    marks = {1, 2, 5, 10, 25, 50, 75, rounds}
    series: Dict[int, int] = {}
    freed_ok = True
    for i in range(rounds):
        S, C, Q = (rand_ids(g, n, vocab) for n in (48, 96, 16))
        ids = [llm.register_chunk(text(S), ChunkType.SYSTEM_PROMPT),
               llm.register_chunk(text(C), ChunkType.CONTEXT),
               llm.register_chunk(text(Q), ChunkType.QUERY)]
        llm.generate_from_chunks(system_chunk_id=ids[0], context_chunk_ids=[ids[1]],
                                 query_chunk_id=ids[2], sampling_params=sp)
        llm.release_generations()       # the generated tokens' sequence (active blocks)
        held = used()
        for cid in ids:
            llm.delete_chunk(cid)
        after = used()
        freed_ok = freed_ok and after == base_frames and held > after
        if i + 1 in marks:
            # CUDA graphs are a bounded cache (HFAdapter.max_graphs pools):
            # dropped first, so what is measured is what the rounds kept.
            graphs = getattr(getattr(adapter, "inner", adapter), "clear_graphs", None)
            if graphs:
                graphs()
            sync()
            series[i + 1] = torch.cuda.memory_allocated()
    # Growth from round 10 (the allocator warmed up) to the last.
    first = min(k for k in series if k >= min(10, rounds))
    return {"rounds": rounds, "frames_before": base_frames, "frames_after": used(),
            "frames_freed": freed_ok, "memory_allocated_by_round": series,
            "cuda_mem_growth_bytes": int(series[rounds] - series[first]),
            "growth_measured_from_round": first}


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvpoold")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", choices=["register", "ttft"])
    ap.add_argument("--spec")
    a = ap.parse_args()
    if a.child:
        child(a.spec, a.child)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("skip: torch sees no CUDA device", file=sys.stderr)
        return 77
    import transformers
    import kvpool
    date = datetime.datetime.now(datetime.timezone.utc)
    out_path = Path(a.out) if a.out else \
        ROOT / "bench" / "results" / f"chunked-llm-{date:%Y-%m-%d}.json"
    cfgs = configs(a.quick)
    N = a.new_tokens
    reps = a.reps if a.reps is not None else (2 if a.quick else 5)
    ctx_lens = [256, 1024] if a.quick else [1024, 4096, 16384, 32768]
    kvpoold = find_kvpoold(a.kvpoold)
    tmp = tempfile.mkdtemp(prefix="chunk-proof-")
    res: Dict[str, Any] = {
        "what": "kvpool.llm.ChunkedLLM on transformers' Llama through kvpool.hf_llm: identical "
                "outputs, cascade attention, time to first token, memory (issue 13)",
        "date": date.isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv),
        "device": device_info(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0], "kvpool": kvpool.__version__},
        "model": {"class": "LlamaForCausalLM", "weights": "random, torch.manual_seed(seed)",
                  "seed": a.seed, "fp32": cfgs["fp32"], "bf16": cfgs["bf16"],
                  "shapes": "Llama-3-8B" if not a.quick else "quick"},
        "errors": [],
        "outputs_identical": {},
    }
    ok = True
    # ---- 1. fp32: tokens vs one full prefill
    try:
        determinism(True)
        d = Daemon(kvpoold, layout_of(cfgs["fp32"], "fp32"), "2G", "cuda")
        try:
            model = build_model(cfgs["fp32"], "fp32", a.seed)
            llm, adapter, client = make_llm(d.sock, model)
            spec = {"config": cfgs["fp32"], "dtype": "fp32", "seed": a.seed, "socket": d.sock}
            other = run_child(spec, "register", tmp)
            g = torch.Generator().manual_seed(a.seed + 1)
            r = identity_cases(llm, adapter, model, g, cfgs["fp32"]["vocab_size"], N, False, other)
            res["outputs_identical"]["fp32"] = r
            res["cascade_max_err"] = {"fp32": cascade_errors("cuda", torch.float32)}
            client.close()
            del llm, adapter, model
            torch.cuda.empty_cache()
        finally:
            d.stop()
        log(f"fp32: {all_identical(res['outputs_identical']['fp32'])}")
    except Exception as e:  # noqa: BLE001 - recorded
        res["errors"].append(f"fp32: {e!r}\n{traceback.format_exc()}")
        ok = False

    # ---- 2-5. bf16 at Llama-3-8B shapes
    big = cfgs["bf16"]
    try:
        determinism(True)
        d = Daemon(kvpoold, layout_of(big, "bf16"), "8G" if a.quick else "24G", "cuda")
        res["kvpoold"] = " ".join(d.args[0:1] + d.args[2:])
        try:
            model = build_model(big, "bf16", a.seed)
            # bf16 identity is like for like: the same SDPA kernel as
            # DynamicCache (attention="sdpa"), in both processes
            llm, adapter, client = make_llm(d.sock, model, attention="sdpa")
            spec = {"config": big, "dtype": "bf16", "seed": a.seed, "socket": d.sock,
                    "attention": "sdpa"}
            other = run_child(spec, "register", tmp)
            g = torch.Generator().manual_seed(a.seed + 2)
            r = identity_cases(llm, adapter, model, g, big["vocab_size"], N, True, other)
            res["outputs_identical"]["bf16"] = r
            log(f"bf16: {all_identical(r)}")
            res.setdefault("cascade_max_err", {})["bf16"] = cascade_errors("cuda", torch.bfloat16)
            # memory rounds on the fast path (paged attention, CUDA graphs)
            llm_p, adapter_p, client_p = make_llm(d.sock, model)
            res["memory"] = memory_rounds(llm_p, adapter_p, client_p, g, big["vocab_size"],
                                         20 if a.quick else 100)
            client_p.close()
            del llm_p, adapter_p
            res["frames_freed"] = res["memory"]["frames_freed"]
            res["cuda_mem_growth_bytes"] = res["memory"]["cuda_mem_growth_bytes"]
            log(f"memory: {res['memory']}")
            # chunks for the ttft child: system + context linked under it, prefilled here
            ctxs = []
            S = rand_ids(g, 128, big["vocab_size"])
            for L in ctx_lens:
                C = rand_ids(g, L - len(S), big["vocab_size"])
                q = rand_ids(g, 32, big["vocab_size"])
                llm.generate(system_prompt=text(S), context=[text(C)], query=text(q),
                             sampling_params=dict(GREEDY, max_tokens=1), persist_chunks=True)
                ctxs.append({"system": S, "context": C})
            res["ttft_setup_pid"] = os.getpid()
            client.close()
            del llm, adapter, model
            torch.cuda.empty_cache()
            spec.update(contexts=ctxs, reps=reps, attention="paged")
            tt = run_child(spec, "ttft", tmp)
            res["ttft"] = tt["rows"]
            res["ttft_pid"] = tt["pid"]
        finally:
            d.stop()
            if d.proc.returncode not in (0, None, -15):
                res["errors"].append(f"kvpoold exited {d.proc.returncode}: {d.tail()}")
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"bf16: {e!r}\n{traceback.format_exc()}")
        ok = False

    rows = res.get("ttft", [])
    if rows:
        res["ttft_speedup_16k"] = next((r["speedup_vs_full"] for r in rows if r["ctx"] == 16384), None)
        res["ttft_vs_inprocess_min"] = min(r["kvpool_vs_inprocess"] for r in rows)
    oi = res["outputs_identical"]
    have = bool(oi.get("fp32")) and bool(oi.get("bf16"))
    b16 = oi.get("bf16", {})
    one_row = {k: v for k, v in b16.items() if not k.startswith("batch")}
    batches = {k: v for k, v in b16.items() if k.startswith("batch")}
    # fp32: every composition, batches included, vs one full prefill.
    # bf16: like for like, i.e. every one-row composition vs DynamicCache
    # with the same chunk boundaries. A bf16 batch has no like-for-like
    # reference (see check()); it is recorded, not counted.
    oi["all"] = have and all_identical(oi["fp32"]) and all_identical(one_row)
    oi["all_consistent"] = have and all_consistent(oi["fp32"]) and all_consistent(one_row)
    oi["bf16_batches_identical"] = all_identical(batches) if batches else None
    oi["bf16_batches_max_ulps_below_top"] = max(
        (r.get("max_bf16_ulps_below_top", 0) for v in batches.values() for r in v), default=None)
    ce = res.get("cascade_max_err", {})
    cascade_ok = ce.get("fp32", 1.0) <= 1e-5 and ce.get("bf16", 1.0) <= 1e-2
    ok = ok and oi["all_consistent"] and cascade_ok and not res["errors"] and bool(res.get("frames_freed"))
    res["ok"] = ok
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=1) + "\n")
    log(f"wrote {out_path}: ok={ok}")
    print(json.dumps({k: res.get(k) for k in ("ok", "ttft_speedup_16k", "ttft_vs_inprocess_min",
                                             "cascade_max_err", "frames_freed",
                                             "cuda_mem_growth_bytes")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
