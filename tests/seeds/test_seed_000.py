# SPDX-License-Identifier: MIT
"""Seed 000 (shared/seeds/000_333e2e6d596c5a42.txt, direct KV cache
inference) as the acceptance test: every code block of the seed, copied as
the seed writes it, runs against a real kvpoold.

Replaced, and nothing else: the model and the tokenizer (``llm`` is a
ChunkedLLM over kvpool.tiny's TinyDecoder, ``tokenizer`` the byte
tokenizer). Names the seed uses without making them are given values by the
test: ``context_mgr`` (a kvpool.vseq.ContextManager over a registered
system prompt and document -- no generation first), ``params``,
``new_tokens``, ``block_list`` / ``count`` and ``blocks`` / ``token_count``
(from the context manager). The greedy outputs are checked against one full
prefill of the same tokens (TinyDecoder.greedy).
"""
from __future__ import annotations

import pytest

from conftest import run_seed

VSEQ = '''
from nanovllm.engine.virtual_sequence import VirtualSequence

seq = VirtualSequence(
    token_ids=new_tokens,           # Only new tokens to process
    sampling_params=params,
    existing_blocks=block_list,     # Blocks already in KV cache
    existing_token_count=count      # Total tokens in existing blocks
)
'''

DIRECT = '''
# Non-streaming
result = llm.infer_from_blocks(
    existing_blocks=blocks,
    existing_token_count=token_count,
    new_tokens=new_tokens,          # Optional new tokens
    sampling_params=params
)

# Streaming
for token_data in llm.infer_from_blocks_stream(...):
    print(token_data["token"], end="")
'''

CONTEXT = '''
# Get conversation blocks
blocks, count = context_mgr.get_conversation_blocks()

# Get all active blocks  
blocks, count = context_mgr.get_all_active_blocks()
'''

EXAMPLE1 = '''
# Get existing conversation
blocks, token_count = context_mgr.get_conversation_blocks()

# Continue generation
result = llm.infer_from_blocks(
    existing_blocks=blocks,
    existing_token_count=token_count
)
'''

EXAMPLE2 = '''
# Tokenize new input (without chat template)
new_tokens = tokenizer.encode("Continue this thought: ")

# Run inference with context + new tokens
result = llm.infer_from_blocks(
    existing_blocks=blocks,
    existing_token_count=token_count,
    new_tokens=new_tokens
)
'''

EXAMPLE3 = '''
# Build prompt manually
prompt_parts = [
    "<|im_start|>system\\nYou are helpful.\\n<|im_end|>\\n",
    "<|im_start|>user\\nHello!\\n<|im_end|>\\n", 
    "<|im_start|>assistant\\n"
]

# Tokenize each part
tokens = []
for part in prompt_parts:
    tokens.extend(tokenizer.encode(part, add_special_tokens=False))

# Run inference
result = llm.infer_from_blocks(
    existing_blocks=[],
    existing_token_count=0,
    new_tokens=tokens
)
'''

SYSTEM = "You are a helpful AI assistant specialized in Python."     # 53 tokens
DOC = "Decorators wrap a function: @decorator before def applies it."
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture
def ns(kd):
    from kvpool.llm import ChunkedLLM
    from kvpool.tiny import tiny_llm_parts
    from kvpool.vseq import ContextManager
    model, adapter, tok = tiny_llm_parts()                     # the model and tokenizer
    llm = ChunkedLLM(model=adapter, tokenizer=tok)
    llm.clear_chunks()
    sys_id = llm.register_chunk(SYSTEM, "system_prompt")
    doc_id = llm.register_chunk(DOC, "context")
    context_mgr = ContextManager(llm, system_chunk_id=sys_id, context_chunk_ids=[doc_id])
    blocks, count = context_mgr.get_all_active_blocks()
    d = dict(llm=llm, tokenizer=tok, model=model, context_mgr=context_mgr,
             sys_id=sys_id, doc_id=doc_id, params=dict(GREEDY),
             new_tokens=tok.encode(" And then?"), blocks=blocks, token_count=count,
             block_list=blocks, count=count, prompt=tok.encode(SYSTEM + DOC))
    yield d
    llm.clear_chunks()
    llm.close()


def frames(llm) -> int:
    return llm.client.stats()["device"]["frames_used"]


def holders(llm, cid) -> int:
    return llm.client.chunk_get(cid)["holders"]


