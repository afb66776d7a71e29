/* SPDX-License-Identifier: MIT */
/*
 * append_cpu.c - the CPU reference of the append data op, and its read-back.
 *
 * This is the oracle the CUDA kernels are tested against and the data path
 * of the shm backend. The caller's buffer is token-major
 * [n][layers][2][heads][dim]; a page is [layer][K|V][token][heads][dim], so
 * one token's row for one (layer, K|V) is token_stride contiguous bytes on
 * both sides and each is moved with one memcpy.
 */
#include <string.h>

#include "kvpool.h"

static inline uint64_t slot_offset(const struct kvp_layout *l,
				   struct kvp_slot s, uint32_t layer, uint32_t kv)
{
	return (uint64_t)s.frame * l->page_bytes + layer * l->layer_stride +
	       kv * l->kv_stride + (uint64_t)s.slot * l->token_stride;
}

void kvp_append_cpu(const struct kvp_layout *l, void *tier_base,
		    const struct kvp_slot *slots, uint32_t n, const void *kv)
{
	const unsigned char *src = kv;
	unsigned char *base = tier_base;
	const uint64_t row = l->token_stride;

	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t layer = 0; layer < l->layers; layer++) {
			memcpy(base + slot_offset(l, slots[t], layer, 0), src, row);
			memcpy(base + slot_offset(l, slots[t], layer, 1), src + row, row);
			src += 2 * row;
		}
	}
}

void kvp_read_cpu(const struct kvp_layout *l, const void *tier_base,
		  const struct kvp_slot *slots, uint32_t n, void *out)
{
	unsigned char *dst = out;
	const unsigned char *base = tier_base;
	const uint64_t row = l->token_stride;

	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t layer = 0; layer < l->layers; layer++) {
			memcpy(dst, base + slot_offset(l, slots[t], layer, 0), row);
			memcpy(dst + row, base + slot_offset(l, slots[t], layer, 1), row);
			dst += 2 * row;
		}
	}
}
