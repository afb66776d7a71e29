/* SPDX-License-Identifier: MIT */
/*
 * test_engine_prepare.c - the engine's prepare / commit / release / info
 * contract on the shm backend: the seed's continuity rule (gap and overlap
 * errors quoting the exact token range, nothing changed on error), new users
 * starting anywhere, one write reservation per user (-EBUSY) beside any
 * number of read-only leases, partial commit giving back unused pages,
 * lease page tables and write slots, bytes written through the slots read
 * back, head trimming past max_tokens_per_user, out-of-memory and -E2BIG
 * leaving everything as it was, engine_release_owner, and the counters.
 * engine_check() must pass after every step.
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
#include "frames.h"
#include "kvpool.h"

/* ------------------------------------------------------------- helpers */

/* user's committed history is [start, start+len) in pages pages; returns
 * its info for the caller's further checks. */
static struct engine_user_info assert_history(struct engine *eng, uint64_t user,
					      uint64_t start, uint64_t len,
					      uint32_t pages)
{
	struct engine_user_info i = info_of(eng, user);

	assert_int_equal(i.start, start);
	assert_int_equal(i.len, len);
	assert_int_equal(i.pages, pages);
	return i;
}

/* L covers the history [start, start+len), hit_tokens of it cached, in
 * npages pages, the last holding last_page_len tokens. */
static void assert_lease_covers(const struct engine_lease *L, uint64_t start,
				uint64_t len, uint64_t hit_tokens, uint32_t npages,
				uint32_t last_page_len)
{
	assert_int_equal(L->start, start);
	assert_int_equal(L->len, len);
	assert_int_equal(L->hit_tokens, hit_tokens);
	assert_int_equal(L->npages, npages);
	assert_int_equal(L->last_page_len, last_page_len);
}

/* --------------------------------------------------------------- tests */

/* Seed example 1: cached [0,10), next input start 10 len 10 is accepted. */
static void test_prepare_contiguous_input_is_accepted(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct engine_user_info i;

	(void)state;
	put(eng, 0, 0, 10);
	i = assert_history(eng, 0, 0, 10, 3);
	assert_true(i.exists);
	assert_int_equal(i.pages_device, 3);
	assert_int_equal(i.leases, 0);

	struct engine_lease L = prep_ok(eng, 0, 10, 10, OWNER);
	assert_lease_covers(&L, 0, 10, 10, 5, 4);
	assert_int_equal(L.n_new, 10);
	write_commit_release(eng, &L, 0, 10);
	assert_history(eng, 0, 0, 20, 5);
	verify(eng, 0, 0, 20);
	drop_engine();
}

/* Seed example 2: cached [0,10), input start 20 len 10 -> missing 10..19. */
static void test_prepare_gap_reports_missing_range(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 0, 0, 10);
	struct engine_snap before = snap_of(eng, 0);

	assert_int_equal(prep_err(eng, 0, 20, 10, &e), -EINVAL);
	assert_msg_has(&e, "missing tokens from 10 to 19 (both inclusive)");
	/* and as data, for the completion (proto.h FAILURE DETAIL) */
	assert_int_equal(e.kind, KVP_ERROR_GAP);
	assert_int_equal(e.first, 10);
	assert_int_equal(e.last, 19);
	struct kvp_stats sa = stats_of(eng);
	assert_int_equal(sa.tier[KVP_TIER_DEVICE].frames_used,
			 before.stats.tier[KVP_TIER_DEVICE].frames_used);
	assert_int_equal(sa.tier[KVP_TIER_HOST].frames_used,
			 before.stats.tier[KVP_TIER_HOST].frames_used);
	assert_unchanged(eng, &before);

	/* one token past the end is a gap of exactly one token */
	assert_int_equal(prep_err(eng, 0, 11, 1, &e), -EINVAL);
	assert_msg_has(&e, "missing tokens from 10 to 10 (both inclusive)");
	/* a read-only prepare with a gap is refused too */
	assert_int_equal(prep_err(eng, 0, 20, 0, &e), -EINVAL);
	assert_msg_has(&e, "missing tokens from 10 to 19");
	assert_unchanged(eng, &before);
	verify(eng, 0, 0, 10);
	drop_engine();
}

/* Seed example 3: cached [0,10), input start 5 len 20 -> overlapping 5..9. */
static void test_prepare_overlap_reports_overlapping_range(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 0, 0, 10);
	struct engine_snap before = snap_of(eng, 0);

	assert_int_equal(prep_err(eng, 0, 5, 20, &e), -EINVAL);
	assert_msg_has(&e, "overlapping tokens from 5 to 9 (both inclusive)");
	assert_int_equal(e.kind, KVP_ERROR_OVERLAP);
	assert_int_equal(e.first, 5);
	assert_int_equal(e.last, 9);
	assert_unchanged(eng, &before);

	assert_int_equal(prep_err(eng, 0, 0, 20, &e), -EINVAL);
	assert_msg_has(&e, "overlapping tokens from 0 to 9 (both inclusive)");
	assert_int_equal(prep_err(eng, 0, 9, 20, &e), -EINVAL);
	assert_msg_has(&e, "overlapping tokens from 9 to 9 (both inclusive)");
	assert_unchanged(eng, &before);

	/* the valid continuation still works afterwards */
	put(eng, 0, 10, 10);
	verify(eng, 0, 0, 20);
	drop_engine();
}

