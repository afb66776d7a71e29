# SPDX-License-Identifier: MIT
"""RAG over kvpool chunks in two processes (seed 001's "RAG System" example):

    python3 chunked_rag.py              # runs both roles, one process each
    python3 chunked_rag.py register     # the indexer: system prompt + documents
    python3 chunked_rag.py answer "What is Django?"   # the answerer

The indexer registers a system prompt and every document as chunks (each is
prefilled when registered: its KV is in kvpoold, tagged with metadata) and
exits. The answerer, another process, finds the documents with
``list_chunks(metadata_filter=...)``, picks the relevant ones (a keyword
overlap stands in for a search engine), registers the question and calls
``generate_from_chunks``: the system prompt's KV is the indexer's, each
document's KV after it is computed once (by whichever process asks first)
and only the question is new. Only seed 001's calls are used.

Model: ``--tiny`` (default: the plain-torch TinyDecoder on a byte
tokenizer; kvpoold's layout must be layers=2,kv_heads=2,head_dim=16,fp32)
or ``--model DIR`` (a local transformers model). ``--check`` (tiny only):
the answer must equal greedy generation from one full prefill of the same
prompt (system + the chosen documents + question, concatenated).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SYSTEM = "You answer questions using only the documents given before the question."
DOCUMENTS = [
    {"url": "docs/python", "title": "Python",
     "content": "Python is a high-level programming language. Its decorators wrap "
                "functions; generators yield values lazily."},
    {"url": "docs/django", "title": "Django",
     "content": "Django is a Python web framework. It follows the model-template-view "
                "pattern and ships an ORM and an admin site."},
    {"url": "docs/kvpool", "title": "kvpool",
     "content": "kvpool is a KV-cache daemon: inference processes share attention keys "
                "and values through pages of one pool."},
]
SP = {"temperature": 0, "max_tokens": 24, "ignore_eos": True}


def make_llm(args: argparse.Namespace) -> Tuple[Any, Any]:
    from kvpool.llm import ChunkedLLM
    if args.model:
        return ChunkedLLM(args.model), None
    from tinymodels import tiny_llm_parts
    model, adapter, tok = tiny_llm_parts()
    return ChunkedLLM(model=adapter, tokenizer=tok), model


def register(args: argparse.Namespace) -> None:
    from kvpool.llm import ChunkType
    llm, _ = make_llm(args)
    with llm:
        sid = llm.register_chunk(SYSTEM, ChunkType.SYSTEM_PROMPT,
                                 metadata={"name": "rag_system", "app": "rag"})
        ids = [llm.register_chunk(d["content"], ChunkType.CONTEXT,
                                  metadata={"source": d["url"], "title": d["title"],
                                            "app": "rag"})
               for d in DOCUMENTS]
        print(json.dumps({"system": sid, "documents": ids}))


def _words(s: str) -> set:
    return {w for w in re.findall(r"[a-z]+", s.lower()) if len(w) > 3}


def answer(args: argparse.Namespace) -> None:
    from kvpool.llm import ChunkType
    llm, model = make_llm(args)
    with llm:
        system = llm.list_chunks(ChunkType.SYSTEM_PROMPT, {"name": "rag_system"})
        if not system:
            sys.exit("no rag_system chunk: run 'chunked_rag.py register' first")
        docs = llm.list_chunks(ChunkType.CONTEXT, {"app": "rag"})
        q = _words(args.question)
        scored = []
        for d in docs:
            full = llm.get_chunk(d["chunk_id"])
            overlap = len(q & _words(full["content"]))
            if overlap:
                scored.append((-overlap, d["metadata"]["source"], full))
        relevant = [f for _, _, f in sorted(scored, key=lambda x: x[:2])][:2]
        qid = llm.register_chunk(args.question, ChunkType.QUERY)
        out = llm.generate_from_chunks(system_chunk_id=system[0]["chunk_id"],
                                       context_chunk_ids=[d["chunk_id"] for d in relevant],
                                       query_chunk_id=qid, sampling_params=SP)
        res: Dict[str, Any] = {"question": args.question,
                               "sources": [d["metadata"]["source"] for d in relevant],
                               "text": out["text"], "token_ids": out["token_ids"],
                               "cached_tokens": out["cached_tokens"],
                               "prefilled_tokens": out["prefilled_tokens"]}
        if args.check:
            if model is None:
                sys.exit("--check needs --tiny")
            tok = llm.tokenizer
            prompt: List[int] = tok.encode(SYSTEM)
            for d in relevant:
                prompt += tok.encode(d["content"])
            prompt += tok.encode(args.question)
            ref = model.greedy(prompt, SP["max_tokens"])
            res["identical"] = ref == out["token_ids"]
            if not res["identical"]:
                print(json.dumps(res))
                sys.exit(f"answer differs from a full prefill: {out['token_ids']} vs {ref}")
        print(json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", nargs="?", choices=["register", "answer", "both"], default="both")
    ap.add_argument("question", nargs="?", default="What is Django and its pattern?")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tiny", action="store_true", default=True)
    g.add_argument("--model", default=None)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.role == "register":
        return register(args)
    if args.role == "answer":
        return answer(args)
    extra = (["--model", args.model] if args.model else []) + (["--check"] if args.check
                                                               else [])
    for role, more in (("register", []), ("answer", [args.question])):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), role, *more, *extra],
                           capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        if r.returncode:
            sys.stdout.write(r.stdout)
            sys.exit(f"{role} exited {r.returncode}")
        print(f"[{role} process {r.stdout.strip()}]")


if __name__ == "__main__":
    main()
