# SPDX-License-Identifier: MIT
"""The remote tier on a real model across two daemons: kvpoold A and B on
one 3-node Redis Cluster (loopback), the TinyDecoder (fp32, CPU) on each.
What A computed and evicted is fetched by B through the store and B's greedy
tokens equal one full prefill's (the reference, as test_llm.py compares)
and A's, with less prefill on B:

- chunks: A registers a system prompt and documents (sealed roots) and a
  query, and generates; other chunks push them out of A's device tier
  (written behind); B's registrations find the system prompt and documents
  sealed (nothing prefilled), onloaded from the store, and B's generation
  prefills only the query and the links (contexts and query under the
  system prompt: links and queries are not stored); the same with chunks A
  still holds (published ahead of eviction);
- chunk ids: B, never registering them, continues after A's system prompt
  given its root entry id (infer_from_blocks), makes a sequence over a
  chunk, and generates from A's chunk ids: the store gives them back;
- prefix cache: A computes a prompt over a kvpool sequence, other prompts
  evict its pages; B's prefix lookup reports its full pages cached, B
  computes only the tail and decodes the reference's tokens;
- a store node hung (SIGSTOP) while B asks for the prompt, then SIGKILLed:
  the prompt is served up to its first page there, exactly the chunks with
  a key on that node (found with redis-cli --scan) are recomputed on B;
  B's tokens are still the reference's, in bounded time;
- tools/remote_llm_proof.py (the GPU proof) at a small size on the CPU.

Skips (with the reason) without redis-server / redis-cli or without the
remote tier in kvpoold (built without hiredis)."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from typing import Iterator, List, Tuple

import pytest

import kvpool
from conftest import SRC, Daemon
from kvpool.llm import ChunkedLLM, ChunkType
from remote_fixtures import (RedisCluster, drain, fill_prefix_cache, metrics,
                             remote_daemon, seq_generate)
from test_llm import expect_same
from tinymodels import tiny_llm_parts

GREEDY = {"temperature": 0, "max_tokens": 16, "ignore_eos": True}

# A system prompt of 13 full pages and some: the KV B should not compute.
SYSTEM = "You are a helpful AI assistant specialized in Python and its tools. " * 3
DOCS = ["Python is a high-level programming language with dynamic typing.",
        "Django is a web framework; it follows the model-template-view pattern!",
        "Decorators wrap a function: @decorator before def applies it."]
QUERY = "What are Python decorators?"
ONLOADED = "kvpool_remote_onloaded_pages_total"
WRITTEN = "kvpool_remote_written_pages_total"


@pytest.fixture(scope="module", autouse=True)
def _collect() -> Iterator[None]:
    """After the module, collect the cycles its tests leave (a failure's
    traceback holds a ChunkedLLM whose views keep its daemon's memory
    mapped): test_zero_copy counts this process's mappings."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[RedisCluster]:
    c = RedisCluster(3)
    yield c
    c.stop()


@pytest.fixture
def cluster(shared_cluster) -> Iterator[RedisCluster]:
    """The module's cluster, emptied (FLUSHALL)."""
    shared_cluster.flushall()
    yield shared_cluster


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """A cluster of the test's own (one whose nodes it kills)."""
    c = RedisCluster(3)
    yield c
    c.stop()


@contextlib.contextmanager
def pair(cluster: RedisCluster) -> Iterator[Tuple[Daemon, Daemon]]:
    """Daemons A (a 1 MiB device tier: 128 pages of 8 KiB, so eviction
    comes soon) and B, on the cluster."""
    a = remote_daemon(cluster, device_mem="1M", host_mem="1M")
    try:
        b = remote_daemon(cluster, device_mem="4M", host_mem="1M")
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def nodes(cluster):
    with pair(cluster) as ab:
        yield ab


@pytest.fixture
def own_nodes(own_cluster):
    with pair(own_cluster) as ab:
        yield ab