static void test_prepare_new_user_accepts_any_start(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	struct engine_user_info i = info_of(eng, 7);
	assert_false(i.exists);
	assert_int_equal(i.len, 0);
	assert_int_equal(i.start, 0);
	assert_int_equal(i.pages, 0);

	struct engine_lease L = prep_ok(eng, 7, 1000, 5, OWNER);
	assert_lease_covers(&L, 1000, 0, 0, 2, 1);
	write_commit_release(eng, &L, 7, 5);
	i = assert_history(eng, 7, 1000, 5, 2);
	assert_true(i.exists);
	verify(eng, 7, 1000, 5);

	/* from now on continuity is enforced relative to 1000 */
	assert_int_equal(prep_err(eng, 7, 1000, 10, &e), -EINVAL);
	assert_msg_has(&e, "overlapping tokens from 1000 to 1004 (both inclusive)");
	assert_int_equal(prep_err(eng, 7, 1010, 1, &e), -EINVAL);
	assert_msg_has(&e, "missing tokens from 1005 to 1009 (both inclusive)");
	put(eng, 7, 1005, 3);
	verify(eng, 7, 1000, 8);
	assert_int_equal(info_of(eng, 7).len, 8);

	/* a new user may also start at 0 and at a large position */
	put(eng, 8, 0, 1);
	put(eng, 9, 1ull << 40, 4);
	assert_int_equal(info_of(eng, 9).start, 1ull << 40);
	verify(eng, 9, 1ull << 40, 4);
	drop_engine();
}

static void test_prepare_position_overflow_is_einval(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	struct kvp_stats sb = stats_of(eng);
	assert_int_equal(prep_err(eng, 5, UINT64_MAX - 3, 8, &e), -EINVAL);
	assert_true(e.msg[0] != '\0');
	assert_int_equal(prep_err(eng, 5, (1ull << 63) + 1, 1, &e), -EINVAL);
	assert_true(e.msg[0] != '\0');
	struct kvp_stats sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	assert_false(info_of(eng, 5).exists);
	drop_engine();
}

static void test_prepare_second_writer_is_ebusy_readers_allowed(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 3, 0, 8);
	struct engine_lease A = prep_ok(eng, 3, 8, 4, OWNER);
	uint64_t used = dev_used(eng);

	struct kvp_stats sb = stats_of(eng);
	assert_int_equal(prep_err(eng, 3, 8, 4, &e), -EBUSY);
	assert_true(e.msg[0] != '\0');
	struct kvp_stats sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	assert_int_equal(dev_used(eng), used);

	/* read-only leases are fine beside the writer */
	struct engine_lease R1 = prep_ok(eng, 3, 8, 0, OWNER);
	assert_int_equal(R1.len, 8);
	assert_int_equal(R1.n_new, 0);
	assert_int_equal(R1.npages, 2);
	assert_int_equal(R1.last_page_len, 4);
	struct engine_lease R2 = prep_ok(eng, 3, 8, 0, 2);
	assert_int_not_equal(R1.id, R2.id);
	assert_int_not_equal(R1.id, A.id);
	assert_int_equal(info_of(eng, 3).leases, 3);
	assert_int_equal(stats_of(eng).leases, 3);

	/* still busy for writers while A is uncommitted */
	assert_int_equal(prep_err(eng, 3, 8, 1, &e), -EBUSY);

	write_lease(eng, &A, 3, 0, 4);
	commit_ok(eng, A.id, 4);
	assert_int_equal(info_of(eng, 3).len, 12);

	/* after commit (A not even released) another writer may come */
	struct engine_lease C = prep_ok(eng, 3, 12, 2, OWNER);
	assert_int_equal(C.len, 12);
	write_lease(eng, &C, 3, 0, 2);
	assert_int_equal(prep_err(eng, 3, 12, 2, &e), -EBUSY);
	commit_ok(eng, C.id, 2);
	release_ok(eng, C.id);
	release_ok(eng, A.id);
	release_ok(eng, R1.id);
	release_ok(eng, R2.id);
	assert_int_equal(info_of(eng, 3).leases, 0);
	assert_int_equal(stats_of(eng).leases, 0);
	verify(eng, 3, 0, 14);

	/* a busy user does not block other users */
	struct engine_lease X = prep_ok(eng, 3, 14, 1, OWNER);
	put(eng, 4, 0, 3);
	release_ok(eng, X.id);
	drop_engine();
}

