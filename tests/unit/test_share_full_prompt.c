/* SPDX-License-Identifier: MIT */
/*
 * test_share_full_prompt.c - seed 004's rule for a prompt that is cached
 * whole: report n - 1 cached tokens (the last token is left to compute, so
 * its logits come out of the model), not a whole page less. The lookup
 * reports n - 1 with all n / P pages; seq_alloc shares the pages before the
 * last, copies the last (shared) page on write, and leases one slot at
 * position n - 1. The cached page never sees the new token; the copy holds
 * the cached bytes of the first P - 1 tokens. Prompts that are not cached
 * whole keep whole pages. engine_check() passes after every step.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "engine_helpers.h"
#include "kvpool.h"
#include "share.h"
#include "share_helpers.h"

static const uint64_t KT = 0x7e57;   /* key of the token list T */
static const uint64_t KX = 0x0dd;    /* another key: bytes T never had */

static struct share_prefix_hit lookup(struct engine *eng, const uint32_t *tokens,
				      uint32_t n)
{
	struct share_prefix_hit h;

	memset(&h, 0, sizeof(h));
	share_prefix_lookup(eng, tokens, n, &h);
	CHECK(eng);
	return h;
}

/* T[0, 12): three full pages computed, committed and published by seq 1,
 * then freed: the pages stay cached, idle. Their frames go to *frames. */
static void cache_three_pages(struct engine *eng, uint32_t *T, uint32_t frames[3])
{
	tokens_seq(T, 12, 100);
	struct tlease a = seq_put(eng, 1, T, 12, KT, OWNER);

	memcpy(frames, a.frames, 3 * sizeof(uint32_t));
	seq_free_ok(eng, 1, OWNER);
	assert_int_equal(stats_of(eng).prefix_pages, 3);
	assert_int_equal(stats_of(eng).prefix_idle_pages, 3);
}

static void test_lookup_of_a_whole_cached_prompt_reports_n_minus_1(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[12], f[3];
	struct share_prefix_hit h;

	(void)state;
	cache_three_pages(eng, T, f);
	struct kvp_stats s0 = stats_of(eng);

	h = lookup(eng, T, 12);                  /* n = 3P, all cached */
	assert_int_equal(h.tokens, 11);
	assert_int_equal(h.npages, 3);           /* the last one partly */
	assert_memory_equal(h.frames, f, 3 * sizeof(uint32_t));
	struct kvp_stats s1 = stats_of(eng);
	assert_int_equal(s1.prefix_hit_tokens - s0.prefix_hit_tokens, 11);
	assert_int_equal(s1.prefix_lookup_tokens - s0.prefix_lookup_tokens, 12);

	h = lookup(eng, T, 8);                   /* n = 2P: a prefix, all cached */
	assert_int_equal(h.tokens, 7);
	assert_int_equal(h.npages, 2);
	h = lookup(eng, T, 4);                   /* n = P */
	assert_int_equal(h.tokens, 3);
	assert_int_equal(h.npages, 1);
	/* not cached whole: whole pages, as before */
	assert_int_equal(lookup(eng, T, 10).tokens, 8);
	assert_int_equal(lookup(eng, T, 10).npages, 2);
	assert_int_equal(lookup(eng, T, 1).tokens, 0);
	T[10] = 9999;                            /* page 2 differs */
	h = lookup(eng, T, 12);
	assert_int_equal(h.tokens, 8);
	assert_int_equal(h.npages, 2);
	/* nothing was pinned or moved */
	assert_int_equal(stats_of(eng).prefix_idle_pages, 3);
	drop_engine();
}

