# SPDX-License-Identifier: MIT
"""kvpool.llm.ChunkedLLM on the plain-torch TinyDecoder (fp32, CPU) against a
real kvpoold: seed 003's "identical outputs vs standard generation" -- greedy
tokens from registered chunks equal the tokens of one full prefill of the
concatenated prompt (TinyDecoder.greedy recomputes everything at every step)
-- for single compositions, batches sharing the system (and system+context),
generate(persist_chunks=True) then reuse with nothing prefilled, compositions
in another process than the registrant's; memory back on delete; seed 001's
list/get/filter rows; errors; seed 000's infer_from_blocks and its stream."""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sys
import textwrap
from typing import List, Sequence

import pytest
import torch

import kvpool
from conftest import SRC, Daemon, run_py
from kvpool.llm import (Block, ChunkedLLM, ChunkNotFoundError, ChunkType,
                        IncompatibleChunksError)
from tinymodels import tiny_llm_parts

GREEDY = {"temperature": 0, "max_tokens": 20, "ignore_eos": True}

SYSTEM = "You are a helpful AI assistant specialized in Python."
DOCS = ["Python is a high-level programming language with dynamic typing.",
        "Django is a web framework; it follows the model-template-view pattern!",
        "Decorators wrap a function: @decorator before def applies it."]
QUERIES = ["What are Python decorators?", "What is Django?"]


@pytest.fixture(scope="module")
def kd():
    """A daemon of this module's own (counts and clears do not disturb the
    session daemon's tests)."""
    d = Daemon(device_mem="16M", host_mem="4M")
    yield d
    d.stop()


@pytest.fixture
def llm(kd):
    model, adapter, tok = tiny_llm_parts()
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=kd.sock) as m:
        m.model = model  # the reference model, for the tests
        yield m


def expect_same(model, prompt: List[int], got: Sequence[int], what: str = "") -> None:
    """got == greedy tokens of one full prefill of prompt; otherwise say
    where they diverge and the reference's top-1/top-2 logit margin there."""
    ref = model.greedy(prompt, len(got))
    if list(got) == ref:
        return
    i = next(j for j, (a, b) in enumerate(zip(got, ref)) if a != b)
    logits = model(torch.tensor(prompt + ref[:i]))[-1]
    top = torch.topk(logits, 2).values
    pytest.fail(f"{what}: tokens differ at generated position {i} (prompt {len(prompt)} "
                f"tokens): got {got[i]}, full prefill {ref[i]}; reference top-1/top-2 "
                f"margin there {float(top[0] - top[1]):.3g}\n got {list(got)}\n ref {ref}")


def toks(llm, *texts: str) -> List[int]:
    out: List[int] = []
    for t in texts:
        out += llm.tokenizer.encode(t)
    return out


# ------------------------------------------------------------------ identity
def test_single_composition_identical_to_full_prefill(llm):
    s = llm.register_chunk(SYSTEM, ChunkType.SYSTEM_PROMPT, {"name": "python_expert"})
    c1 = llm.register_chunk(DOCS[0], ChunkType.CONTEXT, {"source": "python_docs"})
    c2 = llm.register_chunk(DOCS[2], "context", {"source": "python_docs", "section": "deco"})
    q = llm.register_chunk(QUERIES[0], ChunkType.QUERY)
    assert all(len(x) == 64 for x in (s, c1, c2, q))
    out = llm.generate_from_chunks(s, [c1, c2], q, GREEDY)
    prompt = toks(llm, SYSTEM, DOCS[0], DOCS[2], QUERIES[0])
    assert out["prompt_tokens"] == len(prompt)
    assert out["finish_reason"] == "length" and len(out["token_ids"]) == 20
    assert out["chunk_ids"] == {"system": s, "context": [c1, c2], "query": q}
    assert out["text"] == llm.tokenizer.decode(out["token_ids"])
    expect_same(llm.model, prompt, out["token_ids"], "system+2 contexts+query")
    # The same composition again: every link is cached now, nothing prefilled.
    before = dict(llm.counters)
    again = llm.generate_from_chunks(s, [c1, c2], q, GREEDY)
    assert again["token_ids"] == out["token_ids"]
    assert llm.counters["prefill_tokens"] == before["prefill_tokens"]
    assert llm.counters["links_created"] == before["links_created"]
    assert again["prefilled_tokens"] == 0 and again["cached_tokens"] == len(prompt)
    # Other orders and subsets are other chains, each exact.
    for ctx in ([c2, c1], [c1], []):
        o = llm.generate_from_chunks(s, ctx, q, GREEDY)
        texts = [DOCS[0] if c == c1 else DOCS[2] for c in ctx]
        expect_same(llm.model, toks(llm, SYSTEM, *texts, QUERIES[0]), o["token_ids"],
                    f"contexts {len(ctx)}")


