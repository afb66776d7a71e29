/* SPDX-License-Identifier: MIT */
/*
 * test_lease_group.c - group leases of a tensor-parallel engine
 * (daemon/engine/lease_group.c): an engine with tp = 2 on the striped
 * backend over two shm ranks. What is proven, with engine_check() after
 * every step (pins, frames and leases add up):
 *  - a join gets rank 0's page table; refusals (rank 0, a rank past tp,
 *    a double join, a stale id, a sharing id) change nothing;
 *  - commits before the last rank's are pending and change nothing; the
 *    last one commits; unlike counts, a commit past n_new and a second
 *    commit of one rank are refused;
 *  - a release or a dead owner before the group committed rolls the lease
 *    back for every rank: the others' commits answer -ESTALE naming who,
 *    their releases 0, and then no lease is left;
 *  - a rank that committed and releases does not end the group; after the
 *    group committed each release ends one hold, the last one the lease;
 *  - a tp = 1 engine refuses joins;
 *  - a sequence's write lease is a group lease: joined for the same page
 *    table, pending until both ranks committed, refused as a chunk seal;
 *    rank 1's death rolls the extend back for both; rank 0's death after
 *    the group committed frees the sequence and the lease rank 1 held.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "engine.h"
#include "engine_helpers.h"
#include "share.h"

#define R0 11u      /* rank 0's client */
#define R1 12u      /* rank 1's client */
#define U 5u

static void *g_stripe;

static struct engine *mk_tp_engine(void)
{
	struct errbuf e = { .msg = "" };
	struct kvp_layout l;
	struct engine_config cfg = { .device_frames = 8, .host_frames = 8,
				     .backend = &backend_stripe, .tp = 2 };

	test_layout(&l);
	if (!g_stripe)
		assert_int_equal(backend_stripe_open(&backend_shm, NULL, 2,
						     l.page_bytes / 2, &g_stripe,
						     &e), 0);
	cfg.backend_ctx = g_stripe;
	return mk_engine_cfg(&cfg);
}

static int tp_teardown(void **state)
{
	teardown(state);
	backend_stripe_close(g_stripe);
	g_stripe = NULL;
	return 0;
}

static uint64_t hist_len(struct engine *eng)
{
	return info_of(eng, U).len;
}

static struct engine_lease join_ok(struct engine *eng, uint64_t id)
{
	struct errbuf e = { .msg = "" };
	struct engine_lease j;
	int ret = engine_lease_join(eng, id, 1, R1, 1024, &j, &e);

	if (ret)
		fail_msg("join: %d %s", ret, e.msg);
	CHECK(eng);
	return j;
}

static int commit(struct engine *eng, uint64_t id, uint32_t rank, uint32_t n,
		  struct errbuf *e)
{
	bool left;
	int ret = engine_commit_rank(eng, id, rank, rank ? R1 : R0, n, false,
				     &left, e);

	CHECK(eng);
	return ret;
}

static int release(struct engine *eng, uint64_t id, uint32_t rank)
{
	struct errbuf e = { .msg = "" };
	bool left = false;
	int ret = engine_release_rank(eng, id, rank, rank ? R1 : R0, &left, &e);

	CHECK(eng);
	assert_true(ret || left);
	return ret;
}

static void test_join_and_refusals(void **state)
{
	struct engine *eng = mk_tp_engine();
	struct engine_lease l = prep_ok(eng, U, 0, 10, R0), j, x;
	struct errbuf e = { .msg = "" };
	struct engine_snap before;

	assert_int_equal(engine_tp(eng), 2);
	j = join_ok(eng, l.id);
	assert_int_equal(j.id, l.id);
	assert_int_equal(j.npages, 3);
	assert_int_equal(j.n_new, 10);
	l = prep_ok(eng, U + 1, 0, 4, R0); /* another lease: the view moves */
	before = snap_of(eng, U);
	assert_int_equal(engine_lease_join(eng, j.id, 0, R0, 1024, &x, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "rank 0 prepares"));
	assert_int_equal(engine_lease_join(eng, j.id, 2, R1, 1024, &x, &e), -EINVAL);
	assert_int_equal(engine_lease_join(eng, j.id, 1, R1, 1024, &x, &e), -EALREADY);
	assert_int_equal(engine_lease_join(eng, j.id + (1ull << 32), 1, R1, 1024, &x,
					   &e), -ESTALE);
	assert_non_null(strstr(e.msg, "is not held"));
	/* A sharing id: chunk fill leases are joined too (test_tp_chunk); one
	 * that is not held is stale like any other. */
	assert_int_equal(engine_lease_join(eng, j.id | (1ull << 31), 1, R1, 1024, &x,
					   &e), -ESTALE);
	assert_non_null(strstr(e.msg, "is not held"));
	assert_int_equal(engine_lease_join(eng, l.id, 1, R1, 0, &x, &e), -EMSGSIZE);
	assert_unchanged(eng, &before);
	CHECK(eng);
}

