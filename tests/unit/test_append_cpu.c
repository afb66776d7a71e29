/* SPDX-License-Identifier: MIT */
/*
 * test_append_cpu.c - the CPU data ops: kvp_append_cpu() puts element
 * (layer l, kv, head h, dim d) of token i at exactly
 *   frame*page_bytes + l*layer_stride + kv*kv_stride + slot*token_stride
 *     + h*head_stride + d*elem_bytes
 * of the tier (checked against hand-computed offsets and a shadow buffer
 * for fp32, bf16 and fp8 layouts), touches no other byte, and
 * kvp_read_cpu() returns the same [n][layers][2][heads][dim] buffer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvp_kernels.h"
#include "kvpool.h"

static void layout_or_fail(struct kvp_layout *l, uint32_t layers,
			   uint32_t heads, uint32_t dim, uint32_t dtype,
			   uint32_t pt)
{
	char err[KVP_ERRLEN] = "";

	if (kvp_layout_init(l, layers, heads, dim, dtype, pt, err, sizeof(err)))
		fail_msg("kvp_layout_init: %s", err);
}

/* Offset of element (l, kv, h, d) of token i in the caller's kv buffer. */
static size_t src_off(const struct kvp_layout *l, uint32_t i, uint32_t layer,
		      uint32_t kv, uint32_t h, uint32_t d)
{
	size_t e = (((size_t)i * l->layers + layer) * 2 + kv);

	e = (e * l->kv_heads + h) * l->head_dim + d;
	return e * l->elem_bytes;
}

/* Offset in the tier from the formula in kvpool.h. */
static size_t dst_off(const struct kvp_layout *l, struct kvp_slot s,
		      uint32_t layer, uint32_t kv, uint32_t h, uint32_t d)
{
	return (size_t)s.frame * l->page_bytes + layer * l->layer_stride +
	       kv * l->kv_stride + s.slot * l->token_stride +
	       h * l->head_stride + (size_t)d * l->elem_bytes;
}

static void test_single_element_lands_at_hand_computed_offset(void **state)
{
	/* layers 2, heads 2, dim 4, fp32, 4 tokens/page:
	 * elem 4, head 16, token 32, kv 128, layer 256, page 512 */
	struct kvp_layout l;
	struct kvp_slot s = { .frame = 2, .slot = 3 };
	static const struct {
		uint32_t layer, kv, h, d;
		size_t src, dst;
	} cases[] = {
		/* src = (((l*2+kv)*2+h)*4+d)*4; dst = 2*512 + l*256 + kv*128 + 3*32 + h*16 + d*4 */
		{ 0, 0, 0, 0, 0, 1120 },
		{ 0, 0, 0, 3, 12, 1132 },
		{ 0, 0, 1, 0, 16, 1136 },
		{ 0, 1, 0, 0, 32, 1248 },
		{ 1, 0, 0, 0, 64, 1376 },
		{ 1, 1, 1, 2, 120, 1528 },
		{ 1, 1, 1, 3, 124, 1532 },
	};

	(void)state;
	layout_or_fail(&l, 2, 2, 4, KVP_DTYPE_FP32, 4);
	assert_int_equal(l.page_bytes, 512);
	assert_int_equal(l.token_bytes, 128);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		uint8_t tier[4 * 512];
		uint8_t kv[128];
		uint8_t back[128];
		const float v = 42.5f + (float)c;

		memset(tier, 0, sizeof(tier));
		memset(kv, 0, sizeof(kv));
		assert_int_equal(src_off(&l, 0, cases[c].layer, cases[c].kv,
					 cases[c].h, cases[c].d), cases[c].src);
		memcpy(kv + cases[c].src, &v, sizeof(v));
		kvp_append_cpu(&l, tier, &s, 1, kv);
		for (size_t b = 0; b < sizeof(tier); b++) {
			if (b >= cases[c].dst && b < cases[c].dst + 4)
				continue;
			if (tier[b] != 0)
				fail_msg("case %zu: byte %zu written (want only %zu..%zu)",
					 c, b, cases[c].dst, cases[c].dst + 3);
		}
		float got;

		memcpy(&got, tier + cases[c].dst, sizeof(got));
		assert_true(got == v);
		memset(back, 0xEE, sizeof(back));
		kvp_read_cpu(&l, tier, &s, 1, back);
		assert_memory_equal(back, kv, sizeof(kv));
	}
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)((x >> 16) | 1); /* never 0: untouched stays 0 */
	}
}

