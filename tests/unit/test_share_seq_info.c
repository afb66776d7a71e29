/* SPDX-License-Identifier: MIT */
/*
 * test_share_seq_info.c - seed 004's request manager on sequences, the parts
 * share_seq.c adds for it: a sequence's state read back (GetRequest,
 * NumComputedTokens, GetComputedBlocks: share_seq_info), prefix caching
 * switched off (EnableCaching), and the limits on a sequence's tokens and on
 * sequences at once (MaxSeqLen, MaxNumRequests: share_seq_configure). A
 * failed call changes nothing; engine_check() passes after every step.
 * Pages hold 4 tokens (mk_engine).
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

static const uint64_t KT = 0x5eed4;

static struct share_seq_state info_ok(struct engine *eng, uint64_t seq)
{
	struct share_seq_state st;
	struct errbuf e = { 0 };
	int ret = share_seq_info(eng, seq, &st, &e);

	if (ret)
		fail_msg("share_seq_info(%" PRIu64 "): %d %s", seq, ret, e.msg);
	CHECK(eng);
	return st;
}

static void test_info_follows_alloc_commit_extend(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[10], more[3] = { 7, 8, 9 };
	struct share_seq_state st;

	(void)state;
	tokens_seq(T, 10, 300);
	struct tlease a = seq_alloc_ok(eng, 5, T, 10, OWNER);

	st = info_ok(eng, 5);
	assert_int_equal(st.info.seq, 5);
	assert_int_equal(st.info.tokens, 10);
	assert_int_equal(st.info.computed, 0);
	assert_int_equal(st.info.cached, 0);
	assert_int_equal(st.info.n_new, 10);
	assert_int_equal(st.info.npages, 3);
	assert_int_equal(st.info.computed_pages, 0);
	assert_int_equal(st.info.write_lease, a.L.id);
	assert_int_equal(st.info.owner, OWNER);
	assert_int_equal(st.info.flags, KVP_SEQ_TOKEN_IDS | KVP_SEQ_CACHING);
	assert_int_equal(st.info.ntoken_ids, 10);
	assert_memory_equal(st.tokens, T, sizeof(T));
	assert_memory_equal(st.frames, a.frames, 3 * sizeof(uint32_t));

	/* Commit 6 (seed 004 CommitTokens): one page full of computed tokens. */
	write_key(eng, &a, KT, 0, 10);
	commit_ok(eng, a.L.id, 6);
	st = info_ok(eng, 5);
	assert_int_equal(st.info.computed, 6);
	assert_int_equal(st.info.computed_pages, 1);
	assert_int_equal(st.info.published, 1);
	assert_int_equal(st.info.npages, 2); /* the uncommitted slots went back */
	assert_int_equal(st.info.tokens, 6);
	assert_int_equal(st.info.n_new, 0);
	assert_int_equal(st.info.ntoken_ids, 6);

	/* Extend by 3 with ids (AppendToken), commit them. */
	struct tlease b = seq_extend_ok(eng, 5, 3, more, OWNER);

	st = info_ok(eng, 5);
	assert_int_equal(st.info.tokens, 9);
	assert_int_equal(st.info.n_new, 3);
	assert_int_equal(st.info.write_lease, b.L.id);
	assert_memory_equal(st.tokens, T, 6 * sizeof(uint32_t));
	assert_memory_equal(st.tokens + 6, more, sizeof(more));
	assert_memory_equal(st.frames, b.frames, 3 * sizeof(uint32_t));
	commit_ok(eng, b.L.id, 3);
	release_ok(eng, b.L.id);
	st = info_ok(eng, 5);
	assert_int_equal(st.info.computed, 9);
	assert_int_equal(st.info.computed_pages, 2);
	assert_int_equal(st.info.write_lease, 0);

	/* Extended without ids: it stops publishing and has no ids to show. */
	struct tlease c = seq_extend_ok(eng, 5, 1, NULL, OWNER);

	st = info_ok(eng, 5);
	assert_int_equal(st.info.flags & KVP_SEQ_TOKEN_IDS, 0);
	assert_int_equal(st.info.ntoken_ids, 0);
	assert_null(st.tokens);
	release_ok(eng, c.L.id);
	seq_free_ok(eng, 5, OWNER);
	drop_engine();
}

static void test_info_reports_the_cached_prefix_of_a_second_request(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[10];
	struct share_seq_state st;
	struct errbuf e = { 0 };

	(void)state;
	tokens_seq(T, 10, 400);
	seq_put(eng, 1, T, 10, KT, OWNER);         /* publishes pages 0 and 1 */
	struct tlease b = seq_alloc_ok(eng, 2, T, 10, OWNER + 1);

	assert_int_equal(b.L.len, 8);
	st = info_ok(eng, 2);
	assert_int_equal(st.info.cached, 8);
	assert_int_equal(st.info.computed, 8);     /* NumComputedTokens */
	assert_int_equal(st.info.computed_pages, 2);
	assert_int_equal(st.info.owner, OWNER + 1);
	/* GetComputedBlocks: the computed pages are the first request's. */
	st = info_ok(eng, 1);
	uint32_t f1[2] = { st.frames[0], st.frames[1] };

	st = info_ok(eng, 2);
	assert_memory_equal(st.frames, f1, sizeof(f1));
	expect_frames_bytes(eng, st.frames, 0, 8, KT, 0);

	/* Unknown: -ENOENT naming it, nothing changed. */
	assert_int_equal(share_seq_info(eng, 77, &st, &e), -ENOENT);
	assert_non_null(strstr(e.msg, "sequence 77"));
	release_ok(eng, b.L.id);
	seq_free_ok(eng, 2, OWNER + 1);
	seq_free_ok(eng, 1, OWNER);
	drop_engine();
}