def test_query_prefilled_in_the_call_uses_its_logits(llm):
    """A chain whose query link is new: the query's prefill gives the first
    logits (no recompute); long chunks over several pages and prefill pieces."""
    llm.prefill_chunk = 37  # split every prefill into pieces
    s = llm.register_chunk(SYSTEM * 3, "system_prompt")
    c = llm.register_chunk(DOCS[1] * 4, "context")
    q = llm.register_chunk("Tell me more about " + QUERIES[1], "query")
    rec = llm.counters["recompute_tokens"]
    out = llm.generate_from_chunks(s, [c], q, dict(GREEDY, max_tokens=12))
    assert llm.counters["recompute_tokens"] == rec
    expect_same(llm.model, toks(llm, SYSTEM * 3, DOCS[1] * 4, "Tell me more about " +
                                QUERIES[1]), out["token_ids"], "pieces")


def test_batch_sharing_the_system_with_different_contexts(llm):
    s = llm.register_chunk(SYSTEM, "system_prompt")
    c = [llm.register_chunk(d, "context") for d in DOCS]
    q = [llm.register_chunk(x, "query") for x in QUERIES]
    reqs = [{"system_chunk_id": s, "context_chunk_ids": [c[0]], "query_chunk_id": q[0]},
            {"system_chunk_id": s, "context_chunk_ids": [c[1]], "query_chunk_id": q[1]},
            {"system_chunk_id": s, "context_chunk_ids": [c[2], c[0]], "query_chunk_id": q[0]},
            {"system_chunk_id": s, "context_chunk_ids": [], "query_chunk_id": q[1]}]
    adapter = llm.adapter
    adapter.shapes.clear()
    outs = llm.batch_generate_from_chunks(reqs, GREEDY)
    assert len(outs) == 4
    # one batched decode: every decode forward has the 4 rows
    assert adapter.shapes.count((4, 1)) >= GREEDY["max_tokens"] - 1
    texts = [[DOCS[0], QUERIES[0]], [DOCS[1], QUERIES[1]], [DOCS[2], DOCS[0], QUERIES[0]],
             [QUERIES[1]]]
    for o, t in zip(outs, texts):
        expect_same(llm.model, toks(llm, SYSTEM, *t), o["token_ids"], f"batch row {t}")


def test_batch_sharing_system_and_context(llm):
    s = llm.register_chunk(SYSTEM, "system_prompt")
    c = llm.register_chunk(DOCS[0], "context")
    q = [llm.register_chunk(x, "query") for x in QUERIES + ["And generators?"]]
    reqs = [{"system_chunk_id": s, "context_chunk_ids": [c], "query_chunk_id": x} for x in q]
    outs = llm.batch_generate_from_chunks(reqs, GREEDY)
    for o, x in zip(outs, QUERIES + ["And generators?"]):
        expect_same(llm.model, toks(llm, SYSTEM, DOCS[0], x), o["token_ids"], x)
    # the shared system+context is one cascade group per level
    creq = [{"system": outs[0]["blocks"][0].id, "contexts": [outs[0]["blocks"][1].id],
             "query": o["blocks"][2].id} for o in outs]
    with llm.client.compose(creq) as comp:
        groups = [int(lv["ngroups"]) for lv in comp.levels]
    assert groups[0] == 1 and groups[1] == 1 and groups[-1] == 3