/* Append n tokens into scattered slots of a zeroed tier; compare the whole
 * tier with a shadow built from the formula, and read back. */
static void round_trip(const struct kvp_layout *l, uint32_t nframes,
		       const struct kvp_slot *slots, uint32_t n, uint32_t seed)
{
	size_t tier_bytes = (size_t)nframes * l->page_bytes;
	uint8_t *tier = calloc(1, tier_bytes);
	uint8_t *shadow = calloc(1, tier_bytes);
	uint8_t *kv = malloc((size_t)n * l->token_bytes);
	uint8_t *back = malloc((size_t)n * l->token_bytes);

	assert_non_null(tier);
	assert_non_null(shadow);
	assert_non_null(kv);
	assert_non_null(back);
	fill_pattern(kv, (size_t)n * l->token_bytes, seed);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t ly = 0; ly < l->layers; ly++)
			for (uint32_t k = 0; k < 2; k++)
				for (uint32_t h = 0; h < l->kv_heads; h++)
					for (uint32_t d = 0; d < l->head_dim; d++)
						memcpy(shadow + dst_off(l, slots[i], ly, k, h, d),
						       kv + src_off(l, i, ly, k, h, d),
						       l->elem_bytes);
	kvp_append_cpu(l, tier, slots, n, kv);
	for (size_t b = 0; b < tier_bytes; b++)
		if (tier[b] != shadow[b])
			fail_msg("dtype %u: tier byte %zu (frame %zu, in-page %zu) = %#x, want %#x",
				 l->dtype, b, b / l->page_bytes, b % l->page_bytes,
				 tier[b], shadow[b]);
	memset(back, 0, (size_t)n * l->token_bytes);
	kvp_read_cpu(l, tier, slots, n, back);
	assert_memory_equal(back, kv, (size_t)n * l->token_bytes);
	free(back);
	free(kv);
	free(shadow);
	free(tier);
}

static void test_fp32_scattered_slots_match_formula(void **state)
{
	struct kvp_layout l;
	/* out of order, several frames, partial pages, frame 0 and last frame */
	static const struct kvp_slot slots[] = {
		{ 3, 1 }, { 3, 2 }, { 0, 0 }, { 5, 3 }, { 1, 0 },
		{ 1, 1 }, { 1, 2 }, { 1, 3 }, { 4, 2 }, { 0, 3 },
	};

	(void)state;
	layout_or_fail(&l, 2, 2, 8, KVP_DTYPE_FP32, 4);
	round_trip(&l, 6, slots, sizeof(slots) / sizeof(slots[0]), 1);
}

static void test_bf16_scattered_slots_match_formula(void **state)
{
	/* layers 3, heads 2, dim 8, bf16, 8 tokens/page:
	 * elem 2, head 16, token 32, kv 256, layer 512, page 1536 */
	struct kvp_layout l;
	static const struct kvp_slot slots[] = {
		{ 2, 7 }, { 0, 0 }, { 0, 1 }, { 3, 4 }, { 1, 5 }, { 2, 0 },
	};

	(void)state;
	layout_or_fail(&l, 3, 2, 8, KVP_DTYPE_BF16, 8);
	assert_int_equal(l.elem_bytes, 2);
	assert_int_equal(l.head_stride, 16);
	assert_int_equal(l.token_stride, 32);
	assert_int_equal(l.kv_stride, 256);
	assert_int_equal(l.layer_stride, 512);
	assert_int_equal(l.page_bytes, 1536);
	round_trip(&l, 4, slots, sizeof(slots) / sizeof(slots[0]), 2);
}

