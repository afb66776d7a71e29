# SPDX-License-Identifier: MIT
"""kvpool.vseq (seed 000's virtual sequences) and the parts of seed 001 the
seed tests (tests/seeds) do not take apart: blocks from chunk ids, blocks
that are not one chain (linked or recomputed, exact), blocks that do not end
on page boundaries (one cascade level per segment), early-closed streams,
bad input changing nothing; ChunkedLLM.generate's standard form,
enable_deduplication=False, model_path loaders. The tiny model on CPU
against a real kvpoold; outputs checked against one full prefill."""
from __future__ import annotations

import pytest

import kvpool.loaders
from conftest import Daemon
from kvpool.llm import (Block, ChunkedLLM, ChunkNotFoundError, ChunkType,
                        register_model_loader)
from kvpool.vseq import ContextManager, VirtualSequence
from tinymodels import tiny_llm_parts

GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
SYS53 = "You are a helpful AI assistant specialized in Python."   # 53 tokens
SYS32 = "You are a helpful assistant, ok."                        # 32: two pages
DOC = "Django is a web framework; it follows the model-template-view pattern!"


@pytest.fixture(scope="module")
def kd():
    d = Daemon(device_mem="8M", host_mem="4M")
    yield d
    d.stop()


@pytest.fixture
def llm(kd):
    model, adapter, tok = tiny_llm_parts()
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=kd.sock) as m:
        m.model = model
        m.clear_chunks()
        yield m
        m.clear_chunks()


def ref(llm, *texts, n=6):
    return llm.model.greedy(list("".join(texts).encode()), n)


def frames(llm):
    return llm.client.stats()["device"]["frames_used"]


# ------------------------------------------------------------------ blocks
def test_chunk_ids_are_blocks(llm):
    s = llm.register_chunk(SYS53, ChunkType.SYSTEM_PROMPT)
    d = llm.register_chunk(DOC, ChunkType.CONTEXT)
    r = llm.infer_from_blocks([s, d], None, None, GREEDY)           # no generation first
    assert r["token_ids"] == ref(llm, SYS53, DOC)
    assert llm.counters["links_created"] == 1
    r2 = llm.infer_from_blocks([s, d], len(SYS53) + len(DOC), " more", GREEDY)
    assert r2["token_ids"] == ref(llm, SYS53, DOC, " more")
    assert llm.counters["links_created"] == 1                       # the link, cached


@pytest.mark.parametrize("system,tables", [(SYS32, 1), (SYS53, 2)])
def test_page_boundaries(llm, system, tables):
    """A block that ends mid-page ends a segment (a sequence and a cascade
    level of its own); blocks that end on page boundaries share one table."""
    s = llm.register_chunk(system, ChunkType.SYSTEM_PROMPT)
    d = llm.register_chunk(DOC, ChunkType.CONTEXT)
    blocks, count = ContextManager(llm, s, [d]).get_all_active_blocks()
    with VirtualSequence(list(b" Why?"), GREEDY, blocks, count) as seq:
        seq.allocate(llm)
        assert len(seq.block_tables) == tables == len(seq.shared_seqs)
        assert sum(n for _, n in seq.block_tables) == count
        out = llm.infer_sequence(seq)
        assert out["token_ids"] == ref(llm, system, DOC, " Why?")
    assert seq.status == "freed"


def test_generation_after_other_blocks_is_recomputed(llm):
    s = llm.register_chunk(SYS53, ChunkType.SYSTEM_PROMPT)
    d = llm.register_chunk(DOC, ChunkType.CONTEXT)
    first = llm.infer_from_blocks([s, d], None, None, GREEDY)
    gen = first["blocks"][-1]
    assert gen.kind == "seq"
    # the generation without the document before it: its tokens computed again
    r = llm.infer_from_blocks([s, gen], None, None, GREEDY)
    gen_ids = first["token_ids"]
    assert r["recomputed_tokens"] == len(gen_ids)
    assert r["token_ids"] == llm.model.greedy(list(SYS53.encode()) + gen_ids, 6)
    # and a chunk after a generation: computed as new tokens too
    r2 = llm.infer_from_blocks(r["blocks"] + [d], None, None, GREEDY)
    want = list(SYS53.encode()) + gen_ids + r["token_ids"] + list(DOC.encode())
    assert r2["token_ids"] == llm.model.greedy(want, 6)


