/* SPDX-License-Identifier: MIT */
/*
 * append_cpu.c - the CPU reference of the append data op, and its read-back;
 * the per-layer append, gather and scatter (kvp_kernels.h) likewise.
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
#include <immintrin.h>
#endif

/* Batches at least this large bypass the cache (see above). */
#define STREAM_MIN_BYTES (1u << 20)

#include "kvp_kernels.h"
#include "kvpool.h"

static inline uint64_t slot_offset(const struct kvp_layout *l,
				   struct kvp_slot s, uint32_t layer, uint32_t kv)
{
	return (uint64_t)s.frame * l->page_bytes + layer * l->layer_stride +
	       kv * l->kv_stride + (uint64_t)s.slot * l->token_stride;
}

#if defined(__x86_64__)
/*
 * Copy one row with non-temporal stores, as wide as the CPU has: dst and row
 * are 64-byte aligned (can_stream). Measured on the HSTU geometry, 16-byte
 * stores reach ~0.8 of glibc's streaming memcpy, 64-byte ones ~0.94
 * (bench/results/engine-*.md).
 */
__attribute__((target("avx512f")))
static void row_stream64(unsigned char *dst, const unsigned char *src, uint64_t row)
{
	for (uint64_t i = 0; i < row; i += 64)
		_mm512_stream_si512((void *)(dst + i),
				    _mm512_loadu_si512((const void *)(src + i)));
}

__attribute__((target("avx2")))
static void row_stream32(unsigned char *dst, const unsigned char *src, uint64_t row)
{
	for (uint64_t i = 0; i < row; i += 64) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));

		_mm256_stream_si256((__m256i *)(dst + i), a);
		_mm256_stream_si256((__m256i *)(dst + i + 32), b);
	}
}

static void row_stream16(unsigned char *dst, const unsigned char *src, uint64_t row)
{
	for (uint64_t i = 0; i < row; i += 64)
		for (int j = 0; j < 64; j += 16)
			_mm_stream_si128((__m128i *)(dst + i + j),
					 _mm_loadu_si128((const __m128i *)(src + i + j)));
}

typedef void (*row_copy_fn)(unsigned char *, const unsigned char *, uint64_t);

static row_copy_fn pick_row_stream(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		return row_stream64;
	if (__builtin_cpu_supports("avx2"))
		return row_stream32;
	return row_stream16;
}

static int can_stream(const struct kvp_layout *l, const void *base, uint32_t n)
{
	/* Rows of whole 64-byte multiples from a 64-byte aligned tier: every
	 * row starts 64-aligned since all strides are multiples of the row. */
	return (uint64_t)n * l->token_bytes >= STREAM_MIN_BYTES &&
	       l->token_stride % 64 == 0 && (uintptr_t)base % 64 == 0;
}

/* Tokens from slots[0] on that go to consecutive slots of one frame. */
static uint32_t slot_run(const struct kvp_slot *slots, uint32_t n)
{
	uint32_t k = 1;

	while (k < n && slots[k].frame == slots[0].frame &&
	       slots[k].slot == slots[0].slot + k)
		k++;
	return k;
}

/*
 * Destination order: a run of tokens bound for consecutive slots of one
 * frame is contiguous in each (layer, K|V) block of the page, so each block
 * is written front to back while the source rows are read at a fixed stride.
 */
static void append_stream(const struct kvp_layout *l, unsigned char *base,
			  const struct kvp_slot *slots, uint32_t n,
			  const unsigned char *src)
{
	static row_copy_fn row_stream;
	const uint64_t row = l->token_stride;

	if (!row_stream)
		row_stream = pick_row_stream(); /* idempotent: a race is harmless */
	for (uint32_t t = 0, k; t < n; t += k) {
		k = slot_run(slots + t, n - t);
		for (uint32_t layer = 0; layer < l->layers; layer++) {
			for (uint32_t kv = 0; kv < 2; kv++) {
				unsigned char *d = base + slot_offset(l, slots[t], layer, kv);
				const unsigned char *s = src + (uint64_t)t * l->token_bytes +
							 (2 * layer + kv) * row;

				for (uint32_t i = 0; i < k; i++)
					row_stream(d + i * row, s + i * l->token_bytes, row);
			}
		}
	}
	/* Streaming stores are weakly ordered: make them visible before the
	 * caller commits (a release on another core must see them). */
	_mm_sfence();
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
		append_stream(l, base, slots, n, src);
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

void kvp_append_layers_cpu(const struct kvp_layout *l, void *tier_base,
			   const struct kvp_slot *slots, uint32_t n,
			   const void *const *k, const void *const *v)
{
	unsigned char *base = tier_base;
	const uint64_t row = l->token_stride;

	/* Layer by layer: each source buffer is read front to back. */
	for (uint32_t layer = 0; layer < l->layers; layer++) {
		for (uint32_t kv = 0; kv < 2; kv++) {
			const unsigned char *src = kv ? v[layer] : k[layer];

			for (uint32_t t = 0; t < n; t++)
				memcpy(base + slot_offset(l, slots[t], layer, kv),
				       src + (uint64_t)t * row, row);
		}
	}
}

void kvp_gather_cpu(const struct kvp_layout *l, const void *tier_base,
		    const int32_t *frames, uint32_t n, void *out)
{
	const unsigned char *base = tier_base;
	unsigned char *dst = out;

	for (uint32_t i = 0; i < n; i++)
		memcpy(dst + (uint64_t)i * l->page_bytes,
		       base + (uint64_t)(uint32_t)frames[i] * l->page_bytes,
		       l->page_bytes);
}

void kvp_scatter_cpu(const struct kvp_layout *l, void *tier_base,
		     const int32_t *frames, uint32_t n, const void *in)
{
	unsigned char *base = tier_base;
	const unsigned char *src = in;

	for (uint32_t i = 0; i < n; i++)
		memcpy(base + (uint64_t)(uint32_t)frames[i] * l->page_bytes,
		       src + (uint64_t)i * l->page_bytes, l->page_bytes);
}
