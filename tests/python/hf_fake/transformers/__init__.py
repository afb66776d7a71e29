# SPDX-License-Identifier: MIT
"""A stand-in for HuggingFace transformers 5 where it is not installed (CI:
Debian's python3-torch, no transformers): the cache protocol of
transformers.cache_utils and a small Llama-shaped model with generate(),
enough for kvpool.hf's CPU tests and a dry run of tools/hf_proof.py. Written
from the protocol (Cache.update(k, v, layer_idx), get_seq_length(),
get_mask_sizes(query_length, layer_idx), layers' keys/values), not from
transformers' code. Put tests/python/hf_fake on sys.path first to use it."""
from . import cache_utils
from .cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer
from .modeling import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

__version__ = "5.0.0+fake"
FAKE = True

__all__ = ["cache_utils", "Cache", "CacheLayerMixin", "DynamicCache", "DynamicLayer",
           "LlamaConfig", "LlamaForCausalLM", "LogitsProcessorList"]
