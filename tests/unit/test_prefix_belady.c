/* SPDX-License-Identifier: MIT */
/*
 * test_prefix_belady.c - the Belady's MIN simulation `kvbench prefix` reports
 * as belady_hit_rate (tools/kvbench/prefix_workload.c, "THE BELADY HIT
 * RATE"): two traces small enough to follow by hand (a prefix chain, where a
 * page counts only behind cached predecessors; chunks, which count only
 * whole), the refusal of a request larger than the pool, and on generated
 * traces 0 <= MIN <= best, MIN == best once the pool holds everything, and
 * more pages never fewer hits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "prefix_workload.h"

/*
 * Two conversations' prefixes, A -> B and C -> D (B can only hit behind A),
 * alternating A B | C D | A B | C D | A B with room for 3 pages, 10 tokens
 * a page. By hand (next use, then depth, decides the victim):
 *   r0 miss A B                        cache A B
 *   r1 miss C D: evict B (A, B both next at r2; B deeper)      A C D
 *   r2 A hit, B miss: evict D (C, D next at r3; D deeper)      A B C   10
 *   r3 C hit, D miss: evict B (A, B next at r4)                A C D   10
 *   r4 A hit, B miss: evict D (never used again)               A B C   10
 * = 30 tokens. An LRU of 3 pages hits nothing here (each chain is evicted
 * just before it is needed again), and a cache that kept B but lost A would
 * count no hit for B either: the lookup stops at A.
 */
static void test_belady_prefix_chain_by_hand(void **state)
{
	static const uint32_t ab[] = { 1, 2 }, cd[] = { 3, 4 };
	struct pw_bel_use u[5];
	uint64_t hit = 99;

	(void)state;
	for (uint32_t r = 0; r < 5; r++)
		u[r] = (struct pw_bel_use){ .request = r, .npages = 2,
					    .page = r % 2 ? cd : ab, .lookup = 2,
					    .tokens = 10 };
	assert_int_equal(pw_belady(u, 5, 5, 3, &hit), 0);
	assert_int_equal(hit, 30);
	/* Room for all four: every use after the first is served whole. */
	assert_int_equal(pw_belady(u, 5, 5, 4, &hit), 0);
	assert_int_equal(hit, 60);
	/* Prompts of exactly two pages (limit 20): a prompt cached whole
	 * counts 19, its last token computed (seed 004), not a page less. */
	for (uint32_t r = 0; r < 5; r++)
		u[r].limit = 20;
	assert_int_equal(pw_belady(u, 5, 5, 4, &hit), 0);
	assert_int_equal(hit, 3 * 19);
	/* Lookup capped at one page. */
	for (uint32_t r = 0; r < 5; r++)
		u[r].lookup = 1;
	assert_int_equal(pw_belady(u, 5, 5, 4, &hit), 0);
	assert_int_equal(hit, 30);
}

/*
 * Chunks U (pages 1 2, 20 tokens) and V (3 4, 20 tokens) in request 0, W (5,
 * 10 tokens) in 1, U in 2, V in 3; room for 4 pages:
 *   r0 miss U V                                    1 2 3 4
 *   r1 miss W: evict 4 (V next at r3, after U's r2)    1 2 3 5
 *   r2 U: both pages there, a hit                  20
 *   r3 V: page 3 there, page 4 not: a miss (a chunk is served whole)
 * = 20 tokens; counted page by page instead, V's first page would add 10.
 */
static void test_belady_chunks_count_whole_by_hand(void **state)
{
	static const uint32_t pu[] = { 1, 2 }, pv[] = { 3, 4 }, pw[] = { 5 };
	struct pw_bel_use u[] = {
		{ .request = 0, .npages = 2, .page = pu, .lookup = 2, .whole = 1, .tokens = 20 },
		{ .request = 0, .npages = 2, .page = pv, .lookup = 2, .whole = 1, .tokens = 20 },
		{ .request = 1, .npages = 1, .page = pw, .lookup = 1, .whole = 1, .tokens = 10 },
		{ .request = 2, .npages = 2, .page = pu, .lookup = 2, .whole = 1, .tokens = 20 },
		{ .request = 3, .npages = 2, .page = pv, .lookup = 2, .whole = 1, .tokens = 20 },
	};
	uint64_t hit = 99;

	(void)state;
	assert_int_equal(pw_belady(u, 5, 6, 4, &hit), 0);
	assert_int_equal(hit, 20);
	for (int k = 0; k < 5; k++) {
		u[k].whole = 0;
		u[k].tokens = 10; /* per page */
	}
	assert_int_equal(pw_belady(u, 5, 6, 4, &hit), 0);
	assert_int_equal(hit, 30);
}

static void test_belady_refuses_a_request_larger_than_the_pool(void **state)
{
	static const uint32_t pages[] = { 0, 1, 2 };
	struct pw_bel_use u = { .request = 0, .npages = 3, .page = pages, .lookup = 3,
				.tokens = 16 };
	uint64_t hit = 99;

	(void)state;
	assert_int_equal(pw_belady(&u, 1, 3, 2, &hit), -ENOSPC);
	assert_int_equal(pw_belady(&u, 1, 3, 3, &hit), 0);
	assert_int_equal(hit, 0);
}

static void test_belady_on_generated_traces_lies_between_zero_and_best(void **state)
{
	const struct pw_params p = {
		.seed = 11, .page_tokens = 16, .conversations = 24, .active = 6,
		.turns_min = 2, .turns_max = 8, .mt_systems = 2, .rag_requests = 80,
		.library = 100, .zipf_s = 1.0, .agent_requests = 40, .projects = 3,
	};
	const struct pw_chunks *cs[2];
	struct pw_trace t;
	char err[128];
	uint64_t lo, hi, all, min_pages;

	(void)state;
	assert_int_equal(pw_generate(&t, &p, err, sizeof(err)), 0);
	min_pages = 2ull * t.mt.max_pages + 2;
	assert_int_equal(pw_belady_multiturn(&t.mt, 16, min_pages, &lo), 0);
	assert_int_equal(pw_belady_multiturn(&t.mt, 16, 4 * min_pages, &hi), 0);
	assert_int_equal(pw_belady_multiturn(&t.mt, 16, UINT32_MAX, &all), 0);
	assert_true(lo <= hi);
	assert_true(hi <= t.mt.best_tokens);
	assert_true(lo > 0);
	/* A pool that never evicts serves exactly what the unbounded cache does. */
	assert_int_equal(all, t.mt.best_tokens);

	cs[0] = &t.rag;
	cs[1] = &t.agents;
	for (int k = 0; k < 2; k++) {
		min_pages = 2 * cs[k]->max_request_pages;
		assert_int_equal(pw_belady_chunks(cs[k], 16, min_pages, &lo), 0);
		assert_int_equal(pw_belady_chunks(cs[k], 16, UINT32_MAX, &all), 0);
		assert_true(lo <= cs[k]->best_tokens);
		assert_int_equal(all, cs[k]->best_tokens);
	}
	pw_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_belady_prefix_chain_by_hand),
		cmocka_unit_test(test_belady_chunks_count_whole_by_hand),
		cmocka_unit_test(test_belady_refuses_a_request_larger_than_the_pool),
		cmocka_unit_test(test_belady_on_generated_traces_lies_between_zero_and_best),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