def test_generate_persist_then_reuse_prefills_nothing(llm):
    sp = dict(GREEDY, max_tokens=8)
    out = llm.generate("You answer in one word.", ["Paris is in France.", "Rome is in Italy."],
                       "Where is Paris?", sp, persist_chunks=True)
    prompt = toks(llm, "You answer in one word.", "Paris is in France.", "Rome is in Italy.",
                  "Where is Paris?")
    expect_same(llm.model, prompt, out["token_ids"], "generate")
    ids = out["chunk_ids"]
    assert set(ids) == {"system", "context", "query"} and len(ids["context"]) == 2
    a = llm.adapter
    f0, t0, p0 = a.forwards, a.tokens, llm.counters["prefill_tokens"]
    again = llm.generate("You answer in one word.", ["Paris is in France.", "Rome is in Italy."],
                         "Where is Paris?", sp, persist_chunks=True)
    assert again["token_ids"] == out["token_ids"] and again["chunk_ids"] == ids
    # nothing prefilled: one recompute of the query's last token, then 7 decode steps
    assert llm.counters["prefill_tokens"] == p0
    assert a.forwards - f0 == 8 and a.tokens - t0 == 8
    # and straight from the ids
    third = llm.generate_from_chunks(ids["system"], ids["context"], ids["query"], sp)
    assert third["token_ids"] == out["token_ids"]


def test_generate_without_persist_deletes_what_it_registered(llm):
    keep = llm.register_chunk("A system prompt that was there before.", "system_prompt")
    out = llm.generate("A system prompt that was there before.", "A fresh context xyz.",
                       "A fresh query xyz?", dict(GREEDY, max_tokens=4), persist_chunks=False)
    ids = out["chunk_ids"]
    assert ids["system"] == keep
    assert llm.get_chunk(keep)["chunk_id"] == keep           # not deleted: not made by it
    for cid in ids["context"] + [ids["query"]]:
        with pytest.raises(ChunkNotFoundError):
            llm.get_chunk(cid)


def test_generate_without_persist_computes_the_query_once(llm):
    """A query that is not kept is fed after the cached chain (one forward
    of its tokens, then decode), never prefilled at position 0 as a root of
    its own; the cached system and context are found by their content's
    hash (no tokenizing, no register) and their link is not recomputed."""
    sp = dict(GREEDY, max_tokens=5)
    system, ctx = "You are terse.", "The sky over Lisbon is blue today."
    llm.generate(system, ctx, "Colour?", sp, persist_chunks=True)   # chain cached
    a = llm.adapter
    names = {r["chunk_id"] for r in llm.list_chunks()}
    f0, t0 = a.forwards, a.tokens
    q = "What colour is the sky over Lisbon?"
    out = llm.generate(system, [ctx], q, sp, persist_chunks=False)
    assert a.forwards - f0 == 5                      # the query's forward + 4 decode steps
    assert a.tokens - t0 == len(toks(llm, q)) + 4
    expect_same(llm.model, toks(llm, system, ctx, q), out["token_ids"], "unkept query")
    assert {r["chunk_id"] for r in llm.list_chunks()} == names   # nothing registered
    import hashlib
    assert out["chunk_ids"]["query"] == hashlib.sha256(q.encode()).hexdigest()


# ------------------------------------------------------------------ processes
CHILD = textwrap.dedent("""
    import json, sys
    from kvpool.llm import ChunkedLLM
    from tinymodels import tiny_llm_parts
    model, adapter, tok = tiny_llm_parts()
    llm = ChunkedLLM(model=adapter, tokenizer=tok)
    cmd = json.loads(sys.argv[1])
    if cmd["op"] == "register":
        ids = [llm.register_chunk(t, k, m) for t, k, m in cmd["chunks"]]
        print(json.dumps({"ids": ids, "prefill_tokens": llm.counters["prefill_tokens"],
                          "tokens": adapter.tokens}))
    else:
        o = llm.generate_from_chunks(cmd["system"], cmd["contexts"], cmd["query"],
                                     cmd["sp"])
        print(json.dumps({"token_ids": o["token_ids"], "c": llm.counters,
                          "tokens": adapter.tokens}))
    llm.close()
""")