static void test_caching_off_finds_and_publishes_nothing(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[8];
	struct share_prefix_hit h;
	struct share_seq_state st;

	(void)state;
	tokens_seq(T, 8, 500);
	seq_put(eng, 1, T, 8, KT, OWNER);
	seq_free_ok(eng, 1, OWNER);
	assert_int_equal(stats_of(eng).prefix_pages, 2);

	share_seq_configure(eng, false, 0, 0);
	share_prefix_lookup(eng, T, 8, &h);
	assert_int_equal(h.tokens, 0);
	assert_int_equal(h.npages, 0);
	struct tlease a = seq_put(eng, 2, T, 8, KT, OWNER);

	assert_int_equal(a.L.len, 0);              /* computed again */
	st = info_ok(eng, 2);
	assert_int_equal(st.info.cached, 0);
	assert_int_equal(st.info.published, 0);
	assert_int_equal(st.info.flags, KVP_SEQ_TOKEN_IDS);
	assert_int_equal(stats_of(eng).prefix_pages, 2); /* none added */
	seq_free_ok(eng, 2, OWNER);

	/* On again: the cached pages are found again. */
	share_seq_configure(eng, true, 0, 0);
	struct tlease b = seq_alloc_ok(eng, 3, T, 8, OWNER);

	assert_int_equal(b.L.len, 7);
	release_ok(eng, b.L.id);
	seq_free_ok(eng, 3, OWNER);
	drop_engine();
}

static void test_max_seq_tokens_and_max_seqs(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	uint32_t T[12], more[4] = { 1, 2, 3, 4 };
	struct engine_lease L;
	struct errbuf e = { 0 };
	struct kvp_seq_src src = { .kind = KVP_SRC_SEQ, .id = 1 };

	(void)state;
	tokens_seq(T, 12, 600);
	share_seq_configure(eng, true, 10, 2);
	struct kvp_stats s0 = stats_of(eng);

	/* MaxSeqLen: 12 tokens over 10. */
	assert_int_equal(share_seq_alloc(eng, 1, T, 12, OWNER, &L, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "12 tokens but max_seq_tokens is 10"));
	assert_int_equal(share_seq_info(eng, 1, &(struct share_seq_state){ 0 },
					NULL), -ENOENT);
	assert_int_equal(stats_of(eng).seqs, s0.seqs);
	CHECK(eng);

	struct tlease a = seq_put(eng, 1, T, 8, KT, OWNER);

	(void)a;
	/* An extend past it: 8 + 4 > 10. */
	e.msg[0] = '\0';
	assert_int_equal(share_seq_extend(eng, 1, 4, more, OWNER, &L, &e), -E2BIG);
	assert_non_null(strstr(e.msg, "max_seq_tokens"));
	assert_int_equal(info_ok(eng, 1).info.tokens, 8);
	/* A virtual sequence of it plus 3 new tokens: 11 > 10. */
	assert_int_equal(share_seq_create(eng, 9, &src, 1, 3, OWNER, &L, &e), -E2BIG);
	CHECK(eng);

	/* MaxNumRequests: a second fits, a third does not. */
	struct tlease b = seq_put(eng, 2, T, 4, KT, OWNER);

	(void)b;
	e.msg[0] = '\0';
	assert_int_equal(share_seq_alloc(eng, 3, T, 4, OWNER, &L, &e), -ENOSPC);
	assert_non_null(strstr(e.msg, "max_seqs is 2"));
	assert_int_equal(share_seq_create(eng, 3, &src, 1, 0, OWNER, &L, &e), -ENOSPC);
	assert_int_equal(stats_of(eng).seqs, 2);
	CHECK(eng);
	/* Freeing one makes room. */
	seq_free_ok(eng, 2, OWNER);
	struct tlease c = seq_alloc_ok(eng, 3, T, 4, OWNER);

	release_ok(eng, c.L.id);
	/* 0: no limit. */
	share_seq_configure(eng, true, 0, 0);
	struct tlease d = seq_alloc_ok(eng, 4, T, 12, OWNER);

	release_ok(eng, d.L.id);
	seq_free_ok(eng, 4, OWNER);
	seq_free_ok(eng, 3, OWNER);
	seq_free_ok(eng, 1, OWNER);
	drop_engine();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_info_follows_alloc_commit_extend,
					  teardown),
		cmocka_unit_test_teardown(
			test_info_reports_the_cached_prefix_of_a_second_request,
			teardown),
		cmocka_unit_test_teardown(test_caching_off_finds_and_publishes_nothing,
					  teardown),
		cmocka_unit_test_teardown(test_max_seq_tokens_and_max_seqs, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