/* A reader that came before a writer must not undo the writer on release. */
static void test_reader_release_keeps_concurrent_writer_commit(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);

	(void)state;
	put(eng, 1, 0, 8);
	struct engine_lease R = prep_ok(eng, 1, 8, 0, OWNER);
	struct engine_lease W = prep_ok(eng, 1, 8, 4, OWNER);
	write_lease(eng, &W, 1, 0, 4);
	commit_ok(eng, W.id, 4);
	assert_int_equal(info_of(eng, 1).len, 12);
	release_ok(eng, R.id);
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.len, 12);
	assert_int_equal(i.pages, 3);
	assert_int_equal(dev_used(eng), 3);
	release_ok(eng, W.id);
	i = info_of(eng, 1);
	assert_int_equal(i.len, 12);
	verify(eng, 1, 0, 12);
	drop_engine();
}

/* A reader released while a writer is still uncommitted must leave the
 * writer's reservation (its pages and its exclusivity) alone. */
static void test_reader_release_keeps_pending_reservation(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 8);
	struct engine_lease R = prep_ok(eng, 1, 8, 0, OWNER);
	struct engine_lease W = prep_ok(eng, 1, 8, 4, OWNER);
	assert_int_equal(dev_used(eng), 3);
	release_ok(eng, R.id);
	assert_int_equal(dev_used(eng), 3); /* W's page is still reserved */
	assert_int_equal(prep_err(eng, 1, 8, 1, &e), -EBUSY);
	struct kvp_slot s;
	e.msg[0] = '\0';
	if (engine_lease_slots(eng, W.id, 3, 1, &s, &e) != 0)
		fail_msg("writer's slots gone after a reader's release: %s", e.msg);
	write_commit_release(eng, &W, 1, 4);
	assert_int_equal(info_of(eng, 1).len, 12);
	verify(eng, 1, 0, 12);
	drop_engine();
}

/* commit(reader, 0) is legal and changes nothing, whatever happened since. */
static void test_reader_commit_zero_changes_nothing(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);

	(void)state;
	put(eng, 1, 0, 8);
	struct engine_lease R = prep_ok(eng, 1, 8, 0, OWNER);
	put(eng, 1, 8, 5);
	commit_ok(eng, R.id, 0);
	assert_int_equal(info_of(eng, 1).len, 13);
	release_ok(eng, R.id);
	assert_int_equal(info_of(eng, 1).len, 13);
	assert_int_equal(dev_used(eng), 4);
	verify(eng, 1, 0, 13);
	drop_engine();
}

static void test_prepare_busy_new_user(void **state)
{
	/* a user whose only content is an uncommitted reservation is busy too */
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	struct engine_lease A = prep_ok(eng, 11, 0, 3, OWNER);
	struct engine_user_info i = info_of(eng, 11);
	assert_true(i.exists);
	assert_int_equal(i.len, 0);
	assert_int_equal(i.leases, 1);
	assert_int_equal(prep_err(eng, 11, 0, 3, &e), -EBUSY);
	release_ok(eng, A.id);
	i = info_of(eng, 11);
	assert_false(i.exists);
	assert_int_equal(dev_used(eng), 0);
	drop_engine();
}

static void test_commit_partial_returns_unused_pages(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);

	(void)state;
	struct engine_lease L = prep_ok(eng, 1, 0, 10, OWNER);
	assert_int_equal(L.npages, 3);
	assert_int_equal(L.last_page_len, 2);
	assert_int_equal(dev_used(eng), 3);
	write_lease(eng, &L, 1, 0, 10);
	commit_ok(eng, L.id, 5);
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.len, 5);
	assert_int_equal(i.pages, 2);
	assert_int_equal(dev_used(eng), 2); /* the third page went back at commit */
	release_ok(eng, L.id);
	i = info_of(eng, 1);
	assert_int_equal(i.len, 5);
	assert_int_equal(i.pages, 2);
	assert_int_equal(i.pages_device, 2);
	assert_int_equal(i.leases, 0);
	assert_int_equal(dev_used(eng), 2);
	verify(eng, 1, 0, 5);

	/* the continuation starts right after the committed part */
	struct errbuf e;
	assert_int_equal(prep_err(eng, 1, 10, 1, &e), -EINVAL);
	assert_msg_has(&e, "missing tokens from 5 to 9 (both inclusive)");
	put(eng, 1, 5, 3);
	verify(eng, 1, 0, 8);
	assert_int_equal(dev_used(eng), 2);
	drop_engine();
}

static void test_commit_zero_gives_back_everything(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);

	(void)state;
	put(eng, 1, 0, 6);
	struct engine_user_info before = info_of(eng, 1);
	struct engine_lease L = prep_ok(eng, 1, 6, 7, OWNER);
	assert_int_equal(dev_used(eng), 4);
	commit_ok(eng, L.id, 0);
	assert_int_equal(dev_used(eng), 2);
	release_ok(eng, L.id);
	struct engine_user_info after = info_of(eng, 1);
	assert_info_same(&before, &after);
	verify(eng, 1, 0, 6);
	drop_engine();
}