static void test_commit_waits_for_every_rank(void **state)
{
	struct engine *eng = mk_tp_engine();
	struct engine_lease l = prep_ok(eng, U, 0, 10, R0);
	struct errbuf e = { .msg = "" };

	join_ok(eng, l.id);
	assert_int_equal(commit(eng, l.id, 1, 11, &e), -EINVAL); /* past n_new */
	assert_int_equal(commit(eng, l.id, 1, 8, &e), ENGINE_COMMIT_PENDING);
	assert_int_equal(hist_len(eng), 0);
	assert_int_equal(commit(eng, l.id, 1, 8, &e), -EALREADY);
	assert_int_equal(commit(eng, l.id, 0, 7, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "every rank commits the same count"));
	/* Another client cannot commit as rank 0. */
	{
		bool left;

		assert_int_equal(engine_commit_rank(eng, l.id, 0, R1, 8, false, &left,
						    &e), -EPERM);
	}
	assert_int_equal(commit(eng, l.id, 0, 8, &e), 0);
	assert_int_equal(hist_len(eng), 8);
	/* After the group committed, each release ends one hold. */
	assert_int_equal(release(eng, l.id, 0), 0);
	assert_int_equal(info_of(eng, U).leases, 1);
	assert_int_equal(release(eng, l.id, 1), 0);
	assert_int_equal(info_of(eng, U).leases, 0);
	assert_int_equal(stats_of(eng).leases, 0);
}

static void test_release_before_commit_ends_the_group(void **state)
{
	struct engine *eng = mk_tp_engine();
	struct engine_lease l = prep_ok(eng, U, 0, 8, R0);
	struct errbuf e = { .msg = "" };
	uint64_t used = dev_used(eng);

	join_ok(eng, l.id);
	assert_int_equal(release(eng, l.id, 1), 0);
	assert_int_equal(info_of(eng, U).leases, 0);   /* unpinned at once */
	assert_true(dev_used(eng) < used);             /* its pages given back */
	assert_int_equal(commit(eng, l.id, 0, 8, &e), -ESTALE);
	assert_non_null(strstr(e.msg, "released (rank 1's client released it) "
				      "before every rank committed; nothing "
				      "changed; prepare again"));
	assert_int_equal(commit(eng, l.id, 0, 8, &e), -ESTALE); /* still */
	assert_int_equal(hist_len(eng), 0);
	assert_int_equal(release(eng, l.id, 0), 0);
	assert_int_equal(stats_of(eng).leases, 0);
	assert_int_equal(release(eng, l.id, 0), -ENOENT);
}

static void test_dead_owner_ends_the_group(void **state)
{
	struct engine *eng = mk_tp_engine();
	struct engine_lease l = prep_ok(eng, U, 0, 8, R0), k;
	struct errbuf e = { .msg = "" };

	join_ok(eng, l.id);
	assert_int_equal(commit(eng, l.id, 1, 8, &e), ENGINE_COMMIT_PENDING);
	/* Rank 0's client dies: its lease goes; rank 1's commit was pending,
	 * so nothing changed. */
	assert_int_equal(engine_release_owner(eng, R0), 1);
	CHECK(eng);
	assert_int_equal(hist_len(eng), 0);
	assert_int_equal(info_of(eng, U).leases, 0);
	assert_int_equal(engine_lease_join(eng, l.id, 1, R1, 1024, &k, &e), -ESTALE);
	assert_non_null(strstr(e.msg, "rank 0's client died"));
	assert_int_equal(commit(eng, l.id, 1, 8, &e), -ESTALE);
	assert_int_equal(stats_of(eng).leases, 1); /* the record rank 1 holds */
	assert_int_equal(release(eng, l.id, 1), 0);
	assert_int_equal(stats_of(eng).leases, 0);
	/* And rank 1's death after the group ended frees the record too. */
	l = prep_ok(eng, U, 0, 8, R0);
	join_ok(eng, l.id);
	assert_int_equal(release(eng, l.id, 0), 0);
	assert_int_equal(stats_of(eng).leases, 1);
	assert_int_equal(engine_release_owner(eng, R1), 1);
	CHECK(eng);
	assert_int_equal(stats_of(eng).leases, 0);
}

static void test_committed_rank_release_keeps_the_group(void **state)
{
	struct engine *eng = mk_tp_engine();
	struct engine_lease l = prep_ok(eng, U, 0, 8, R0);
	struct errbuf e = { .msg = "" };

	join_ok(eng, l.id);
	assert_int_equal(commit(eng, l.id, 0, 8, &e), ENGINE_COMMIT_PENDING);
	assert_int_equal(release(eng, l.id, 0), 0); /* rank 0 is done */
	assert_int_equal(info_of(eng, U).leases, 1);
	assert_int_equal(commit(eng, l.id, 1, 8, &e), 0);
	assert_int_equal(hist_len(eng), 8);
	assert_int_equal(info_of(eng, U).leases, 1); /* rank 1 still holds it */
	assert_int_equal(release(eng, l.id, 1), 0);
	assert_int_equal(stats_of(eng).leases, 0);
	/* The same with the commits' release flag: the last commit frees it. */
	l = prep_ok(eng, U, 8, 4, R0);
	join_ok(eng, l.id);
	{
		bool left = false;

		assert_int_equal(engine_commit_rank(eng, l.id, 1, R1, 4, true, &left,
						    &e), ENGINE_COMMIT_PENDING);
		assert_true(left);
		assert_int_equal(engine_commit_rank(eng, l.id, 0, R0, 4, true, &left,
						    &e), 0);
		assert_true(left);
	}
	CHECK(eng);
	assert_int_equal(hist_len(eng), 12);
	assert_int_equal(stats_of(eng).leases, 0);
}

