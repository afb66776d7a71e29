# SPDX-License-Identifier: MIT
"""``python3 -m kvpool.chat``: a small REPL over :class:`kvpool.llm.ChunkedLLM`
(seed 000's CLI, seed 001's chunks), reading commands from stdin:

    /register system|context|query TEXT   register a chunk (prefilled now); a
                                          system becomes the current system
                                          prompt, a context is added to the
                                          current contexts, a query is the
                                          current query
    /use system ID | context ID... | query ID | none   choose chunks by id
    /chunks [TYPE]                        list chunks (seed 001's rows)
    /generate [TEXT]                      generate from the current system,
                                          contexts and query (TEXT: a new query)
    /infer [TEXT]                         run inference on the active blocks
                                          (the last generation), optionally
                                          appending TEXT (seed 000)
    /blocks                               the active blocks and their tokens
    /delete ID | /clear [TYPE] | /stats   manage chunks
    /help | /quit
    TEXT                                  (no slash) the same as /generate TEXT

Model: ``--model DIR`` (a local transformers model and its tokenizer) or
``--tiny`` (the plain-torch TinyDecoder of :mod:`kvpool.tiny` on a byte-level
tokenizer, random weights: to try the commands; kvpoold's layout must be
``layers=2,kv_heads=2,head_dim=16,dtype=fp32,page_tokens=16``). ``--socket`` (default $KVPOOL_SOCKET),
``--max-tokens``, ``--temperature`` (0: greedy), ``--seed``.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List, Optional, TextIO

HELP = __doc__.split("\n\n")[1]
# What kvpoold must serve for --tiny (kvpool.tiny's geometry); kept here so
# --help needs no torch.
TINY_LAYOUT = "layers=2,kv_heads=2,head_dim=16,dtype=fp32,page_tokens=16"


def _tiny() -> Any:
    from kvpool import tiny  # noqa: PLC0415 - torch only when asked
    _, adapter, tok = tiny.tiny_llm_parts()
    return adapter, tok


class Repl:
    """The REPL's state and commands (one ChunkedLLM)."""

    def __init__(self, llm: Any, sampling: dict, out: TextIO = sys.stdout) -> None:
        self.llm = llm
        self.sp = sampling
        self.out = out
        self.system: Optional[str] = None
        self.contexts: List[str] = []
        self.query: Optional[str] = None

    def say(self, *a: Any) -> None:
        print(*a, file=self.out, flush=True)

    def run(self, lines: Any) -> int:
        for line in lines:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                if not self.command(line):
                    return 0
            except Exception as e:  # noqa: BLE001 - a REPL reports and goes on
                self.say(f"error: {type(e).__name__}: {e}")
        return 0

    def command(self, line: str) -> bool:
        from .llm import ChunkType  # noqa: PLC0415
        if not line.startswith("/"):
            line = "/generate " + line
        cmd, _, rest = line.partition(" ")
        rest = rest.strip()
        if cmd in ("/quit", "/exit", "/q"):
            return False
        if cmd in ("/help", "/h", "/?"):
            self.say(HELP)
        elif cmd == "/register":
            kind, _, text = rest.partition(" ")
            if not text:
                raise ValueError("usage: /register system|context|query TEXT")
            ct = ChunkType.of(kind)
            cid = self.llm.register_chunk(text, ct)
            if ct is ChunkType.SYSTEM_PROMPT:
                self.system = cid
            elif ct is ChunkType.CONTEXT:
                if cid not in self.contexts:
                    self.contexts.append(cid)
            else:
                self.query = cid
            self.say(f"registered {ct.value} {cid}")
        elif cmd == "/use":
            kind, _, ids = rest.partition(" ")
            if kind == "none":
                self.system, self.contexts, self.query = None, [], None
            elif ChunkType.of(kind) is ChunkType.SYSTEM_PROMPT:
                self.system = ids.strip()
            elif ChunkType.of(kind) is ChunkType.CONTEXT:
                self.contexts = ids.split()
            else:
                self.query = ids.strip()
            self.say(f"using system {self.system} contexts {self.contexts} query {self.query}")
        elif cmd == "/chunks":
            rows = self.llm.list_chunks(rest or None)
            for r in rows:
                self.say(f"{r['chunk_id'][:16]} {r['chunk_type']:<13} {r['token_count']:>6} "
                         f"tokens  used {r['access_count']}x  {r['content_preview']!r}")
            self.say(f"{len(rows)} chunks")
        elif cmd == "/generate":
            if rest:
                self.query = self.llm.register_chunk(rest, ChunkType.QUERY)
            if self.system is None:
                raise ValueError("no system prompt: /register system TEXT first")
            if self.query is None:
                raise ValueError("no query: /generate TEXT or /register query TEXT")
            out = self.llm.generate_from_chunks(self.system, self.contexts, self.query, self.sp)
            self.say(f"assistant: {out['text']}")
            self.say(f"[{len(out['token_ids'])} tokens, {out['finish_reason']}, "
                     f"{out['cached_tokens']} cached, {out['prefilled_tokens']} prefilled]")
        elif cmd == "/infer":
            blocks, count = self.llm.get_all_active_blocks()
            new = self.llm._encode(rest) if rest else None
            text = ""
            for piece in self.llm.infer_from_blocks_stream(blocks, count, new, self.sp):
                text += piece["token"]
            res = piece["result"]
            self.say(f"assistant: {res['text']}")
            self.say(f"[{len(res['token_ids'])} tokens, {res['finish_reason']}, after "
                     f"{count} cached tokens in {len(blocks)} blocks]")
        elif cmd == "/blocks":
            blocks, count = self.llm.get_all_active_blocks()
            for b in blocks:
                self.say(f"{b.kind} {str(b.id)[:16]} start {b.start} tokens {b.tokens}")
            self.say(f"{len(blocks)} blocks, {count} tokens")
        elif cmd == "/delete":
            self.llm.delete_chunk(rest)
            self.contexts = [c for c in self.contexts if c != rest]
            self.system = None if self.system == rest else self.system
            self.query = None if self.query == rest else self.query
            self.say(f"deleted {rest}")
        elif cmd == "/clear":
            n = self.llm.clear_chunks(rest or None)
            self.system, self.contexts, self.query = None, [], None
            self.say(f"cleared {n} chunks")
        elif cmd == "/stats":
            st = self.llm.get_chunk_stats()
            self.say(json.dumps({k: v for k, v in st.items() if not k.startswith("local_")},
                                sort_keys=True))
        else:
            self.say(f"unknown command {cmd}: /help lists them")
        return True


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvpool.chat",
                                 description="A chunk REPL over kvpool (see /help).")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="a local transformers model directory")
    g.add_argument("--tiny", action="store_true",
                   help="the plain-torch test model on a byte tokenizer; kvpoold "
                   "must serve --layout=" + TINY_LAYOUT)
    ap.add_argument("--socket", default=None, help="kvpoold's socket ($KVPOOL_SOCKET)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--quiet", action="store_true", help="no banner")
    a = ap.parse_args(argv)
    from .llm import ChunkedLLM  # noqa: PLC0415
    if a.tiny:
        adapter, tok = _tiny()
        llm = ChunkedLLM(model=adapter, tokenizer=tok, socket=a.socket)
    else:
        llm = ChunkedLLM(a.model, socket=a.socket)
    sp = {"temperature": a.temperature, "max_tokens": a.max_tokens, "seed": a.seed}
    with llm:
        if not a.quiet:
            print("kvpool chat: /help for commands, /quit to leave", flush=True)
        return Repl(llm, sp).run(sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
