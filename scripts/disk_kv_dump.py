#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""disk_kv_dump: real K/V pages for `kvbench disk --data FILE`.

Runs a model over a token sequence, keeps the K and V every layer makes
(after RoPE, as a KV cache holds them) and writes them as kvpool pages of a
layout, page-major [layer][K|V][token][head][dim], one page after another,
so that `kvbench disk` measures zstd's ratio and the tier's speed on KV a
model made rather than on a synthetic stand-in. Prints the kvbench command.

  --model tiny        the CPU test model (examples/python/tinymodels.py:
                      2 layers, 2 KV heads, head_dim 16; no download)
  --model hf:NAME     a transformers causal LM already in the local cache
                      (no download is attempted: HF_HUB_OFFLINE=1)
  --model config:llama3-8b
                      LlamaForCausalLM built from Llama-3-8B's config with
                      seeded random bf16 weights (no download; on the GPU
                      when there is one): the geometry and the RoPE of a
                      real model's cache, though not trained weights' values

    /usr/bin/python3 scripts/disk_kv_dump.py --model tiny --tokens 8192 \\
        --out /var/tmp/kv-tiny.pages
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent


def tiny_kv(tokens: int, seed: int):
    """Per layer (K, V) of shape [tokens, kv_heads, head_dim] from TinyDecoder."""
    import torch
    sys.path.insert(0, str(ROOT / "examples" / "python"))
    from tinymodels import HEAD_DIM, KV_HEADS, LAYERS, TinyDecoder  # noqa: PLC0415

    torch.manual_seed(seed)
    model = TinyDecoder(seed=seed).eval()
    ids = torch.randint(0, model.head.out_features, (tokens,))
    kv: List[Tuple] = [None] * LAYERS

    def on_kv(layer, k, v):
        kv[layer] = (k.detach().clone(), v.detach().clone())

    with torch.no_grad():
        model(ids, 0, None, on_kv)
    return kv, (LAYERS, KV_HEADS, HEAD_DIM)


def hf_kv(name: str, tokens: int, seed: int):
    """Per layer (K, V) [tokens, kv_heads, head_dim] from a cached HF model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float32).eval()
    torch.manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with torch.no_grad():
        out = model(ids, use_cache=True)
    past = out.past_key_values
    layers = [(past[i][0][0].transpose(0, 1), past[i][1][0].transpose(0, 1))
              for i in range(len(past))]
    _, heads, dim = layers[0][0].shape
    return layers, (len(layers), heads, dim)


def config_kv(name: str, tokens: int, seed: int):
    """Per layer (K, V) [tokens, kv_heads, head_dim] from a model built from a
    known config with random weights (the machine has no weights to load)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    if name != "llama3-8b":
        sys.exit(f"disk_kv_dump: --model config:{name}: the known config is llama3-8b")
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=max(8192, tokens), rope_theta=500000.0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)  # built in place: no fp32 copy on the host
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), device=dev)
    with torch.no_grad():
        past = model(ids, use_cache=True).past_key_values
    layers = []
    for i in range(cfg.num_hidden_layers):
        k, v = (past.layers[i].keys, past.layers[i].values) if hasattr(past, "layers") \
            else past[i]
        layers.append((k[0].transpose(0, 1).float().cpu(), v[0].transpose(0, 1).float().cpu()))
    _, heads, dim = layers[0][0].shape
    return layers, (len(layers), heads, dim)


def write_pages(kv, geom, page_tokens: int, dtype: str, out: Path) -> int:
    """kvpool pages of kv into out; returns how many."""
    import torch
    layers, heads, dim = geom
    tokens = kv[0][0].shape[0]
    pages = tokens // page_tokens
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    with open(out, "wb") as f:
        for p in range(pages):
            sl = slice(p * page_tokens, (p + 1) * page_tokens)
            parts = []
            for k, v in kv:  # [layer][K|V][token][head][dim]
                parts.append(k[sl].to(tdt).contiguous())
                parts.append(v[sl].to(tdt).contiguous())
            page = torch.stack(parts)
            f.write(page.view(torch.uint8).numpy().tobytes() if tdt != torch.bfloat16
                    else page.view(torch.int16).numpy().tobytes())
    return pages


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny, hf:NAME or config:llama3-8b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="file of pages to write")
    args = ap.parse_args()

    if args.model == "tiny":
        kv, geom = tiny_kv(args.tokens, args.seed)
    elif args.model.startswith("hf:"):
        try:
            kv, geom = hf_kv(args.model[3:], args.tokens, args.seed)
        except (ImportError, OSError) as e:
            sys.exit(f"disk_kv_dump: {args.model}: {e}; install transformers and "
                     "put the model in the local Hugging Face cache, or use --model tiny")
    elif args.model.startswith("config:"):
        try:
            kv, geom = config_kv(args.model[7:], args.tokens, args.seed)
        except ImportError as e:
            sys.exit(f"disk_kv_dump: {args.model}: {e}; install transformers")
    else:
        sys.exit(f"disk_kv_dump: --model {args.model}: use tiny, hf:NAME or config:llama3-8b")
    pages = write_pages(kv, geom, args.page_tokens, args.dtype, Path(args.out))
    if not pages:
        sys.exit(f"disk_kv_dump: {args.tokens} tokens make no page of "
                 f"{args.page_tokens}; raise --tokens")
    layers, heads, dim = geom
    layout = (f"layers={layers},kv_heads={heads},head_dim={dim},"
              f"dtype={args.dtype},page_tokens={args.page_tokens}")
    size = os.path.getsize(args.out)
    print(f"{pages} pages of {size // pages} bytes ({layout}) in {args.out}")
    print(f"kvbench disk --layout {layout} --data {args.out} --size {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