static void test_fp8_and_fp16_scattered_slots_match_formula(void **state)
{
	struct kvp_layout l;
	static const struct kvp_slot slots[] = {
		{ 1, 15 }, { 0, 3 }, { 2, 8 }, { 0, 4 },
	};

	(void)state;
	layout_or_fail(&l, 4, 3, 5, KVP_DTYPE_FP8_E4M3, 16);
	round_trip(&l, 3, slots, 4, 3);
	layout_or_fail(&l, 1, 1, 3, KVP_DTYPE_FP16, 16);
	round_trip(&l, 3, slots, 4, 4);
}

static void test_bf16_bit_patterns_copied_verbatim(void **state)
{
	/* every 16-bit pattern (NaNs, denormals, -0) must survive: it is a copy */
	struct kvp_layout l;
	enum { N = 4 };
	struct kvp_slot slots[N];
	uint16_t *kv, *back;
	uint8_t *tier;

	(void)state;
	layout_or_fail(&l, 2, 4, 64, KVP_DTYPE_BF16, 16);
	size_t elems = (size_t)N * l.token_bytes / 2;
	kv = malloc(elems * 2);
	back = malloc(elems * 2);
	tier = calloc(N, l.page_bytes);
	assert_non_null(kv);
	assert_non_null(back);
	assert_non_null(tier);
	for (size_t i = 0; i < elems; i++)
		kv[i] = (uint16_t)(i * 40503u);
	kv[0] = 0x7FC1;	/* NaN */
	kv[1] = 0x8000;	/* -0 */
	kv[2] = 0x0001;	/* denormal */
	for (uint32_t i = 0; i < N; i++)
		slots[i] = (struct kvp_slot){ .frame = N - 1 - i, .slot = 15 - i };
	kvp_append_cpu(&l, tier, slots, N, kv);
	kvp_read_cpu(&l, tier, slots, N, back);
	assert_memory_equal(back, kv, elems * 2);
	/* token 0 layer 0 K head 0 dim 0 lands at frame 3 slot 15 */
	uint16_t first;
	memcpy(&first, tier + 3 * l.page_bytes + 15 * l.token_stride, 2);
	assert_int_equal(first, 0x7FC1);
	free(tier);
	free(back);
	free(kv);
}

static void test_second_append_leaves_first_intact(void **state)
{
	struct kvp_layout l;
	const struct kvp_slot a[] = { { 0, 0 }, { 0, 1 }, { 0, 2 } };
	const struct kvp_slot b[] = { { 0, 3 }, { 1, 0 } };
	uint8_t *tier, *kva, *kvb, *back;

	(void)state;
	layout_or_fail(&l, 2, 2, 8, KVP_DTYPE_FP32, 4);
	tier = calloc(2, l.page_bytes);
	kva = malloc(3 * l.token_bytes);
	kvb = malloc(2 * l.token_bytes);
	back = malloc(3 * l.token_bytes);
	assert_non_null(tier);
	assert_non_null(kva);
	assert_non_null(kvb);
	assert_non_null(back);
	fill_pattern(kva, 3 * l.token_bytes, 10);
	fill_pattern(kvb, 2 * l.token_bytes, 11);
	kvp_append_cpu(&l, tier, a, 3, kva);
	kvp_append_cpu(&l, tier, b, 2, kvb);
	kvp_read_cpu(&l, tier, a, 3, back);
	assert_memory_equal(back, kva, 3 * l.token_bytes);
	kvp_read_cpu(&l, tier, b, 2, back);
	assert_memory_equal(back, kvb, 2 * l.token_bytes);
	/* frame 1 slots 1..3 untouched */
	for (uint32_t ly = 0; ly < l.layers; ly++)
		for (uint32_t k = 0; k < 2; k++)
			for (size_t o = l.token_stride; o < l.kv_stride; o++)
				assert_int_equal(tier[l.page_bytes + ly * l.layer_stride +
						      k * l.kv_stride + o], 0);
	free(back);
	free(kvb);
	free(kva);
	free(tier);
}