def _child(kd, tmp_path, cmd):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    r = run_py(str(script), json.dumps(cmd), env=kd.env(), timeout=120)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_composition_in_another_process(kd, llm, tmp_path):
    texts = [("Cross-process system prompt.", "system_prompt", {"p": "a"}),
             ("Cross-process context about kvpool pages.", "context", {"p": "a"}),
             ("What holds the pages?", "query", None)]
    got = _child(kd, tmp_path, {"op": "register", "chunks": texts})
    s, c, q = got["ids"]
    assert got["prefill_tokens"] > 0
    # this process composes what the other registered, and prefills only the links
    out = llm.generate_from_chunks(s, [c], q, GREEDY)
    expect_same(llm.model, toks(llm, *[t for t, _, _ in texts]), out["token_ids"],
                "composed in another process")
    # registering the same content here is a hit: nothing computed
    t0 = llm.adapter.tokens
    hits = llm.counters["root_hits"]
    assert [llm.register_chunk(t, k, m) for t, k, m in texts] == [s, c, q]
    assert llm.adapter.tokens == t0 and llm.counters["root_hits"] == hits + 3
    # and a third process reuses the links this one made: prefills nothing
    res = _child(kd, tmp_path, {"op": "generate", "system": s, "contexts": [c], "query": q,
                                "sp": GREEDY})
    assert res["token_ids"] == out["token_ids"]
    assert res["c"]["prefill_tokens"] == 0 and res["c"]["links_created"] == 0


# ------------------------------------------------------------------ memory
def test_delete_chunk_gives_frames_back(kd, llm):
    c = llm.client
    base = c.stats()["device"]["frames_used"]
    s = llm.register_chunk("Memory test system " * 6, "system_prompt")
    x = llm.register_chunk("Memory test context " * 9, "context")
    q = llm.register_chunk("Memory test query?", "query")
    llm.generate_from_chunks(s, [x], q, dict(GREEDY, max_tokens=3))
    used = c.stats()["device"]["frames_used"]
    assert used > base
    for cid in (q, x, s):
        llm.delete_chunk(cid)
    llm.release_generations()   # the last generation's private sequence
    assert c.stats()["device"]["frames_used"] == base
    with pytest.raises(ChunkNotFoundError):
        llm.delete_chunk(s)


# ------------------------------------------------------------------ rows
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_list_get_filters_and_dates(llm):
    s = llm.register_chunk(SYSTEM, ChunkType.SYSTEM_PROMPT,
                           {"name": "python_expert", "version": "1.0"})
    d = llm.register_chunk(DOCS[0] + " (listing)", ChunkType.CONTEXT,
                           {"source": "python_docs", "section": "intro", "n": 3})
    rows = {r["chunk_id"]: r for r in llm.list_chunks()}
    r = rows[s]
    assert set(r) == {"chunk_id", "chunk_type", "content_preview", "token_count", "metadata",
                      "created_at", "last_accessed", "access_count"}
    assert r["chunk_type"] == "system_prompt" and r["metadata"] == {"name": "python_expert",
                                                                   "version": "1.0"}
    assert r["token_count"] == len(SYSTEM.encode())
    assert SYSTEM.startswith(r["content_preview"].rstrip(".")[:20])
    assert ISO.match(r["created_at"]) and ISO.match(r["last_accessed"])
    assert r["last_accessed"] >= r["created_at"] and r["access_count"] >= 0
    sys_rows = llm.list_chunks(chunk_type=ChunkType.SYSTEM_PROMPT)
    assert s in {x["chunk_id"] for x in sys_rows} and d not in {x["chunk_id"] for x in sys_rows}
    assert [x["chunk_id"] for x in llm.list_chunks("context", {"source": "python_docs",
                                                               "n": 3})] == [d]
    assert llm.list_chunks(metadata_filter={"source": "nope"}) == []
    g = llm.get_chunk(d)
    assert g["content"] == DOCS[0] + " (listing)" and g["metadata"]["section"] == "intro"
    assert g["token_ids"] == llm.tokenizer.encode(g["content"])
    # a hit counts as an access
    n0 = llm.get_chunk(s)["access_count"]
    llm.register_chunk(SYSTEM, "system_prompt")
    assert llm.get_chunk(s)["access_count"] > n0
    st = llm.get_chunk_stats()
    assert st["total_chunks"] >= 2 and st["memory_used_mb"] > 0
    assert 0 <= st["hit_rate"] <= 1 and st["cache_hits"] >= 1