def toks(tok, *texts: str) -> List[int]:
    out: List[int] = []
    for t in texts:
        out += tok.encode(t)
    return out


def register_all(llm: ChunkedLLM):
    s = llm.register_chunk(SYSTEM, ChunkType.SYSTEM_PROMPT, {"name": "py"})
    c = [llm.register_chunk(d, ChunkType.CONTEXT, {"doc": i}) for i, d in enumerate(DOCS)]
    q = llm.register_chunk(QUERY, ChunkType.QUERY)
    return s, c, q


def push_out_chunks(llm: ChunkedLLM) -> None:
    """Evict every chunk of the daemon: with the tenant's max_chunks at 1, a
    new name evicts every other name first (kvp_chunk_limits), each sealed
    root written behind to the store."""
    llm.client.chunk_limits(max_chunks=1)
    llm.register_chunk("a filler document that pushes the others out", ChunkType.CONTEXT)
    llm.client.chunk_limits(max_chunks=1000)
    left = [r["id"] for r in llm.client.chunk_list()]
    assert len(left) == 1, f"{len(left)} chunks left on the daemon, want the filler only"


# ------------------------------------------------------------------ chunks
def test_chunks_computed_on_a_served_on_b(cluster, nodes):
    a, b = nodes
    model, adapter, tok = tiny_llm_parts()
    prompt = toks(tok, SYSTEM, DOCS[0], DOCS[2], QUERY)
    ref = model.greedy(prompt, GREEDY["max_tokens"])
    root_tokens = len(toks(tok, SYSTEM, *DOCS, QUERY))
    # What the store keeps: system prompts and contexts (remote_chunk_types'
    # default; a query is unique to its request).
    stored_pages = sum(-(-len(tok.encode(t)) // 16) for t in (SYSTEM, *DOCS))  # 26
    qlen = len(tok.encode(QUERY))

    with ChunkedLLM(model=adapter, tokenizer=tok, socket=a.sock) as la:
        s, c, q = register_all(la)
        assert la.counters["roots_created"] == 5
        assert la.counters["prefill_tokens"] == root_tokens
        out_a = la.generate_from_chunks(s, [c[0], c[2]], q, GREEDY)
        assert out_a["token_ids"] == ref, "A's own generation is not the reference's"
        prefill_a = la.counters["prefill_tokens"]
        la.release_generations()
        push_out_chunks(la)
    ma = drain(a)
    assert ma[WRITTEN] >= stored_pages, f"A wrote {ma[WRITTEN]:.0f} pages to the store"
    assert cluster.dbsize() > 0

    onl0 = metrics(b)[ONLOADED]
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=b.sock) as lb:
        s2, c2, q2 = register_all(lb)
        assert (s2, c2, q2) == (s, c, q)
        # Found sealed in the store: nothing prefilled on B for the system
        # prompt and the documents; the query was not stored.
        assert lb.counters["root_hits"] == 4 and lb.counters["roots_created"] == 1
        assert lb.counters["prefill_tokens"] == qlen
        onl = metrics(b)[ONLOADED] - onl0
        assert onl == stored_pages, f"B onloaded {onl:.0f} pages from the store, " \
            f"want {stored_pages}"
        row = lb.get_chunk(s)
        assert row["content"] == SYSTEM and row["metadata"] == {"name": "py"}
        out_b = lb.generate_from_chunks(s, [c[0], c[2]], q, GREEDY)
        expect_same(model, prompt, out_b["token_ids"], "B over A's chunks")
        assert out_b["token_ids"] == out_a["token_ids"]
        # B prefilled the query and the links only (contexts and query under
        # the system prompt: links are not in the store); A prefilled those
        # and every root.
        links = len(toks(tok, DOCS[0], DOCS[2], QUERY))
        assert lb.counters["prefill_tokens"] == qlen + links
        assert prefill_a == root_tokens + links


def test_chunks_a_still_holds_reach_b(cluster, nodes):
    """Published ahead of eviction: A keeps its chunks, its reclaimer queues
    them for the store anyway, and B gets them from there."""
    a, b = nodes
    model, adapter, tok = tiny_llm_parts()
    prompt = toks(tok, SYSTEM, DOCS[1], QUERY)
    stored_pages = sum(-(-len(tok.encode(t)) // 16) for t in (SYSTEM, *DOCS))  # 26
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=a.sock) as la:
        s, c, q = register_all(la)
        out_a = la.generate_from_chunks(s, [c[1]], q, GREEDY)
        # Every stored chunk's record is in the store (it goes with the
        # chunk's last pages), then the queue is empty (those pages' round
        # is over).
        deadline = time.monotonic() + 10
        while not {s, *c} <= cluster.chunk_records():
            assert time.monotonic() < deadline, \
                f"A's chunks not in the store ahead of eviction: {metrics(a)[WRITTEN]:.0f} " \
                "pages written"
            time.sleep(0.05)
        drain(a)
        assert len(la.client.chunk_list()) == 5   # A still holds every chunk
        onl0 = metrics(b)[ONLOADED]
        with ChunkedLLM(model=adapter, tokenizer=tok, socket=b.sock) as lb:
            assert register_all(lb) == (s, c, q)
            assert lb.counters["root_hits"] == 4 and lb.counters["roots_created"] == 1
            assert metrics(b)[ONLOADED] - onl0 == stored_pages
            out_b = lb.generate_from_chunks(s, [c[1]], q, GREEDY)
    assert out_b["token_ids"] == out_a["token_ids"]
    expect_same(model, prompt, out_b["token_ids"], "B over chunks A still holds")


def a_chunks_in_store(a: Daemon, model, adapter, tok):
    """A registers the chunks and evicts them (written behind); returns
    (system name, its root entry id, context names, query name)."""
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=a.sock) as la:
        s, c, q = register_all(la)
        root = la.client.chunk_get(s)["root"]
        push_out_chunks(la)
    drain(a)
    return s, root, c, q


def test_chunk_ids_on_b(cluster, nodes):
    """B never registers: A's root entry id, given to infer_from_blocks,
    comes from the store (chunk_entry and the acquire bring it back), and so
    does a sequence over a chunk by name; B's model continues after A's
    system prompt with only the new tokens prefilled."""
    a, b = nodes
    model, adapter, tok = tiny_llm_parts()
    s, root, c, _ = a_chunks_in_store(a, model, adapter, tok)
    n = len(tok.encode(SYSTEM))
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=b.sock) as lb:
        q = tok.encode(QUERY)
        out = lb.infer_from_blocks([root], n, q, GREEDY)
        assert lb.counters["prefill_tokens"] == len(q)
        expect_same(model, tok.encode(SYSTEM) + q, out["token_ids"], "B after A's root")
        with lb.client.seq_create(5, [kvpool.src_chunk(c[1])], 3) as vs:
            assert vs.len == len(tok.encode(DOCS[1]))
        lb.client.seq_free(5)
        assert lb.get_chunk(c[1])["content"] == DOCS[1]