static void test_zero_tokens_writes_nothing(void **state)
{
	struct kvp_layout l;
	uint8_t tier[512];
	uint8_t zero[512];
	uint8_t kv[1] = { 0xFF };
	struct kvp_slot s = { 0, 0 };

	(void)state;
	layout_or_fail(&l, 2, 2, 4, KVP_DTYPE_FP32, 4);
	memset(tier, 0, sizeof(tier));
	memset(zero, 0, sizeof(zero));
	kvp_append_cpu(&l, tier, &s, 0, kv);
	assert_memory_equal(tier, zero, sizeof(tier));
	kvp_read_cpu(&l, tier, &s, 0, kv);
	assert_int_equal(kv[0], 0xFF);
}

/*
 * Batches of 1 MiB and more take the streaming-store path: it must land the
 * same bytes in the same places as plain row copies, and leave every other
 * byte alone.
 */
static void test_large_batch_streaming_path_matches_row_copies(void **state)
{
	struct kvp_layout l;
	char err[KVP_ERRLEN];
	const uint32_t frames = 8, n = 96; /* 96 x 32 KiB = 3 MiB */
	unsigned char *pool, *want, *kv, *back;
	struct kvp_slot *slots;
	uint64_t bytes;

	(void)state;
	assert_int_equal(kvp_layout_init(&l, 8, 4, 256, KVP_DTYPE_BF16, 32, err,
					 sizeof(err)), 0);
	bytes = frames * l.page_bytes;
	pool = aligned_alloc(64, bytes);
	want = aligned_alloc(64, bytes);
	kv = malloc(n * l.token_bytes);
	back = malloc(n * l.token_bytes);
	slots = malloc(n * sizeof(*slots));
	assert_non_null(pool);
	assert_non_null(want);
	assert_non_null(kv);
	assert_non_null(back);
	assert_non_null(slots);
	memset(pool, 0xa5, bytes);
	memset(want, 0xa5, bytes);
	for (uint64_t i = 0; i < n * l.token_bytes; i++)
		kv[i] = (unsigned char)(i * 131 + (i >> 13));
	/* Three frames in reverse order, slots interleaved across them. */
	for (uint32_t t = 0; t < n; t++)
		slots[t] = (struct kvp_slot){ 7 - t % 3, t / 3 };

	kvp_append_cpu(&l, pool, slots, n, kv);
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t layer = 0; layer < l.layers; layer++)
			for (uint32_t k = 0; k < 2; k++)
				memcpy(want + slots[t].frame * l.page_bytes +
					       layer * l.layer_stride + k * l.kv_stride +
					       slots[t].slot * l.token_stride,
				       kv + t * l.token_bytes + (2 * layer + k) * l.token_stride,
				       l.token_stride);
	assert_memory_equal(pool, want, bytes);
	kvp_read_cpu(&l, pool, slots, n, back);
	assert_memory_equal(back, kv, n * l.token_bytes);
	free(pool);
	free(want);
	free(kv);
	free(back);
	free(slots);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_single_element_lands_at_hand_computed_offset),
		cmocka_unit_test(test_fp32_scattered_slots_match_formula),
		cmocka_unit_test(test_bf16_scattered_slots_match_formula),
		cmocka_unit_test(test_fp8_and_fp16_scattered_slots_match_formula),
		cmocka_unit_test(test_bf16_bit_patterns_copied_verbatim),
		cmocka_unit_test(test_second_append_leaves_first_intact),
		cmocka_unit_test(test_zero_tokens_writes_nothing),
		cmocka_unit_test(test_large_batch_streaming_path_matches_row_copies),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
