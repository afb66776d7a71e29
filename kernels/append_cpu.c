/* SPDX-License-Identifier: MIT */
/*
 * append_cpu.c - the CPU reference of the append data op, and its read-back.
 *
 * This is the oracle the CUDA kernels are tested against and the data path
 * of the shm backend. The caller's buffer is token-major
 * [n][layers][2][heads][dim]; a page is [layer][K|V][token][heads][dim], so
 * one token's row for one (layer, K|V) is token_stride contiguous bytes on
 * both sides and each is moved with one copy.
 *
 * Large appends stream: a plain store first reads the destination line
 * (read-for-ownership), which costs a third of the bandwidth on rows that
 * are written whole and not read back by this core. glibc's memcpy makes the
 * same choice for large copies, so without it an append of N bytes runs well
 * behind a memcpy of N bytes. Small appends keep ordinary stores: their lines
 * are likely to be read again soon (attention right after append).
 */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* Batches at least this large bypass the cache (see above). */
#define STREAM_MIN_BYTES (1u << 20)

#include "kvpool.h"

static inline uint64_t slot_offset(const struct kvp_layout *l,
				   struct kvp_slot s, uint32_t layer, uint32_t kv)
{
	return (uint64_t)s.frame * l->page_bytes + layer * l->layer_stride +
	       kv * l->kv_stride + (uint64_t)s.slot * l->token_stride;
}

#if defined(__x86_64__)
/* Copy one row with non-temporal 16-byte stores; dst and row 16-aligned. */
static inline void row_stream(unsigned char *dst, const unsigned char *src,
			      uint64_t row)
{
	__m128i *d = (__m128i *)dst;
	const __m128i *s = (const __m128i *)src;

	for (uint64_t i = 0; i < row / 16; i += 4) {
		__m128i a = _mm_loadu_si128(s + i), b = _mm_loadu_si128(s + i + 1);
		__m128i c = _mm_loadu_si128(s + i + 2), e = _mm_loadu_si128(s + i + 3);

		_mm_stream_si128(d + i, a);
		_mm_stream_si128(d + i + 1, b);
		_mm_stream_si128(d + i + 2, c);
		_mm_stream_si128(d + i + 3, e);
	}
}

static int can_stream(const struct kvp_layout *l, const void *base, uint32_t n)
{
	/* Rows of whole 64-byte multiples from a 64-byte aligned tier: every
	 * row starts 64-aligned since all strides are multiples of the row. */
	return (uint64_t)n * l->token_bytes >= STREAM_MIN_BYTES &&
	       l->token_stride % 64 == 0 && (uintptr_t)base % 64 == 0;
}
#endif

void kvp_append_cpu(const struct kvp_layout *l, void *tier_base,
		    const struct kvp_slot *slots, uint32_t n, const void *kv)
{
	const unsigned char *src = kv;
	unsigned char *base = tier_base;
	const uint64_t row = l->token_stride;

#if defined(__x86_64__)
	if (can_stream(l, tier_base, n)) {
		for (uint32_t t = 0; t < n; t++) {
			for (uint32_t layer = 0; layer < l->layers; layer++) {
				row_stream(base + slot_offset(l, slots[t], layer, 0),
					   src, row);
				row_stream(base + slot_offset(l, slots[t], layer, 1),
					   src + row, row);
				src += 2 * row;
			}
		}
		/* Streaming stores are weakly ordered: make them visible before
		 * the caller commits (a release on another core must see them). */
		_mm_sfence();
		return;
	}
#endif
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