static void test_commit_and_release_errors(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	struct engine_lease L = prep_ok(eng, 1, 0, 4, OWNER);
	/* n > n_new */
	e.msg[0] = '\0';
	assert_int_equal(engine_commit(eng, L.id, 5, &e), -EINVAL);
	assert_true(e.msg[0] != '\0');
	CHECK(eng);
	assert_int_equal(info_of(eng, 1).len, 0);
	write_lease(eng, &L, 1, 0, 4);
	commit_ok(eng, L.id, 4);
	/* twice */
	e.msg[0] = '\0';
	assert_int_equal(engine_commit(eng, L.id, 4, &e), -EALREADY);
	assert_true(e.msg[0] != '\0');
	assert_int_equal(engine_commit(eng, L.id, 0, &e), -EALREADY);
	CHECK(eng);
	assert_int_equal(info_of(eng, 1).len, 4);
	/* unknown lease */
	uint64_t bogus = L.id + 12345;
	assert_int_equal(engine_commit(eng, bogus, 0, &e), -ENOENT);
	assert_int_equal(engine_release(eng, bogus, &e), -ENOENT);
	assert_int_equal(engine_commit(eng, 0, 0, &e), -ENOENT);
	assert_int_equal(engine_release(eng, UINT64_MAX, &e), -ENOENT);
	CHECK(eng);
	release_ok(eng, L.id);
	/* release twice, commit after release */
	struct kvp_stats sb = stats_of(eng);
	assert_int_equal(engine_release(eng, L.id, &e), -ENOENT);
	assert_int_equal(engine_commit(eng, L.id, 1, &e), -ENOENT);
	struct kvp_stats sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	CHECK(eng);
	/* a released id is not reused by the next lease */
	struct engine_lease M = prep_ok(eng, 1, 4, 1, OWNER);
	assert_int_not_equal(M.id, L.id);
	assert_int_equal(engine_commit(eng, L.id, 1, &e), -ENOENT);
	release_ok(eng, M.id);
	verify(eng, 1, 0, 4);
	drop_engine();
}

static void test_release_without_commit_rolls_back(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);

	(void)state;
	put(eng, 2, 0, 6); /* 2 pages, last one half full */
	struct engine_user_info before = info_of(eng, 2);
	struct kvp_stats sb = stats_of(eng);
	struct engine_lease L = prep_ok(eng, 2, 6, 9, OWNER); /* -> 15 tokens, 4 pages */
	assert_int_equal(L.npages, 4);
	assert_int_equal(dev_used(eng), 4);
	write_lease(eng, &L, 99, 0, 9); /* garbage into the reserved slots */
	release_ok(eng, L.id);
	struct engine_user_info after = info_of(eng, 2);
	assert_info_same(&before, &after);
	struct kvp_stats sa = stats_of(eng);
	assert_int_equal(sa.tier[KVP_TIER_DEVICE].frames_used,
			 sb.tier[KVP_TIER_DEVICE].frames_used);
	assert_int_equal(sa.leases, 0);
	assert_int_equal(sa.committed_tokens, sb.committed_tokens);
	verify(eng, 2, 0, 6);
	/* the same positions can be prepared again and now carry new data */
	put(eng, 2, 6, 9);
	verify(eng, 2, 0, 15);

	/* a new user rolled back disappears entirely */
	struct engine_lease N = prep_ok(eng, 3, 50, 3, OWNER);
	release_ok(eng, N.id);
	assert_false(info_of(eng, 3).exists);
	assert_int_equal(dev_used(eng), 4);
	assert_int_equal(stats_of(eng).users, 1);
	drop_engine();
}

static void test_lease_frames_and_slots_are_consistent(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 5, 100, 5); /* start 100, len 5: pages 2, last page 1 token */
	struct engine_lease L = prep_ok(eng, 5, 105, 10, OWNER);
	assert_int_equal(L.start, 100);
	assert_int_equal(L.len, 5);
	assert_int_equal(L.n_new, 10);
	assert_int_equal(L.npages, 4); /* 15 tokens */
	assert_int_equal(L.last_page_len, 3);
	assert_non_null(L.frames);
	uint32_t frames[4];
	memcpy(frames, L.frames, sizeof(frames));
	for (int a = 0; a < 4; a++) {
		assert_true(frames[a] < 16);
		for (int b = a + 1; b < 4; b++)
			assert_int_not_equal(frames[a], frames[b]);
	}

	struct kvp_slot s[10];
	e.msg[0] = '\0';
	assert_int_equal(engine_lease_slots(eng, L.id, 0, 10, s, &e), 0);
	for (uint32_t i = 0; i < 10; i++) {
		uint32_t tok = (uint32_t)L.len + i;

		assert_int_equal(s[i].frame, frames[tok / PT]);
		assert_int_equal(s[i].slot, tok % PT);
	}
	/* a sub-range gives the same pairs */
	struct kvp_slot t[3];
	assert_int_equal(engine_lease_slots(eng, L.id, 6, 3, t, &e), 0);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(t[i].frame, s[6 + i].frame);
		assert_int_equal(t[i].slot, s[6 + i].slot);
	}
	/* past n_new or unknown lease: an error */
	assert_true(engine_lease_slots(eng, L.id, 8, 3, t, &e) < 0);
	assert_true(engine_lease_slots(eng, L.id + 777, 0, 1, t, &e) < 0);
	CHECK(eng);

	/* the existing pages of the history come first, unchanged */
	struct engine_lease R = prep_ok(eng, 6, 0, 0, OWNER); /* unrelated new user */
	release_ok(eng, R.id);
	commit_ok(eng, L.id, 10);
	release_ok(eng, L.id);
	struct engine_lease Q = prep_ok(eng, 5, 115, 0, OWNER);
	assert_int_equal(Q.npages, 4);
	assert_int_equal(Q.last_page_len, 3);
	assert_memory_equal(Q.frames, frames, sizeof(frames));
	release_ok(eng, Q.id);

	/* appending into a partial last page reuses its frame */
	struct engine_lease W = prep_ok(eng, 5, 115, 1, OWNER);
	assert_int_equal(W.npages, 4);
	assert_int_equal(W.last_page_len, 4);
	assert_int_equal(engine_lease_slots(eng, W.id, 0, 1, s, &e), 0);
	assert_int_equal(s[0].frame, frames[3]);
	assert_int_equal(s[0].slot, 3);
	release_ok(eng, W.id);

	/* an exactly full history: the next token opens a new page at slot 0 */
	put(eng, 7, 0, 8);
	struct engine_lease F = prep_ok(eng, 7, 8, 1, OWNER);
	assert_int_equal(F.npages, 3);
	assert_int_equal(F.last_page_len, 1);
	uint32_t f2 = F.frames[2];
	assert_int_equal(engine_lease_slots(eng, F.id, 0, 1, s, &e), 0);
	assert_int_equal(s[0].frame, f2);
	assert_int_equal(s[0].slot, 0);
	release_ok(eng, F.id);
	drop_engine();
}