def test_generate_from_a_chunk_ids_on_b(cluster, nodes):
    """B generates from A's chunk ids (only the query registered on B: a
    query is not stored); the system prompt's and the document's roots come
    from the store, B prefills the query and the links."""
    a, b = nodes
    model, adapter, tok = tiny_llm_parts()
    s, root, c, _ = a_chunks_in_store(a, model, adapter, tok)
    onl0 = metrics(b)[ONLOADED]
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=b.sock) as lb:
        q = lb.register_chunk(QUERY, ChunkType.QUERY)   # queries are not stored
        out = lb.generate_from_chunks(s, [c[0]], q, GREEDY)
        qlen = len(tok.encode(QUERY))
        assert lb.counters["prefill_tokens"] == qlen + len(toks(tok, DOCS[0], QUERY))
    pages = sum(-(-len(tok.encode(t)) // 16) for t in (SYSTEM, DOCS[0]))
    assert metrics(b)[ONLOADED] - onl0 == pages
    expect_same(model, toks(tok, SYSTEM, DOCS[0], QUERY), out["token_ids"],
                "B from A's chunk ids")


# ------------------------------------------------------------------ prefix cache
def test_prefix_pages_computed_on_a_continued_on_b(cluster, nodes):
    a, b = nodes
    model, _, tok = tiny_llm_parts()
    prompt = toks(tok, SYSTEM, DOCS[1], QUERY)   # 19 full pages and 10 tokens
    full = len(prompt) // 16 * 16
    steps = 12
    ref = model.greedy(prompt, steps)
    with kvpool.connect(a.sock, "A") as ca:
        got = seq_generate(ca, model, 1, prompt, steps)
        assert got["cached"] == 0 and got["tokens"] == ref
        assert ca.prefix_lookup(prompt)["tokens"] == full
        fill_prefix_cache(ca, 100, 10, 250, base=7)   # 150 pages through 128
    # (A's own lookup now would fetch the prompt back from the store.)
    ma = drain(a)
    assert ma['kvpool_prefix_evicted_pages_total{tenant="default",pool="0",gpu="0"}'] >= full // 16
    assert ma[WRITTEN] >= full // 16, f"A wrote {ma[WRITTEN]:.0f} pages to the store"

    m0 = metrics(b)
    with kvpool.connect(b.sock, "B") as cb:
        hit = cb.prefix_lookup(prompt)
        assert hit["tokens"] == full, f"B: {hit['tokens']} tokens cached, want {full}"
        got = seq_generate(cb, model, 1, prompt, steps)
    onl = metrics(b)[ONLOADED] - m0[ONLOADED]
    assert onl == full // 16, f"B onloaded {onl:.0f} pages, want {full // 16}"
    assert got["cached"] == full and got["computed"] == len(prompt) - full
    expect_same(model, prompt, got["tokens"], "B over A's prefix pages")


# ------------------------------------------------------------------ a store node lost
NOTES = ["Why?", "And Django?", "How so?", "Is it fast?"]   # contexts of one page


def test_store_node_hung_then_killed_b_recomputes(own_cluster, own_nodes):
    """One store node of three hangs (SIGSTOP) while B asks for a prompt,
    then dies (SIGKILL) before B registers the chunks: B computes what it
    cannot fetch, in bounded time, and its tokens are the reference's."""
    cluster = own_cluster
    a, b = own_nodes
    model, adapter, tok = tiny_llm_parts()
    prompt = toks(tok, SYSTEM, DOCS[0], DOCS[1], DOCS[2], QUERY) * 2  # 54 full pages
    full = len(prompt) // 16 * 16
    steps = 8
    ref = model.greedy(prompt, steps)
    cprompt = toks(tok, SYSTEM, DOCS[1], QUERY)
    cref = model.greedy(cprompt, GREEDY["max_tokens"])
    with kvpool.connect(a.sock, "A") as ca:
        assert seq_generate(ca, model, 1, prompt, steps)["tokens"] == ref
        fill_prefix_cache(ca, 100, 10, 250, base=11)
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=a.sock) as la:
        s, c, q = register_all(la)
        extra = [la.register_chunk(x, ChunkType.CONTEXT) for x in NOTES]
        push_out_chunks(la)
    drain(a)

    # The node to lose holds a key of some chunks and none of others: B
    # must find the latter sealed and recompute the former.
    where = cluster.chunk_nodes()
    names = [s, *c, q, *extra]
    assert q not in where, "a query chunk is in the store"
    assert all(n in where for n in names if n != q), "a chunk of A is not in the store"
    where[q] = set()
    stored = [n for n in names if n != q]
    dead = next((i for i in range(3) if any(i in where[n] for n in stored) and
                 any(i not in where[n] for n in stored)), 1)
    lost = {n for n in names if dead in where[n]} | {q}   # and q: never stored
    cluster.pause(dead)
    t0 = time.monotonic()
    with kvpool.connect(b.sock, "B") as cb:
        got = seq_generate(cb, model, 1, prompt, steps)
    hung_s = time.monotonic() - t0
    cluster.kill(dead)
    t0 = time.monotonic()
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=b.sock) as lb:
        texts = [(SYSTEM, ChunkType.SYSTEM_PROMPT), *[(d, ChunkType.CONTEXT) for d in DOCS],
                 (QUERY, ChunkType.QUERY), *[(x, ChunkType.CONTEXT) for x in NOTES]]
        for n, (text, ct) in zip(names, texts):
            before = lb.counters["roots_created"]
            assert lb.register_chunk(text, ct) == n
            created = lb.counters["roots_created"] > before
            assert created == (n in lost), \
                (f"chunk {n[:16]} with {'a' if n in lost else 'no'} key on the dead node "
                 f"(or a query): B {'computed' if created else 'found'} it")
        out = lb.generate_from_chunks(s, [c[1]], q, GREEDY)
    took = time.monotonic() - t0
    # 54 pages spread over three nodes: B got the run before the first page
    # on the hung node (maybe none) from the store and computed the rest.
    assert got["cached"] < full, "B found every page with a store node hung"
    expect_same(model, prompt, got["tokens"], "B with a store node hung")
    expect_same(model, cprompt, out["token_ids"], "B's chunks with a store node down")
    assert out["token_ids"] == cref
    # A hung node costs a round its timeout (--remote_timeout_ms=2000), then
    # is down for a second: B's prompt in a few timeouts, not a hang.
    assert hung_s < 8, f"B took {hung_s:.1f} s with a store node hung"
    assert took < 15, f"B took {took:.1f} s with a store node down"
    m = metrics(b)
    node = f"127.0.0.1:{cluster.ports[dead]}"
    assert m[f'kvpool_remote_node_up{{node="{node}"}}'] == 0
    assert m[f'kvpool_remote_node_errors_total{{node="{node}"}}'] >= 1
    with kvpool.connect(b.sock, "B2") as cb:   # B still serves
        assert cb.prefix_lookup(prompt)["tokens"] >= got["cached"]