def test_clear_and_evict(kd):
    model, adapter, tok = tiny_llm_parts()
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=kd.sock) as llm:
        a = llm.register_chunk("clear me: query one", "query")
        llm.register_chunk("clear me: query two", "query")
        assert llm.clear_chunks(ChunkType.QUERY) >= 2
        assert llm.list_chunks("query") == []
        with pytest.raises(ChunkNotFoundError):
            llm.get_chunk(a)
        llm.register_chunk("evict me: context", "context")
        assert llm.evict_unused_chunks(max_age_seconds=3600) == 0
        assert llm.evict_unused_chunks(max_age_seconds=0) >= 1


# ------------------------------------------------------------------ errors
def test_errors(llm):
    s = llm.register_chunk(SYSTEM, "system_prompt")
    c = llm.register_chunk(DOCS[0], "context")
    q = llm.register_chunk(QUERIES[0], "query")
    missing = "ab" * 32
    with pytest.raises(ChunkNotFoundError) as e:
        llm.generate_from_chunks(s, [missing], q, GREEDY)
    assert e.value.chunk_id == missing and missing[:16] in str(e.value)
    assert isinstance(e.value, kvpool.NotFoundError)
    with pytest.raises(ChunkNotFoundError) as e:
        llm.get_chunk(missing)
    assert e.value.chunk_id == missing
    with pytest.raises(ChunkNotFoundError):
        llm.get_chunk("not-an-id")
    with pytest.raises(IncompatibleChunksError):
        llm.generate_from_chunks(c, [s], q, GREEDY)            # a context as the system
    with pytest.raises(IncompatibleChunksError):
        llm.generate_from_chunks(s, [c], c, GREEDY)            # a context as the query
    with pytest.raises(IncompatibleChunksError):
        llm.generate_from_chunks(s, [q], q, GREEDY)            # a query as a context
    with pytest.raises(IncompatibleChunksError):
        llm.register_chunk(SYSTEM, "context")                  # same content, other type
    with pytest.raises(ValueError):
        ChunkType.of("document")
    with pytest.raises(ValueError):
        llm.register_chunk("", "query")


# ------------------------------------------------------------------ seed 000
def test_infer_from_blocks_continues_a_generation(llm):
    s = llm.register_chunk(SYSTEM, "system_prompt")
    c = llm.register_chunk(DOCS[2], "context")
    q = llm.register_chunk(QUERIES[0], "query")
    out = llm.generate_from_chunks(s, [c], q, dict(GREEDY, max_tokens=6))
    prompt = toks(llm, SYSTEM, DOCS[2], QUERIES[0])
    blocks, count = llm.get_all_active_blocks()
    assert [b.kind for b in blocks] == ["entry", "entry", "entry", "seq"]
    assert all(isinstance(b, Block) for b in blocks)
    # the last generated token has no KV yet: the blocks hold the rest
    assert count == len(prompt) + 5
    assert llm.get_conversation_blocks() == (blocks, count)
    # continue, with new tokens
    new = llm.tokenizer.encode(" Continue this thought: ")
    r = llm.infer_from_blocks(blocks, count, new, dict(GREEDY, max_tokens=7))
    full = prompt + out["token_ids"] + new
    expect_same(llm.model, full, r["token_ids"], "infer with new tokens")
    assert r["prompt_tokens"] == len(full)
    # and again from that generation's blocks, without new tokens, streamed
    blocks2, count2 = llm.get_all_active_blocks()
    assert count2 == len(full) + 6
    pieces = list(llm.infer_from_blocks_stream(blocks2, count2, None,
                                               dict(GREEDY, max_tokens=5)))
    ids = [p["token_id"] for p in pieces]
    expect_same(llm.model, full + r["token_ids"], ids, "stream, no new tokens")
    assert "".join(p["token"] for p in pieces) == pieces[-1]["text"]
    assert pieces[-1]["finish_reason"] == "length" and pieces[-1]["result"]["token_ids"] == ids
    # a continuation of only the chunks (no generated tokens): recompute the last token
    r3 = llm.infer_from_blocks(blocks[:3], len(prompt), None, dict(GREEDY, max_tokens=6))
    assert r3["token_ids"] == out["token_ids"]