static void test_bytes_written_through_slots_read_back(void **state)
{
	struct engine *eng = mk_engine(16, 0, 0);
	const struct kvp_layout *l;

	(void)state;
	l = engine_layout(eng);
	struct engine_lease L = prep_ok(eng, 4, 0, 7, OWNER);
	write_lease(eng, &L, 4, 0, 3); /* in two pieces */
	write_lease(eng, &L, 4, 3, 4);
	commit_ok(eng, L.id, 7);
	release_ok(eng, L.id);
	verify(eng, 4, 0, 7);
	verify(eng, 4, 2, 3);

	/* append into the partial page, and more */
	put(eng, 4, 7, 6);
	verify(eng, 4, 0, 13);

	/* the device frames of a read lease hold the same bytes */
	struct engine_lease R = prep_ok(eng, 4, 13, 0, OWNER);
	uint32_t frames[4];
	assert_int_equal(R.npages, 4);
	memcpy(frames, R.frames, sizeof(frames));
	struct kvp_slot s[13];
	for (uint32_t i = 0; i < 13; i++)
		s[i] = (struct kvp_slot){ .frame = frames[i / PT], .slot = i % PT };
	uint8_t *got = malloc(13 * l->token_bytes);
	uint8_t *want = malloc(13 * l->token_bytes);
	assert_non_null(got);
	assert_non_null(want);
	kvp_read_cpu(l, engine_tier(eng, KVP_TIER_DEVICE)->base, s, 13, got);
	pattern(l, 4, 0, 13, want);
	assert_memory_equal(got, want, 13 * l->token_bytes);
	release_ok(eng, R.id);

	/* reading outside the committed range fails */
	struct errbuf e;
	assert_true(engine_read_tokens(eng, 4, 10, 4, got, &e) < 0);
	assert_true(engine_read_tokens(eng, 4, 13, 1, got, &e) < 0);
	assert_true(engine_read_tokens(eng, 999, 0, 1, got, &e) < 0);
	free(want);
	free(got);
	CHECK(eng);

	/* uncommitted tokens are not readable */
	struct engine_lease U = prep_ok(eng, 4, 13, 2, OWNER);
	write_lease(eng, &U, 4, 0, 2);
	uint8_t one[256];
	assert_int_equal(l->token_bytes, sizeof(one));
	assert_true(engine_read_tokens(eng, 4, 13, 1, one, &e) < 0);
	commit_ok(eng, U.id, 1);
	verify(eng, 4, 13, 1);
	assert_true(engine_read_tokens(eng, 4, 14, 1, one, &e) < 0);
	release_ok(eng, U.id);
	verify(eng, 4, 0, 14);
	drop_engine();
}