def test_bad_input_changes_nothing(llm):
    s = llm.register_chunk(SYS53, ChunkType.SYSTEM_PROMPT)
    d = llm.register_chunk(DOC, ChunkType.CONTEXT)
    f0 = frames(llm)
    holders = llm.client.chunk_get(s)["holders"]
    with pytest.raises(ValueError, match="existing_token_count 5: the blocks hold"):
        llm.infer_from_blocks([s, d], 5, None, GREEDY)
    with pytest.raises(TypeError, match="frame numbers are not blocks"):
        VirtualSequence([1], GREEDY, [3, 4], 32)
    with pytest.raises(ChunkNotFoundError):
        llm.infer_from_blocks([s, "ab" * 32], None, None, GREEDY)
    with pytest.raises(ChunkNotFoundError):
        llm.infer_from_blocks([Block("seq", 12345, 0, 3)], 3, None, GREEDY)
    with pytest.raises(ValueError, match="no blocks and no new tokens"):
        llm.infer_from_blocks([], 0, None, GREEDY)
    assert llm.counters["links_created"] == 0 and frames(llm) == f0
    assert llm.client.chunk_get(s)["holders"] == holders
    seq = VirtualSequence(None, GREEDY, [s]).allocate(llm)
    with pytest.raises(ValueError, match="allocate a sequence once"):
        seq.allocate(llm)
    seq.deallocate()
    assert llm.client.chunk_get(s)["holders"] == holders and frames(llm) == f0


def test_a_stream_closed_early_keeps_nothing(llm):
    s = llm.register_chunk(SYS53, ChunkType.SYSTEM_PROMPT)
    f0 = frames(llm)
    holders = llm.client.chunk_get(s)["holders"]
    it = llm.infer_from_blocks_stream([s], None, " and", dict(GREEDY, max_tokens=40))
    next(it)
    next(it)
    it.close()
    assert frames(llm) == f0 and llm.client.chunk_get(s)["holders"] == holders
    # the seed's `infer_from_blocks_stream(...)`: the active blocks (none here)
    with pytest.raises(ValueError):
        list(llm.infer_from_blocks_stream(...))


# ------------------------------------------------------------------ generate
def test_generate_standard_form(llm):
    p = "System: You are helpful.\nUser: Hello"
    a = llm.generate(prompt=p, sampling_params=GREEDY)
    assert a["token_ids"] == ref(llm, p)
    assert llm.list_chunks() == []                                 # nothing registered
    assert llm.generate(p, GREEDY)["token_ids"] == a["token_ids"]   # positional
    assert llm.generate(p, sampling_params=GREEDY)["token_ids"] == a["token_ids"]
    many = llm.generate([p, "Hi"], GREEDY)                          # nano-vllm's batch
    assert [o["token_ids"] for o in many] == [a["token_ids"], ref(llm, "Hi")]
    two = llm.generate([p, "Hi"], [GREEDY, dict(GREEDY, max_tokens=2)])
    assert [len(o["token_ids"]) for o in two] == [6, 2]
    assert len(llm.generate(prompt=list(p.encode()), sampling_params={...})["token_ids"]) \
        <= 64
    assert llm.list_chunks() == []
    with pytest.raises(ValueError, match="give one of them"):
        llm.generate(prompt=p, system_prompt=p)
    with pytest.raises(TypeError, match="sampling_params"):
        llm.generate(prompt=p, sampling_params="greedy")
    # the chunk form, positional, as before
    out = llm.generate(SYS53, [DOC], "Why?", GREEDY)
    assert out["token_ids"] == ref(llm, SYS53, DOC, "Why?")
    assert len(llm.list_chunks()) == 3