def test_virtual_sequence_refcounts_and_allocates_only_new_tokens(ns):
    llm = ns["llm"]
    run_seed(VSEQ, ns)
    seq = ns["seq"]
    assert seq.status == "waiting" and seq.token_ids == ns["new_tokens"]
    h0 = (holders(llm, ns["sys_id"]), holders(llm, ns["doc_id"]))
    f0 = frames(llm)
    seq.allocate(llm)
    # existing blocks: a reference each, no frame allocated, read where they are
    assert (holders(llm, ns["sys_id"]), holders(llm, ns["doc_id"])) == (h0[0] + 1, h0[1] + 1)
    assert frames(llm) == f0
    assert seq.num_cached_tokens == ns["count"] == len(ns["prompt"])
    out = llm.infer_sequence(seq)
    full = ns["prompt"] + ns["new_tokens"]
    assert out["token_ids"] == ns["model"].greedy(full, 8)
    assert out["cached_tokens"] == ns["count"] and out["prefilled_tokens"] == len(
        ns["new_tokens"])
    # pages only for the new tokens and those generated after them
    P = llm.page_tokens
    assert 0 < frames(llm) - f0 <= -(-(len(ns["new_tokens"]) + 8 - 1) // P)
    assert seq.status == "finished" and seq.completion_token_ids == out["token_ids"]
    # its own sequence is the active generation: the conversation continues
    blocks, n = ns["context_mgr"].get_conversation_blocks()
    assert blocks[-1].kind == "seq" and blocks[-1].id == seq.own_seq
    seq.deallocate()
    assert frames(llm) == f0
    assert (holders(llm, ns["sys_id"]), holders(llm, ns["doc_id"])) == h0
    assert llm.get_all_active_blocks() == ([], 0)


def test_references_keep_deleted_chunks_pages(ns):
    """"Reference counting prevents premature deallocation": a chunk deleted
    while a virtual sequence holds it keeps its pages until deallocate."""
    llm = ns["llm"]
    run_seed(VSEQ, ns)
    seq = ns["seq"].allocate(llm)
    f0 = frames(llm)
    root = llm.client.chunk_get(ns["doc_id"])["root"]
    root_pages = llm.client.chunk_entry(root)["pages"]
    link = seq.blocks[1]
    assert link.kind == "entry" and link.id != root   # the document after the system
    llm.delete_chunk(ns["doc_id"])
    # the document's own root (position 0) goes; its link, held, keeps its pages
    assert frames(llm) == f0 - root_pages
    with pytest.raises(Exception):
        llm.client.chunk_entry(link.id)               # deleted for everyone else
    out = llm.infer_sequence(seq)
    assert out["token_ids"] == ns["model"].greedy(ns["prompt"] + ns["new_tokens"], 8)
    seq.deallocate()
    assert frames(llm) < f0                       # now they are


def test_direct_inference_api(ns, capsys):
    llm = ns["llm"]
    run_seed(DIRECT, ns)
    full = ns["prompt"] + ns["new_tokens"]
    res = ns["result"]["token_ids"]
    assert res == ns["model"].greedy(full, 8)
    # infer_from_blocks_stream(...): continues the active blocks -- the
    # generation above -- with the default sampling (temperature 1)
    printed = capsys.readouterr().out
    last = ns["token_data"]["result"]
    assert printed == last["text"] and 1 <= len(last["token_ids"]) <= 64
    assert last["prompt_tokens"] == len(full) + len(res)
    # the same with greedy sampling, streamed: the exact continuation
    pieces = list(llm.infer_from_blocks_stream(ns["result"]["blocks"], None, None, GREEDY))
    assert [p["token_id"] for p in pieces] == ns["model"].greedy(full + res, 8)


def test_context_manager_integration(ns):
    run_seed(CONTEXT, ns)
    blocks, count = ns["blocks"], ns["count"]
    assert [b.kind for b in blocks] == ["entry", "entry"] and count == len(ns["prompt"])
    ns["llm"].infer_from_blocks(blocks, count, None, GREEDY)
    conv, n = ns["context_mgr"].get_conversation_blocks()
    assert [b.kind for b in conv] == ["entry", "entry", "seq"] and n == count + 7


def test_usage_examples(ns):
    llm, model = ns["llm"], ns["model"]
    run_seed(EXAMPLE1, ns)
    r1 = ns["result"]
    assert r1["prompt_tokens"] == len(ns["prompt"]) and 1 <= len(r1["token_ids"]) <= 64
    run_seed(EXAMPLE2, ns)
    r2 = ns["result"]
    assert r2["prompt_tokens"] == len(ns["prompt"]) + len(b"Continue this thought: ")
    run_seed(EXAMPLE3, ns)
    r3 = ns["result"]
    assert r3["prompt_tokens"] == len(ns["tokens"]) == len(
        "<|im_start|>system\nYou are helpful.\n<|im_end|>\n<|im_start|>user\nHello!\n"
        "<|im_end|>\n<|im_start|>assistant\n".encode())
    # the same examples, greedy: exact against one full prefill
    ns["params"] = GREEDY
    for code, prompt in ((EXAMPLE1, ns["prompt"]),
                         (EXAMPLE2, ns["prompt"] + list(b"Continue this thought: ")),
                         (EXAMPLE3, None)):
        code = code.replace("existing_token_count=token_count\n)",
                            "existing_token_count=token_count, sampling_params=params\n)")
        code = code.replace("new_tokens=new_tokens\n)",
                            "new_tokens=new_tokens, sampling_params=params\n)")
        code = code.replace("new_tokens=tokens\n)", "new_tokens=tokens, sampling_params=params\n)")
        assert "sampling_params=params" in code
        run_seed(code, ns)
        want = model.greedy(prompt if prompt is not None else ns["tokens"], 8)
        assert ns["result"]["token_ids"] == want
    del llm