static void test_head_trim_past_max_tokens(void **state)
{
	struct engine *eng = mk_engine(16, 0, 8);
	struct errbuf e;

	(void)state;
	struct engine_lease L = prep_ok(eng, 1, 0, 10, OWNER);
	write_lease(eng, &L, 1, 0, 10);
	commit_ok(eng, L.id, 10);
	/* still leased: nothing trimmed yet */
	struct engine_user_info i = info_of(eng, 1);
	assert_int_equal(i.start, 0);
	assert_int_equal(i.len, 10);
	assert_int_equal(stats_of(eng).trimmed_pages, 0);
	release_ok(eng, L.id);
	/* ceil((10 - 8) / 4) = 1 page trimmed: start 4, len 6 */
	i = assert_history(eng, 1, 4, 6, 2);
	assert_int_equal(i.pages_device, 2);
	assert_int_equal(stats_of(eng).trimmed_pages, 1);
	assert_int_equal(dev_used(eng), 2);
	verify(eng, 1, 4, 6);
	uint8_t tok[256];
	assert_true(engine_read_tokens(eng, 1, 0, 1, tok, &e) < 0);
	assert_true(engine_read_tokens(eng, 1, 3, 2, tok, &e) < 0);

	/* continuity is now relative to start + len = 10 */
	assert_int_equal(prep_err(eng, 1, 4, 10, &e), -EINVAL);
	assert_msg_has(&e, "overlapping tokens from 4 to 9 (both inclusive)");
	struct engine_lease M = prep_ok(eng, 1, 10, 4, OWNER);
	assert_int_equal(M.start, 4);
	assert_int_equal(M.len, 6);
	assert_int_equal(M.hit_tokens, 6);
	write_commit_release(eng, &M, 1, 4);
	/* [4,14): 10 > 8 -> one more page: start 8, len 6 */
	i = info_of(eng, 1);
	assert_int_equal(i.start, 8);
	assert_int_equal(i.len, 6);
	assert_int_equal(stats_of(eng).trimmed_pages, 2);
	verify(eng, 1, 8, 6);

	/* exactly at the cap: no trim */
	put(eng, 2, 0, 8);
	i = info_of(eng, 2);
	assert_int_equal(i.start, 0);
	assert_int_equal(i.len, 8);
	assert_int_equal(stats_of(eng).trimmed_pages, 2);

	/* a long burst trims several pages at once:
	 * 21 tokens, ceil((21 - 8) / 4) = 4 pages -> start 16, len 5 */
	put(eng, 3, 0, 21);
	assert_history(eng, 3, 16, 5, 2);
	assert_int_equal(stats_of(eng).trimmed_pages, 6);
	verify(eng, 3, 16, 5);
	drop_engine();
}

static void test_prepare_oom_changes_nothing(void **state)
{
	struct engine *eng = mk_engine(4, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 16); /* all 4 device frames */
	struct engine_lease A = prep_ok(eng, 1, 16, 0, OWNER);

	struct kvp_stats sb = stats_of(eng);
	struct engine_user_info ib = info_of(eng, 1), jb = info_of(eng, 2);
	assert_int_equal(prep_err(eng, 2, 0, 1, &e), -ENOMEM);
	assert_true(e.msg[0] != '\0');
	struct kvp_stats sa = stats_of(eng);
	struct engine_user_info ia = info_of(eng, 1), ja = info_of(eng, 2);
	assert_stats_same(&sb, &sa);
	assert_info_same(&ib, &ia);
	assert_info_same(&jb, &ja);
	assert_false(ja.exists);
	verify(eng, 1, 0, 16);

	/* once the lease is gone, user 2 gets a page by evicting user 1 */
	release_ok(eng, A.id);
	put(eng, 2, 0, 1);
	assert_false(info_of(eng, 1).exists);
	verify(eng, 2, 0, 1);
	drop_engine();
}

static void test_prepare_oom_partial_pin(void **state)
{
	/* 3 frames pinned by user 1, 1 free: 2 pages for user 2 cannot fit */
	struct engine *eng = mk_engine(4, 0, 0);
	struct errbuf e;

	(void)state;
	put(eng, 1, 0, 12);
	struct engine_lease A = prep_ok(eng, 1, 12, 0, OWNER);
	struct kvp_stats sb = stats_of(eng);
	assert_int_equal(prep_err(eng, 2, 0, 5, &e), -ENOMEM);
	struct kvp_stats sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	/* but 1 page does */
	put(eng, 2, 0, 4);
	/* now: pinned 1 (3 pages) + 2 (1 page, unpinned). The writer of user 1
	 * needs one more frame: user 2 is evicted, user 1 survives */
	release_ok(eng, A.id);
	struct engine_lease B = prep_ok(eng, 1, 12, 4, OWNER);
	assert_false(info_of(eng, 2).exists);
	release_ok(eng, B.id);
	verify(eng, 1, 0, 12);
	drop_engine();
}

static void test_prepare_more_pages_than_tier_is_e2big(void **state)
{
	struct engine *eng = mk_engine(4, 8, 0);
	struct errbuf e;

	(void)state;
	struct kvp_stats sb = stats_of(eng);
	assert_int_equal(prep_err(eng, 1, 0, 17, &e), -E2BIG);
	assert_true(e.msg[0] != '\0');
	assert_int_equal(prep_err(eng, 1, 0, UINT32_MAX, &e), -E2BIG);
	struct kvp_stats sa = stats_of(eng);
	assert_stats_same(&sb, &sa);
	assert_false(info_of(eng, 1).exists);

	/* exactly the tier fits */
	put(eng, 1, 0, 16);
	/* the history's own pages count: 14 cached + 3 new = 5 pages > 4 */
	drop_engine();
	eng = mk_engine(4, 8, 0);
	put(eng, 2, 0, 14);
	struct engine_snap before = snap_of(eng, 2);
	assert_int_equal(prep_err(eng, 2, 14, 3, &e), -E2BIG);
	assert_unchanged(eng, &before);
	put(eng, 2, 14, 2);
	verify(eng, 2, 0, 16);
	drop_engine();
}