def test_infer_from_blocks_manual_prompt_and_checks(llm):
    prompt = llm.tokenizer.encode("<|im_start|>system\nYou are helpful.\n<|im_end|>\n"
                                  "<|im_start|>assistant\n")
    r = llm.infer_from_blocks([], 0, prompt, dict(GREEDY, max_tokens=9))
    expect_same(llm.model, prompt, r["token_ids"], "manual prompt")
    blocks, count = llm.get_all_active_blocks()
    assert count == len(prompt) + 8
    with pytest.raises(ValueError):
        llm.infer_from_blocks(blocks, count + 1, None, GREEDY)     # wrong count
    with pytest.raises(TypeError):
        llm.infer_from_blocks([17, 18], 32, None, GREEDY)          # frame numbers
    s = llm.register_chunk(SYSTEM, "system_prompt")
    c = llm.register_chunk(DOCS[1], "context")
    sroot = llm.client.chunk_get(s)["root"]
    croot = llm.client.chunk_get(c)["root"]
    links = llm.counters["links_created"]
    with pytest.raises(ValueError):                                 # wrong count:
        llm.infer_from_blocks([sroot, croot], 0, None, GREEDY)
    assert llm.counters["links_created"] == links                   # nothing made
    # not a chain: the context's root is replaced by its link under the system
    n = len(SYSTEM.encode()) + len(DOCS[1].encode())
    r1 = llm.infer_from_blocks([sroot, croot], n, None, dict(GREEDY, max_tokens=5))
    assert r1["token_ids"] == llm.model.greedy(toks(llm, SYSTEM, DOCS[1]), 5)
    assert [b.id for b in r1["blocks"][:2]] != [sroot, croot]
    # a root entry alone is a valid start (a chunk's own KV at position 0)
    r2 = llm.infer_from_blocks([croot], len(DOCS[1].encode()), None,
                               dict(GREEDY, max_tokens=5))
    ref = llm.model.greedy(llm.tokenizer.encode(DOCS[1]), 5)
    assert r2["token_ids"] == ref


def test_sampling_is_seeded(llm):
    s = llm.register_chunk(SYSTEM, "system_prompt")
    q = llm.register_chunk(QUERIES[1], "query")
    sp = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "max_tokens": 10, "seed": 7,
          "ignore_eos": True}
    a = llm.generate_from_chunks(s, [], q, sp)["token_ids"]
    b = llm.generate_from_chunks(s, [], q, sp)["token_ids"]
    assert a == b and len(a) == 10
    g = llm.generate_from_chunks(s, [], q, GREEDY)["token_ids"]
    st = llm.generate_from_chunks(s, [], q, dict(GREEDY, stop_token_ids=[g[4]]))
    assert st["finish_reason"] == "stop" and st["token_ids"] == g[:g.index(g[4]) + 1]


def test_keep_chain_kv_gives_the_same_tokens(kd, llm):
    """keep_chain_kv (one gather of the chain per layer per generation) and
    prefill pieces change nothing in the tokens."""
    s = llm.register_chunk(SYSTEM, "system_prompt")
    c = llm.register_chunk(DOCS[1], "context")
    q = llm.register_chunk(QUERIES[1], "query")
    reqs = [{"system_chunk_id": s, "context_chunk_ids": [c], "query_chunk_id": q},
            {"system_chunk_id": s, "context_chunk_ids": [], "query_chunk_id": q}]
    want = [o["token_ids"] for o in llm.batch_generate_from_chunks(reqs, GREEDY)]
    model, adapter, tok = tiny_llm_parts()
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=kd.sock, keep_chain_kv=True,
                    prefill_chunk=5) as other:
        got = [o["token_ids"] for o in other.batch_generate_from_chunks(reqs, GREEDY)]
        assert got == want
        r = other.infer_from_blocks([], 0, tok.encode(SYSTEM + QUERIES[1]), GREEDY)
        assert r["token_ids"] == want[1]