static struct kvp_seq_info seq_row(struct engine *eng, uint64_t seq)
{
	struct errbuf e = { .msg = "" };
	struct share_seq_state st;

	if (share_seq_info(eng, seq, &st, &e))
		fail_msg("seq_info: %s", e.msg);
	return st.info;
}

static void test_seq_write_lease_is_a_group_lease(void **state)
{
	static const uint32_t tok[6] = { 1, 2, 3, 4, 5, 6 };
	struct engine *eng = mk_tp_engine();
	struct errbuf e = { .msg = "" };
	struct engine_lease l, j;
	uint32_t frames[2];

	assert_int_equal(share_seq_alloc(eng, 9, tok, 6, R0, &l, &e), 0);
	CHECK(eng);
	assert_int_equal(l.npages, 2);
	memcpy(frames, l.frames, sizeof(frames)); /* the view is reused */
	j = join_ok(eng, l.id);
	assert_int_equal(j.npages, 2);
	assert_int_equal(j.len, 0);
	assert_int_equal(j.n_new, 6);
	assert_memory_equal(j.frames, frames, sizeof(frames));
	/* No chunk to seal: refused, nothing changed. */
	assert_int_equal(engine_chunk_seal_rank(eng, l.id, 1, R1, UINT32_MAX, &e),
			 -ENOENT);
	CHECK(eng);
	assert_int_equal(commit(eng, l.id, 0, 6, &e), ENGINE_COMMIT_PENDING);
	assert_int_equal(seq_row(eng, 9).computed, 0);
	assert_int_equal(commit(eng, l.id, 1, 6, &e), 0);
	assert_int_equal(seq_row(eng, 9).computed, 6);

	/* An extend ends the committed lease for both ranks. */
	assert_int_equal(share_seq_extend(eng, 9, 2, NULL, R0, &l, &e), 0);
	CHECK(eng);
	join_ok(eng, l.id);
	assert_int_equal(commit(eng, l.id, 0, 2, &e), ENGINE_COMMIT_PENDING);
	/* Rank 1 dies mid-write: the extend is rolled back for both. */
	assert_int_equal(engine_release_owner(eng, R1), 1);
	CHECK(eng);
	assert_int_equal(seq_row(eng, 9).tokens, 6);
	assert_int_equal(seq_row(eng, 9).write_lease, 0);
	assert_int_equal(commit(eng, l.id, 0, 2, &e), -ESTALE);
	assert_non_null(strstr(e.msg, "rank 1's client died) before every rank "
			       "committed; the sequence kept only the tokens"));
	assert_int_equal(release(eng, l.id, 0), 0);
	assert_int_equal(stats_of(eng).leases, 0);

	/* Rank 0 dies after the group committed: the sequence goes, and the
	 * lease rank 1 still held with it. */
	assert_int_equal(share_seq_extend(eng, 9, 4, NULL, R0, &l, &e), 0);
	join_ok(eng, l.id);
	assert_int_equal(commit(eng, l.id, 1, 4, &e), ENGINE_COMMIT_PENDING);
	assert_int_equal(commit(eng, l.id, 0, 4, &e), 0);
	assert_int_equal(seq_row(eng, 9).computed, 10);
	engine_release_owner(eng, R0);
	CHECK(eng);
	assert_int_equal(stats_of(eng).seqs, 0);
	assert_int_equal(stats_of(eng).leases, 0);
	assert_int_equal(release(eng, l.id, 1), -ENOENT);
}

static void test_tp1_refuses_join(void **state)
{
	struct engine *eng = mk_engine(8, 8, 0);
	struct engine_lease l = prep_ok(eng, U, 0, 4, R0), j;
	struct errbuf e = { .msg = "" };

	assert_int_equal(engine_lease_join(eng, l.id, 1, R1, 1024, &j, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "not tensor-parallel"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_join_and_refusals, tp_teardown),
		cmocka_unit_test_teardown(test_commit_waits_for_every_rank, tp_teardown),
		cmocka_unit_test_teardown(test_release_before_commit_ends_the_group,
					  tp_teardown),
		cmocka_unit_test_teardown(test_dead_owner_ends_the_group, tp_teardown),
		cmocka_unit_test_teardown(test_committed_rank_release_keeps_the_group,
					  tp_teardown),
		cmocka_unit_test_teardown(test_seq_write_lease_is_a_group_lease,
					  tp_teardown),
		cmocka_unit_test_teardown(test_tp1_refuses_join, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