static void test_release_owner_releases_and_rolls_back(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);

	(void)state;
	put(eng, 1, 0, 5);
	put(eng, 2, 0, 5);
	put(eng, 3, 0, 5);
	put(eng, 4, 0, 5);
	struct engine_user_info i1 = info_of(eng, 1);
	uint64_t used0 = dev_used(eng);

	/* owner 42: an uncommitted writer on 1, a reader on 2, a committed
	 * writer on 3 and a brand-new user 5; owner 7: a reader on 4 */
	struct engine_lease W = prep_ok(eng, 1, 5, 8, 42);
	write_lease(eng, &W, 1, 0, 8);
	struct engine_lease R = prep_ok(eng, 2, 5, 0, 42);
	struct engine_lease C = prep_ok(eng, 3, 5, 4, 42);
	write_lease(eng, &C, 3, 0, 4);
	commit_ok(eng, C.id, 4);
	struct engine_lease N = prep_ok(eng, 5, 0, 6, 42);
	struct engine_lease O = prep_ok(eng, 4, 5, 0, 7);
	assert_int_equal(stats_of(eng).leases, 5);

	assert_int_equal(engine_release_owner(eng, 42), 4);
	CHECK(eng);
	struct engine_user_info a1 = info_of(eng, 1);
	assert_info_same(&i1, &a1);
	assert_int_equal(info_of(eng, 2).leases, 0);
	assert_int_equal(info_of(eng, 3).len, 9);
	assert_int_equal(info_of(eng, 3).leases, 0);
	assert_false(info_of(eng, 5).exists);
	assert_int_equal(info_of(eng, 4).leases, 1);
	assert_int_equal(stats_of(eng).leases, 1);
	assert_int_equal(dev_used(eng), used0 + 1); /* user 3 grew by a page */
	struct errbuf e;
	assert_int_equal(engine_release(eng, W.id, &e), -ENOENT);
	assert_int_equal(engine_release(eng, R.id, &e), -ENOENT);
	assert_int_equal(engine_commit(eng, N.id, 1, &e), -ENOENT);
	CHECK(eng);

	/* nothing left for 42; user 1 is writable again */
	assert_int_equal(engine_release_owner(eng, 42), 0);
	put(eng, 1, 5, 1);
	assert_int_equal(engine_release_owner(eng, 7), 1);
	assert_int_equal(stats_of(eng).leases, 0);
	assert_int_equal(engine_release(eng, O.id, &e), -ENOENT);
	CHECK(eng);
	verify(eng, 1, 0, 6);
	verify(eng, 3, 0, 9);
	drop_engine();
}

static void test_counters_track_operations(void **state)
{
	struct engine *eng = mk_engine(32, 0, 0);
	struct kvp_stats s;

	(void)state;
	s = stats_of(eng);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_total, 32);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 0);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_free, 32);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].bytes_total, 32 * 1024);
	assert_int_equal(s.tier[KVP_TIER_HOST].frames_total, 0);
	assert_int_equal(s.users, 0);
	assert_int_equal(s.leases, 0);
	assert_int_equal(s.prepares, 0);

	struct engine_lease A = prep_ok(eng, 1, 0, 10, OWNER);
	s = stats_of(eng);
	assert_int_equal(s.prepares, 1);
	assert_int_equal(s.hit_tokens, 0);
	assert_int_equal(s.leases, 1);
	assert_int_equal(s.users, 1);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used, 3);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_free, 29);
	commit_ok(eng, A.id, 10);
	s = stats_of(eng);
	assert_int_equal(s.commits, 1);
	assert_int_equal(s.committed_tokens, 10);
	release_ok(eng, A.id);
	s = stats_of(eng);
	assert_int_equal(s.releases, 1);
	assert_int_equal(s.leases, 0);
	assert_int_equal(s.users, 1);

	/* hit_tokens == cached len at each prepare */
	struct engine_lease R = prep_ok(eng, 1, 10, 0, OWNER);
	assert_int_equal(R.hit_tokens, 10);
	s = stats_of(eng);
	assert_int_equal(s.prepares, 2);
	assert_int_equal(s.hit_tokens, 10);
	assert_int_equal(s.leases, 1);
	release_ok(eng, R.id);
	struct engine_lease B = prep_ok(eng, 1, 10, 3, OWNER);
	assert_int_equal(B.hit_tokens, 10);
	s = stats_of(eng);
	assert_int_equal(s.prepares, 3);
	assert_int_equal(s.hit_tokens, 20);
	assert_int_equal(s.leases, 1);
	assert_int_equal(s.releases, 2);
	commit_ok(eng, B.id, 2);
	s = stats_of(eng);
	assert_int_equal(s.commits, 2);
	assert_int_equal(s.committed_tokens, 12);
	release_ok(eng, B.id);

	struct engine_lease C = prep_ok(eng, 2, 0, 4, OWNER);
	s = stats_of(eng);
	assert_int_equal(s.users, 2);
	assert_int_equal(s.hit_tokens, 20);
	release_ok(eng, C.id); /* rolled back: user 2 gone */
	s = stats_of(eng);
	assert_int_equal(s.prepares, 4);
	assert_int_equal(s.commits, 2);
	assert_int_equal(s.releases, 4);
	assert_int_equal(s.committed_tokens, 12);
	assert_int_equal(s.users, 1);
	assert_int_equal(s.leases, 0);

	struct engine_lease D = prep_ok(eng, 1, 12, 0, OWNER);
	assert_int_equal(D.hit_tokens, 12);
	release_ok(eng, D.id);
	s = stats_of(eng);
	assert_int_equal(s.hit_tokens, 32);
	assert_int_equal(s.prepares, 5);
	assert_int_equal(s.releases, 5);
	assert_int_equal(s.evicted_users, 0);
	assert_int_equal(s.trimmed_pages, 0);
	assert_int_equal(s.tier[KVP_TIER_DEVICE].frames_used +
			 s.tier[KVP_TIER_DEVICE].frames_free, 32);
	drop_engine();
}