static void test_seq_alloc_of_a_whole_cached_prompt_copies_the_last_page(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[12], f[3];

	(void)state;
	cache_three_pages(eng, T, f);
	uint64_t used = dev_used(eng);
	struct kvp_stats s0 = stats_of(eng);

	struct tlease b = seq_alloc_ok(eng, 2, T, 12, OWNER);
	assert_int_equal(b.L.len, 11);
	assert_int_equal(b.L.hit_tokens, 11);
	assert_int_equal(b.L.n_new, 1);
	assert_int_equal(b.L.npages, 3);
	assert_int_equal(b.L.last_page_len, 4);
	assert_int_equal(b.frames[0], f[0]);     /* shared */
	assert_int_equal(b.frames[1], f[1]);
	assert_int_not_equal(b.frames[2], f[2]); /* a private copy */
	struct kvp_stats s1 = stats_of(eng);
	assert_int_equal(s1.cow_pages - s0.cow_pages, 1);
	assert_int_equal(s1.hit_tokens - s0.hit_tokens, 11);
	assert_int_equal(s1.prefix_hit_tokens - s0.prefix_hit_tokens, 11);
	assert_int_equal(dev_used(eng), used + 1);
	/* the copy holds the cached bytes of its first P - 1 tokens */
	expect_frames_bytes(eng, b.frames, 8, 3, KT, 8);

	/* The last token, written with other bytes: the cached page keeps its
	 * own (nobody else reading it sees them). */
	write_key(eng, &b, KX, 0, 1);
	commit_ok(eng, b.L.id, 1);
	release_ok(eng, b.L.id);
	expect_seq_bytes(eng, 2, 0, 11, KT, 0);
	expect_seq_bytes(eng, 2, 11, 1, KX, 11);
	expect_frames_bytes(eng, f, 0, 12, KT, 0);
	/* the commit found the cached page 2 by its hash: held as the chain's
	 * anchor, nothing published twice */
	struct kvp_stats s2 = stats_of(eng);
	assert_int_equal(s2.prefix_pages, 3);
	assert_int_equal(s2.prefix_dedupe_pages - s0.prefix_dedupe_pages, 1);

	/* a second request for the same prompt gets the same answer */
	struct tlease c = seq_alloc_ok(eng, 3, T, 12, OWNER);
	assert_int_equal(c.L.len, 11);
	assert_int_equal(c.frames[0], f[0]);
	assert_int_not_equal(c.frames[2], f[2]);
	assert_int_not_equal(c.frames[2], b.frames[2]);
	release_ok(eng, c.L.id);
	seq_free_ok(eng, 3, OWNER);
	seq_free_ok(eng, 2, OWNER);
	CHECK(eng);
	/* the copies are gone, the cached pages stay, idle */
	assert_int_equal(dev_used(eng), used);
	assert_int_equal(stats_of(eng).prefix_idle_pages, 3);
	assert_int_equal(lookup(eng, T, 12).tokens, 11);
	drop_engine();
}

/* A request that continues past a whole-prompt hit publishes its next pages
 * under the cached chain: a later, longer prompt finds all of them. */
static void test_extend_after_a_whole_prompt_hit_publishes_under_the_chain(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[16], f[3];

	(void)state;
	cache_three_pages(eng, T, f);
	tokens_seq(T, 16, 100);
	struct tlease b = seq_alloc_ok(eng, 2, T, 12, OWNER);
	assert_int_equal(b.L.len, 11);
	write_key(eng, &b, KT, 0, 1);
	commit_ok(eng, b.L.id, 1);
	struct tlease x = seq_extend_ok(eng, 2, 4, T + 12, OWNER);
	assert_int_equal(x.L.len, 12);
	write_key(eng, &x, KT, 0, 4);
	commit_ok(eng, x.L.id, 4);
	release_ok(eng, x.L.id);
	assert_int_equal(stats_of(eng).prefix_pages, 4);

	uint32_t U[17];
	memcpy(U, T, sizeof(T));
	U[16] = 7;
	struct share_prefix_hit h = lookup(eng, U, 17);
	assert_int_equal(h.tokens, 16);
	assert_int_equal(h.npages, 4);
	assert_memory_equal(h.frames, f, 3 * sizeof(uint32_t));
	assert_int_equal(h.frames[3], x.frames[3]);
	seq_free_ok(eng, 2, OWNER);
	drop_engine();
}

