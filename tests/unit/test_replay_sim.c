/* SPDX-License-Identifier: MIT */
/*
 * test_replay_sim.c - the replay's hit-rate arithmetic
 * (tools/kvbench/replay_sim.c) on the hand-made trace of
 * tests/data/replay-tiny.kvtrace, worked out by hand in its comments and
 * below: the infinite cache hits 32 of 108 tokens; with room for one page
 * of 16 tokens Belady's MIN on tokens hits 26 and whole-history LRU 10;
 * with room for everything all three hit 32. On a generated trace the
 * bound is never below LRU nor above the infinite cache, and grows with
 * the pool.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "replay_sim.h"

static void read_tiny(struct trace *t)
{
	char err[256] = "";
	FILE *f = fopen(KVPOOL_TEST_DATA "/replay-tiny.kvtrace", "r");

	assert_non_null(f);
	if (trace_read(t, f, "replay-tiny.kvtrace", err, sizeof(err)))
		fail_msg("%s", err);
	fclose(f);
}

/*
 * One page (16 tokens) for MIN, keys A = u1 08, B = u2 08, C = u1 09:
 *   A 12: miss; B 10: total 22, B's next use is farther: B keeps 4.
 *   A 16: hit 12, total 20: A (never again) keeps 12.  B 14: hit 4.
 *   C 10: miss.  C 46: hit 10.  Hits 12 + 4 + 10 = 26.
 * LRU, one page: each new history pushes the other out; only C's second
 * request finds its first (its own 3 pages stay, being the newest): 10.
 */
static void test_hand_computed_hits_of_the_tiny_trace(void **st)
{
	struct sim_result r = { 0 };
	struct trace t;

	read_tiny(&t);
	assert_int_equal(sim_run(&t, t.n, 16, 100, 0, 1, 0, &r), 0);
	assert_int_equal(r.needed, 108);
	assert_int_equal(r.hit[SIM_INFINITE], 32);
	assert_int_equal(r.hit[SIM_BEST], 32);
	assert_int_equal(r.hit[SIM_LRU], 32);

	assert_int_equal(sim_run(&t, t.n, 16, 1, 0, 1, 0, &r), 0);
	assert_int_equal(r.needed, 108);
	assert_int_equal(r.hit[SIM_INFINITE], 32);
	assert_int_equal(r.hit[SIM_BEST], 26);
	assert_int_equal(r.hit[SIM_LRU], 10);
	trace_free(&t);
}

static void test_buckets_add_up_to_the_totals(void **st)
{
	uint64_t need[2] = { 0 }, hit[NSIM][2] = { { 0 } };
	struct sim_result r = { .bucket_needed = need,
				.bucket_hit = { hit[0], hit[1], hit[2] } };
	struct trace t;

	read_tiny(&t);
	/* Day buckets from the first day's midnight (UTC). */
	assert_int_equal(sim_run(&t, t.n, 16, 100, 1649376000000ull, 86400000ull, 2, &r), 0);
	assert_int_equal(need[0], 52);
	assert_int_equal(need[1], 56);
	assert_int_equal(hit[SIM_INFINITE][0], 22);
	assert_int_equal(hit[SIM_INFINITE][1], 10);
	trace_free(&t);
}

static void test_bound_lies_between_lru_and_infinite_and_grows_with_the_pool(void **st)
{
	struct trace_gen_opts o = { .users = 60, .days = 3, .first_date = 20220408, .seed = 4 };
	struct trace t;
	char err[256];
	uint64_t prev = 0;

	assert_int_equal(trace_generate(&t, &o, err, sizeof(err)), 0);
	for (uint64_t pages = 50; pages <= 12800; pages *= 2) {
		struct sim_result r = { 0 };

		assert_int_equal(sim_run(&t, t.n, 16, pages, 0, 1, 0, &r), 0);
		assert_true(r.hit[SIM_BEST] >= r.hit[SIM_LRU]);
		assert_true(r.hit[SIM_BEST] <= r.hit[SIM_INFINITE]);
		assert_true(r.hit[SIM_BEST] >= prev);
		prev = r.hit[SIM_BEST];
	}
	trace_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hand_computed_hits_of_the_tiny_trace),
		cmocka_unit_test(test_buckets_add_up_to_the_totals),
		cmocka_unit_test(test_bound_lies_between_lru_and_infinite_and_grows_with_the_pool),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