def test_a_failing_forward_keeps_nothing(kd, llm):
    """A model error mid-generation: the private sequences are freed, the
    pool's frames are back, and the next generation works."""
    s = llm.register_chunk(SYSTEM, "system_prompt")
    q = llm.register_chunk(QUERIES[0], "query")
    llm.generate_from_chunks(s, [], q, dict(GREEDY, max_tokens=2))
    llm.release_generations()
    used = llm.client.stats()["device"]["frames_used"]
    real = llm.adapter.forward
    calls = [0]

    def flaky(tokens, positions, plan):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("model failure")
        return real(tokens, positions, plan)
    llm.adapter.forward = flaky
    try:
        with pytest.raises(RuntimeError):
            llm.generate_from_chunks(s, [], q, dict(GREEDY, max_tokens=8))
    finally:
        llm.adapter.forward = real
    assert llm.client.stats()["device"]["frames_used"] == used
    out = llm.generate_from_chunks(s, [], q, dict(GREEDY, max_tokens=5))
    expect_same(llm.model, toks(llm, SYSTEM, QUERIES[0]), out["token_ids"], "after a failure")


# ------------------------------------------------------------------ tokens, not text
# Issue 25 item 7: a chunk's KV is found by its tokens (and parent, layout,
# tenant), never by its text alone. Two processes whose tokenizers give the
# same text other tokens each get the KV of their own tokens.
TOKENIZER_CHILD = textwrap.dedent("""
    import json, sys
    from typing import List
    from kvpool.llm import ChunkedLLM
    from tinymodels import ByteTokenizer, tiny_llm_parts
    exec(sys.argv[2])  # MergeTokenizer's source
    model, adapter, tok = tiny_llm_parts()
    cmd = json.loads(sys.argv[1])
    tok = MergeTokenizer() if cmd["tokenizer"] == "merge" else ByteTokenizer()
    llm = ChunkedLLM(model=adapter, tokenizer=tok)
    ids = [llm.register_chunk(t, k, m) for t, k, m in cmd["chunks"]]
    o = llm.generate_from_chunks(ids[0], ids[1:-1], ids[-1], cmd["sp"])
    print(json.dumps({"ids": ids, "token_ids": o["token_ids"],
                      "chunk_tokens": [llm.get_chunk(i)["token_ids"] for i in ids],
                      "prompt": [t for x, _, _ in cmd["chunks"] for t in tok.encode(x)]}))
    llm.close()
""")


class MergeTokenizer:
    """Another tokenizer over the byte vocabulary: "th" is one token (1) and
    "e " another (2), so a text gets fewer tokens than ByteTokenizer gives."""

    eos_token_id = 257

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        b = text.encode("utf-8")
        out, i = [], 0
        while i < len(b):
            pair = b[i:i + 2]
            if pair in (b"th", b"e "):
                out.append(1 if pair == b"th" else 2)
                i += 2
            else:
                out.append(b[i])
                i += 1
        return out

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        m = {1: b"th", 2: b"e "}
        return b"".join(m.get(int(i), bytes([int(i)])) for i in ids
                        if 0 <= int(i) < 256).decode("utf-8", "replace")


def _tokenizer_child(kd, tmp_path, tokenizer, chunks):
    script = tmp_path / "tok_child.py"
    script.write_text(TOKENIZER_CHILD)
    cmd = {"tokenizer": tokenizer, "chunks": chunks, "sp": GREEDY}
    r = run_py(str(script), json.dumps(cmd), inspect.getsource(MergeTokenizer),
               env=kd.env(), timeout=120)
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("meta, merge_first", [(None, False), ({"who": "either"}, True)],
                         ids=["plain-bytes-first", "metadata-merge-first"])
