# SPDX-License-Identifier: MIT
"""The cache protocol of transformers 5 (see the package's doc)."""
from __future__ import annotations

from typing import Any, Optional

import torch


class CacheLayerMixin:
    is_compileable = False

    def __init__(self, **kwargs: Any) -> None:
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None
        self.is_initialized = False


class DynamicLayer(CacheLayerMixin):
    """Grows by concatenation, [batch, kv_heads, tokens, head_dim]."""

    is_sliding = False

    def lazy_initialization(self, key_states, value_states=None):
        self.dtype, self.device = key_states.dtype, key_states.device
        B, H, _, D = key_states.shape
        self.keys = key_states.new_zeros((B, H, 0, D))
        self.values = self.keys.clone()
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values

    def get_seq_length(self):
        return 0 if self.keys is None else self.keys.shape[-2]

    def get_mask_sizes(self, query_length):
        return self.get_seq_length() + query_length, 0


class Cache:
    def __init__(self, layers=None, layer_class_to_replicate=None, offloading=False,
                 offload_only_non_sliding=True):
        if (layers is None) == (layer_class_to_replicate is None):
            raise ValueError("exactly one of layers and layer_class_to_replicate")
        self.layers = layers if layers is not None else []
        self.layer_class_to_replicate = layer_class_to_replicate
        self.offloading = offloading

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.layer_class_to_replicate is not None:
            while len(self.layers) <= layer_idx:
                self.layers.append(self.layer_class_to_replicate())
        return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)

    def get_seq_length(self, layer_idx=0):
        return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

    def get_mask_sizes(self, query_length, layer_idx):
        if layer_idx >= len(self.layers):
            return query_length, 0
        return self.layers[layer_idx].get_mask_sizes(query_length)

    @property
    def is_sliding(self):
        return [getattr(layer, "is_sliding", False) for layer in self.layers]

    def __len__(self):
        return len(self.layers)


class DynamicCache(Cache):
    def __init__(self, config=None, **kwargs):
        super().__init__(layer_class_to_replicate=DynamicLayer)