static void test_create_rejects_bad_config(void **state)
{
	struct engine_config cfg;
	struct engine *eng = NULL;
	struct errbuf e;

	(void)state;
	memset(&cfg, 0, sizeof(cfg));
	assert_int_equal(kvp_layout_init(&cfg.layout, 2, 2, 8, KVP_DTYPE_FP32, PT,
					 e.msg, sizeof(e.msg)), 0);
	cfg.device_frames = 0;
	e.msg[0] = '\0';
	assert_int_equal(engine_create(&eng, &cfg, &e), -EINVAL);
	assert_true(e.msg[0] != '\0');
	/* max_tokens_per_user below one page */
	cfg.device_frames = 4;
	cfg.max_tokens_per_user = PT - 1;
	e.msg[0] = '\0';
	assert_int_equal(engine_create(&eng, &cfg, &e), -EINVAL);
	assert_true(e.msg[0] != '\0');
	/* a broken layout */
	cfg.max_tokens_per_user = 0;
	cfg.layout.page_tokens = 3;
	eng = NULL;
	int rc = engine_create(&eng, &cfg, &e);
	if (rc == 0)
		g_eng = eng;
	assert_int_equal(rc, -EINVAL);
	/* host 0 is fine */
	cfg.layout.page_tokens = PT;
	assert_int_equal(engine_create(&eng, &cfg, &e), 0);
	g_eng = eng;
	CHECK(eng);
	drop_engine();
}

static void test_destroy_with_live_leases(void **state)
{
	/* no leak (ASan) and no crash when leases are still out */
	struct engine *eng = mk_engine(8, 4, 0);

	(void)state;
	put(eng, 1, 0, 5);
	(void)prep_ok(eng, 1, 5, 0, OWNER);
	(void)prep_ok(eng, 1, 5, 3, OWNER);
	(void)prep_ok(eng, 2, 0, 4, OWNER);
	drop_engine();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_prepare_contiguous_input_is_accepted, teardown),
		cmocka_unit_test_teardown(test_prepare_gap_reports_missing_range, teardown),
		cmocka_unit_test_teardown(test_prepare_overlap_reports_overlapping_range, teardown),
		cmocka_unit_test_teardown(test_prepare_new_user_accepts_any_start, teardown),
		cmocka_unit_test_teardown(test_prepare_position_overflow_is_einval, teardown),
		cmocka_unit_test_teardown(test_prepare_second_writer_is_ebusy_readers_allowed, teardown),
		cmocka_unit_test_teardown(test_reader_release_keeps_concurrent_writer_commit, teardown),
		cmocka_unit_test_teardown(test_reader_release_keeps_pending_reservation, teardown),
		cmocka_unit_test_teardown(test_reader_commit_zero_changes_nothing, teardown),
		cmocka_unit_test_teardown(test_prepare_busy_new_user, teardown),
		cmocka_unit_test_teardown(test_commit_partial_returns_unused_pages, teardown),
		cmocka_unit_test_teardown(test_commit_zero_gives_back_everything, teardown),
		cmocka_unit_test_teardown(test_commit_and_release_errors, teardown),
		cmocka_unit_test_teardown(test_release_without_commit_rolls_back, teardown),
		cmocka_unit_test_teardown(test_lease_frames_and_slots_are_consistent, teardown),
		cmocka_unit_test_teardown(test_bytes_written_through_slots_read_back, teardown),
		cmocka_unit_test_teardown(test_head_trim_past_max_tokens, teardown),
		cmocka_unit_test_teardown(test_prepare_oom_changes_nothing, teardown),
		cmocka_unit_test_teardown(test_prepare_oom_partial_pin, teardown),
		cmocka_unit_test_teardown(test_prepare_more_pages_than_tier_is_e2big, teardown),
		cmocka_unit_test_teardown(test_release_owner_releases_and_rolls_back, teardown),
		cmocka_unit_test_teardown(test_counters_track_operations, teardown),
		cmocka_unit_test_teardown(test_create_rejects_bad_config, teardown),
		cmocka_unit_test_teardown(test_destroy_with_live_leases, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