def test_same_text_other_tokenizer_gets_its_own_kv(kd, llm, tmp_path, meta, merge_first):
    tag = "m" if meta else "p"
    texts = [(f"The system {tag}: the other tokenizer merges the pairs.", "system_prompt"),
             (f"Context {tag}: the theme of the theatre is there.", "context"),
             (f"What is {tag} the", "query")]
    chunks = [(t, k, meta) for t, k in texts]
    merge = MergeTokenizer()
    for t, _ in texts:
        assert len(merge.encode(t)) < len(llm.tokenizer.encode(t))
    # one tokenizer's process, then the other's (the second finds the
    # text's name holding the first one's tokens); then the byte tokenizer
    # again (this process)
    if merge_first:
        b = _tokenizer_child(kd, tmp_path, "merge", chunks)
        a = _tokenizer_child(kd, tmp_path, "bytes", chunks)
    else:
        a = _tokenizer_child(kd, tmp_path, "bytes", chunks)
        b = _tokenizer_child(kd, tmp_path, "merge", chunks)
    first = b if merge_first else a
    assert first["ids"] == [hashlib.sha256(t.encode()).hexdigest() for t, _ in texts]
    for got, tok in ((a, llm.tokenizer), (b, merge)):
        prompt = [x for t, _ in texts for x in tok.encode(t)]
        assert got["prompt"] == prompt
        assert got["chunk_tokens"] == [tok.encode(t) for t, _ in texts]
        expect_same(llm.model, prompt, got["token_ids"], type(tok).__name__)
    assert a["token_ids"] != b["token_ids"]   # other tokens, other outputs (checked)
    ids = [llm.register_chunk(t, k, meta) for t, k in texts]
    assert ids == a["ids"]
    assert [llm.get_chunk(i)["token_ids"] for i in ids] == [llm.tokenizer.encode(t)
                                                           for t, _ in texts]
    out = llm.generate_from_chunks(ids[0], ids[1:-1], ids[-1], GREEDY)
    assert out["token_ids"] == a["token_ids"]
    # and a second merging process finds the first one's chunks: nothing new
    again = _tokenizer_child(kd, tmp_path, "merge", chunks)
    assert again["ids"] == b["ids"] and again["token_ids"] == b["token_ids"]


def test_a_name_recreated_with_other_tokens_is_not_taken_from_the_cache(kd, llm, tmp_path):
    """This process knows a text's name and tokens; another process deletes
    it and registers the same text with its own tokenizer under the same
    name. Generating here must use the name's tokens now, not the ones this
    process remembered (same count, other ids: the link is filled right)."""
    s = llm.register_chunk("Recreated system prompt.", "system_prompt")
    text = "abcdefgh"             # no merge pair: both tokenizers agree on its length
    q = llm.register_chunk(text, "query")
    llm.generate_from_chunks(s, [], q, GREEDY)   # caches q's tokens here

    class Shift(MergeTokenizer):
        def encode(self, t, add_special_tokens=False):
            return [x + 1 for x in t.encode("utf-8")]
    other = ChunkedLLM(model=llm.adapter, tokenizer=Shift(), socket=kd.sock)
    try:
        other.delete_chunk(q)
        assert other.register_chunk(text, "query") == q
    finally:
        other.close()
    out = llm.generate_from_chunks(s, [], q, GREEDY)
    shifted = [x + 1 for x in text.encode("utf-8")]
    expect_same(llm.model, llm.tokenizer.encode("Recreated system prompt.") + shifted,
                out["token_ids"], "the name's tokens now")


def test_layout_mismatch_names_the_layout_to_start_kvpoold_with():
    """A pool whose layout is not the model's: IncompatibleChunksError naming
    a --layout to start kvpoold with (not an AttributeError from close()
    running before the object had its lock), and the client made for it is
    closed (issue 26, item 3)."""
    d = Daemon(layout="layers=2,kv_heads=2,head_dim=8,dtype=fp32,page_tokens=16")
    try:
        _, adapter, tok = tiny_llm_parts()
        with pytest.raises(IncompatibleChunksError) as ei:
            ChunkedLLM(model=adapter, tokenizer=tok, socket=d.sock)
        msg = str(ei.value)
        assert "--layout=layers=2,kv_heads=2,head_dim=16,dtype=fp32,page_tokens=16" in msg, msg
        assert "head_dim=8" in msg, msg
    finally:
        d.stop()
