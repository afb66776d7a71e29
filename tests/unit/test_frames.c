/* SPDX-License-Identifier: MIT */
/*
 * test_frames.c - the per-tier frame allocator: a fresh allocator hands out
 * 0, 1, 2, ... in ascending order, returns FRAME_NONE when full, reuses freed
 * frames, and frames_used()/frames_in_use() track exactly what is handed out;
 * an empty (total 0) tier works. (A double free aborts by design: not tested.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frames.h"

static void test_fresh_allocator_is_ascending(void **state)
{
	struct frames f;

	(void)state;
	assert_int_equal(frames_init(&f, 100), 0);
	assert_int_equal(f.total, 100);
	assert_int_equal(frames_used(&f), 0);
	for (uint32_t i = 0; i < 100; i++) {
		assert_false(frames_in_use(&f, i));
		assert_int_equal(frames_alloc(&f), i);
		assert_true(frames_in_use(&f, i));
		assert_int_equal(frames_used(&f), i + 1);
	}
	frames_fini(&f);
}

static void test_alloc_until_full_returns_frame_none(void **state)
{
	struct frames f;

	(void)state;
	assert_int_equal(frames_init(&f, 7), 0);
	for (uint32_t i = 0; i < 7; i++)
		assert_int_not_equal(frames_alloc(&f), FRAME_NONE);
	assert_int_equal(frames_used(&f), 7);
	assert_int_equal(frames_alloc(&f), FRAME_NONE);
	assert_int_equal(frames_alloc(&f), FRAME_NONE);
	assert_int_equal(frames_used(&f), 7);
	frames_fini(&f);
}

static void test_free_then_alloc_reuses_frame(void **state)
{
	struct frames f;

	(void)state;
	assert_int_equal(frames_init(&f, 4), 0);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(frames_alloc(&f), i);
	frames_free(&f, 2);
	assert_false(frames_in_use(&f, 2));
	assert_int_equal(frames_used(&f), 3);
	assert_int_equal(frames_alloc(&f), 2);
	assert_true(frames_in_use(&f, 2));
	assert_int_equal(frames_alloc(&f), FRAME_NONE);

	/* free two, get exactly those two back (any order) */
	frames_free(&f, 0);
	frames_free(&f, 3);
	assert_int_equal(frames_used(&f), 2);
	uint32_t a = frames_alloc(&f), b = frames_alloc(&f);
	assert_true((a == 0 && b == 3) || (a == 3 && b == 0));
	assert_int_equal(frames_alloc(&f), FRAME_NONE);
	frames_fini(&f);
}

static void test_total_zero_is_an_empty_tier(void **state)
{
	struct frames f;

	(void)state;
	assert_int_equal(frames_init(&f, 0), 0);
	assert_int_equal(f.total, 0);
	assert_int_equal(frames_used(&f), 0);
	assert_int_equal(frames_alloc(&f), FRAME_NONE);
	assert_int_equal(frames_used(&f), 0);
	frames_fini(&f);
}

static void test_in_use_tracks_random_alloc_free(void **state)
{
	enum { N = 300 };
	struct frames f;
	bool model[N];
	uint32_t used = 0;
	uint64_t x = 88172645463325252ull;

	(void)state;
	memset(model, 0, sizeof(model));
	assert_int_equal(frames_init(&f, N), 0);
	for (int step = 0; step < 20000; step++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if ((x & 1) && used < N) {
			uint32_t fr = frames_alloc(&f);

			assert_int_not_equal(fr, FRAME_NONE);
			assert_true(fr < N);
			assert_false(model[fr]);
			model[fr] = true;
			used++;
		} else if (used > 0) {
			uint32_t fr = (uint32_t)((x >> 8) % N);

			while (!model[fr])
				fr = (fr + 1) % N;
			frames_free(&f, fr);
			model[fr] = false;
			used--;
		} else {
			continue;
		}
		assert_int_equal(frames_used(&f), used);
		assert_int_equal(f.nfree, N - used);
		if (step % 97 == 0) {
			for (uint32_t i = 0; i < N; i++)
				assert_int_equal(frames_in_use(&f, i), model[i]);
		}
	}
	/* drain: exactly the free frames come out, each once */
	while (used < N) {
		uint32_t fr = frames_alloc(&f);

		assert_int_not_equal(fr, FRAME_NONE);
		assert_false(model[fr]);
		model[fr] = true;
		used++;
	}
	assert_int_equal(frames_alloc(&f), FRAME_NONE);
	frames_fini(&f);
}

static void test_bitmap_word_boundaries(void **state)
{
	/* 130 frames straddle three 64-bit bitmap words */
	struct frames f;

	(void)state;
	assert_int_equal(frames_init(&f, 130), 0);
	for (uint32_t i = 0; i < 130; i++)
		assert_int_equal(frames_alloc(&f), i);
	static const uint32_t edge[] = { 0, 63, 64, 127, 128, 129 };
	for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++) {
		frames_free(&f, edge[i]);
		assert_false(frames_in_use(&f, edge[i]));
	}
	assert_int_equal(frames_used(&f), 124);
	for (uint32_t i = 0; i < 130; i++) {
		bool freed = false;

		for (size_t k = 0; k < sizeof(edge) / sizeof(edge[0]); k++)
			freed |= edge[k] == i;
		assert_int_equal(frames_in_use(&f, i), !freed);
	}
	frames_fini(&f);
}

static void test_fini_then_reinit(void **state)
{
	struct frames f;

	(void)state;
	assert_int_equal(frames_init(&f, 3), 0);
	(void)frames_alloc(&f);
	frames_fini(&f);
	assert_int_equal(frames_init(&f, 3), 0);
	assert_int_equal(frames_used(&f), 0);
	assert_int_equal(frames_alloc(&f), 0);
	frames_fini(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fresh_allocator_is_ascending),
		cmocka_unit_test(test_alloc_until_full_returns_frame_none),
		cmocka_unit_test(test_free_then_alloc_reuses_frame),
		cmocka_unit_test(test_total_zero_is_an_empty_tier),
		cmocka_unit_test(test_in_use_tracks_random_alloc_free),
		cmocka_unit_test(test_bitmap_word_boundaries),
		cmocka_unit_test(test_fini_then_reinit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