/* The last token rolled back, then other tokens from n - 1: the copy of the
 * last page now holds other tokens, so it is published under its own hash,
 * never as the cached page's twin; both prompts find their own pages. */
static void test_rolled_back_last_token_then_other_tokens_publish_their_own_page(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[12], f[3], U[13];

	(void)state;
	cache_three_pages(eng, T, f);
	struct tlease b = seq_alloc_ok(eng, 2, T, 12, OWNER);
	assert_int_equal(b.L.len, 11);
	release_ok(eng, b.L.id);                 /* token 11 never computed */
	memcpy(U, T, sizeof(T));
	U[11] = 5000;                            /* another token 11 ... */
	U[12] = 5001;                            /* ... and one more */
	struct tlease x = seq_extend_ok(eng, 2, 2, U + 11, OWNER);
	assert_int_equal(x.L.len, 11);
	assert_int_equal(x.frames[2], b.frames[2]); /* already private */
	write_key(eng, &x, KX, 0, 2);
	commit_ok(eng, x.L.id, 2);
	release_ok(eng, x.L.id);
	assert_int_equal(stats_of(eng).prefix_pages, 4); /* U's page 2 too */

	struct share_prefix_hit h = lookup(eng, U, 13);
	assert_int_equal(h.tokens, 12);
	assert_int_equal(h.npages, 3);
	assert_int_equal(h.frames[1], f[1]);
	assert_int_equal(h.frames[2], b.frames[2]);
	h = lookup(eng, T, 12);
	assert_int_equal(h.tokens, 11);
	assert_int_equal(h.frames[2], f[2]);
	expect_frames_bytes(eng, f, 0, 12, KT, 0);
	seq_free_ok(eng, 2, OWNER);
	drop_engine();
}

/* The copy needs one frame; with none free or evictable the alloc fails
 * with -ENOMEM and changes nothing. */
static void test_seq_alloc_of_a_whole_cached_prompt_without_a_frame_is_enomem(void **state)
{
	struct engine *eng = mk_engine(3, 0, 0);
	uint32_t T[12], f[3];
	struct engine_lease L;
	struct errbuf e = { .msg = "" };

	(void)state;
	cache_three_pages(eng, T, f);
	assert_int_equal(dev_free(eng), 0);
	struct kvp_stats s0 = stats_of(eng);

	memset(&L, 0, sizeof(L));
	assert_int_equal(share_seq_alloc(eng, 2, T, 12, OWNER, &L, &e), -ENOMEM);
	assert_true(strstr(e.msg, "out of memory") != NULL);
	CHECK(eng);
	struct kvp_stats s1 = stats_of(eng);
	assert_int_equal(s1.seqs, s0.seqs);
	assert_int_equal(s1.cow_pages, s0.cow_pages);
	assert_int_equal(s1.prefix_pages, 3);
	assert_int_equal(s1.prefix_idle_pages, 3);
	assert_int_equal(s1.tier[KVP_TIER_DEVICE].frames_used,
			 s0.tier[KVP_TIER_DEVICE].frames_used);
	/* a prompt one page shorter fits: P - 1 of page 1 shared, page 2 the
	 * evicted leaf's frame */
	struct tlease b = seq_alloc_ok(eng, 2, T, 8, OWNER);
	assert_int_equal(b.L.len, 7);
	release_ok(eng, b.L.id);
	seq_free_ok(eng, 2, OWNER);
	drop_engine();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_lookup_of_a_whole_cached_prompt_reports_n_minus_1,
					  teardown),
		cmocka_unit_test_teardown(test_seq_alloc_of_a_whole_cached_prompt_copies_the_last_page,
					  teardown),
		cmocka_unit_test_teardown(test_extend_after_a_whole_prompt_hit_publishes_under_the_chain,
					  teardown),
		cmocka_unit_test_teardown(
			test_rolled_back_last_token_then_other_tokens_publish_their_own_page,
			teardown),
		cmocka_unit_test_teardown(
			test_seq_alloc_of_a_whole_cached_prompt_without_a_frame_is_enomem,
			teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