# ------------------------------------------------------------------ the GPU proof's dry run
def test_remote_llm_proof_tiny(cluster, tmp_path):
    """tools/remote_llm_proof.py (the lead runs it with a Llama on the GPU)
    with the TinyDecoder at a small size, on this module's cluster."""
    out = tmp_path / "proof.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""),
                                                    str(SRC / "examples" / "python")] if p)
    r = subprocess.run([sys.executable, str(SRC / "tools" / "remote_llm_proof.py"),
                        "--model", "tiny", "--remote", cluster.url, "--system", "64",
                        "--docs", "2", "--doc-tokens", "48", "--query", "8",
                        "--max-tokens", "6", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    if r.returncode == 77:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, f"remote_llm_proof exited {r.returncode}:\n{r.stderr[-3000:]}"
    res = json.loads(out.read_text())
    assert res["identical_A_B"] and res["identical_reference"]
    assert res["A"]["root_prefill_tokens"] == 64 + 2 * 48
    assert res["B"]["root_prefill_tokens"] == 0 and res["B"]["roots_found"] == 3
    assert res["B"]["remote_onloaded_pages"] == 64 // 16 + 2 * 48 // 16
    assert res["prefill_tokens_saved_on_B"] == 160
    # A: the roots, the query and the links (documents and query after the
    # system prompt); B: the query and the links.
    assert res["prefill_tokens_total_A_B"] == [160 + 8 + 2 * 48 + 8, 8 + 2 * 48 + 8]