# ------------------------------------------------------------------ dedup off
def test_deduplication_off(kd, llm):
    model, adapter, tok = tiny_llm_parts()
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=kd.sock,
                    enable_deduplication=False) as nd:
        a = nd.register_chunk(SYS53, ChunkType.SYSTEM_PROMPT)
        b = nd.register_chunk(SYS53, ChunkType.SYSTEM_PROMPT)
        plain = llm.register_chunk(SYS53, ChunkType.SYSTEM_PROMPT)   # deduplicated
        assert len({a, b, plain}) == 3
        assert llm.counters["roots_created"] == 1                   # not a hit on a copy
        assert [r["access_count"] for r in nd.list_chunks() if r["chunk_id"] in (a, b)] \
            == [0, 0]                                               # no hit on a copy
        ga, gb = nd.get_chunk(a), nd.get_chunk(b)
        assert ga["root"] != gb["root"] and ga["pages"] == gb["pages"] == 4
        assert ga["content"] == gb["content"] == SYS53
        assert not llm.get_chunk(plain)["copy"]
        q = nd.register_chunk("Why?", ChunkType.QUERY)
        outs = [nd.generate_from_chunks(x, [], q, GREEDY)["token_ids"] for x in (a, b)]
        assert outs[0] == outs[1] == ref(llm, SYS53, "Why?")
        assert nd.counters["links_created"] == 2                    # a link under each
        # another process (this other ChunkedLLM, deduplicating) uses a copy as is
        assert llm.generate_from_chunks(a, [], q, GREEDY)["token_ids"] == outs[0]
        # a one-token chunk has room for 255 copies; they all differ
        ones = {nd.register_chunk("x", ChunkType.CONTEXT) for _ in range(5)}
        assert len(ones) == 5
        nd.delete_chunk(a)
        assert nd.get_chunk(b)["content"] == SYS53


def test_deduplication_off_nonce_collision(kd, llm, monkeypatch):
    """A one-token chunk's copies differ by one byte of the ids: a nonce
    that another copy's ids have is a hit on that copy, which must change
    nothing of it (no metadata merged); another nonce is tried."""
    import kvpool.chunk_copy as cc
    model, adapter, tok = tiny_llm_parts()
    firsts = iter([7, 7, 9])                      # the second registration collides once
    monkeypatch.setattr(cc.random, "randrange", lambda a, b: next(firsts))
    with ChunkedLLM(model=adapter, tokenizer=tok, socket=kd.sock,
                    enable_deduplication=False) as nd:
        x = nd.register_chunk("y", ChunkType.CONTEXT, {"who": "first"})
        y = nd.register_chunk("y", ChunkType.CONTEXT, {"who": "second"})
        assert x != y and nd.counters["roots_created"] == 2
        assert nd.get_chunk(x)["metadata"] == {"who": "first"}
        assert nd.get_chunk(y)["metadata"] == {"who": "second"}
        assert nd.get_chunk(x)["token_ids"] == nd.get_chunk(y)["token_ids"] == [ord("y")]
        assert list(firsts) == []                 # three nonces drawn: one collided
        with pytest.raises(ValueError, match="bits 24-31"):
            nd.register_chunk([1 << 24], ChunkType.CONTEXT)


# ------------------------------------------------------------------ loaders
def test_model_path_loaders(kd, tmp_path):
    model, adapter, tok = tiny_llm_parts()
    seen = []

    def mine(path):
        seen.append(path)
        return (adapter, tok) if path.endswith("mine") else None

    (tmp_path / "mine").mkdir()
    (tmp_path / "other").mkdir()
    with ChunkedLLM(model_path=str(tmp_path / "mine"), loader=mine, socket=kd.sock) as m:
        assert m.adapter is adapter and m.tokenizer is tok
    with pytest.raises(ValueError, match="returned nothing"):
        ChunkedLLM(model_path=str(tmp_path / "other"), loader=mine, socket=kd.sock)
    with pytest.raises(ValueError, match="not a local directory"):
        ChunkedLLM(model_path=str(tmp_path / "missing"), socket=kd.sock)
    register_model_loader(mine)
    try:
        with ChunkedLLM(model_path=str(tmp_path / "mine"), socket=kd.sock) as m:
            assert m.adapter is adapter
        try:
            import transformers  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError, match="register_model_loader"):
                ChunkedLLM(model_path=str(tmp_path / "other"), socket=kd.sock)
        else:
            # Where transformers is installed (the GPU machine) the
            # registered loader is asked first, then transformers, which
            # finds no model in an empty directory.
            with pytest.raises(Exception):  # noqa: B017 - transformers' own error
                ChunkedLLM(model_path=str(tmp_path / "other"), socket=kd.sock)
    finally:
        kvpool.loaders.unregister_model_loader(mine)
    assert seen[-1].endswith("other")
