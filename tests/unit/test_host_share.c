/* SPDX-License-Identifier: MIT */
/*
 * test_host_share - one host tier shared by the shard sets of two pools
 * (daemon/engine/include/shard.h, issue 31: `devices = all` makes a pool
 * per GPU, and host memory is the host's, not a GPU's).
 *
 * Set A owns the host tier; set B is made with host_of = A. On the shm
 * backend, one shard each:
 *  - both sets allocate from one frame pool and one memory: histories
 *    demoted in A and in B take distinct frames, their bytes read back
 *    intact, stats count each pool's pages and the shared tier's free
 *    frames, and A's check accounts for every frame of both (and names
 *    the two sets when a frame is marked in both);
 *  - a shared host tier run full by A is freed by B's reclaimer: woken
 *    for B, it drops A's oldest host-only histories (the walk spans every
 *    sharing set), and B's demotion then finds room;
 *  - B destroyed first gives its frames back to A's pool;
 *  - a sharer whose host tier does not match (host_frames) is refused
 *    with the reason, and A is unchanged.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine_helpers.h"
#include "engine_internal.h" /* a shard's frames, to mark one twice */
#include "errbuf.h"
#include "shard.h"

#define DEV 64u   /* device watermarks 4 and 8: never reached here */
#define HOST 8u   /* host watermarks 2 and 4 with RECLAIM_ON */

static struct shard_set *g_a, *g_b;

static struct shard_set *mk_set(struct shard_set *host_of, uint32_t host,
				enum reclaim_mode reclaim, int *rc,
				struct errbuf *e)
{
	struct shard_set_config sc = { .shards = 1, .reclaim = reclaim,
				       .host_of = host_of };
	struct shard_set *s = NULL;

	test_layout(&sc.ec.layout);
	sc.ec.device_frames = DEV;
	sc.ec.host_frames = host;
	*rc = shard_set_create(&s, &sc, e);
	return s;
}

static void mk_pair(enum reclaim_mode reclaim)
{
	struct errbuf e = { .msg = "" };
	int rc;

	g_a = mk_set(NULL, HOST, reclaim, &rc, &e);
	if (rc)
		fail_msg("set A: %s", e.msg);
	g_b = mk_set(g_a, HOST, reclaim, &rc, &e);
	if (rc)
		fail_msg("set B: %s", e.msg);
}

static int pair_teardown(void **state)
{
	(void)state;
	shard_set_destroy(g_b); /* the sharer first (tenant.c's order) */
	shard_set_destroy(g_a);
	g_a = g_b = NULL;
	return 0;
}

/* user's `pages` pages written in s's shard 0 and demoted to the host. */
static void put_on_host(struct shard_set *s, uint64_t user, uint32_t pages)
{
	struct engine *eng = shard_lock(s, 0);
	struct errbuf e = { .msg = "" };

	put(eng, user, 0, pages * PT);
	if (engine_evict(eng, user, KVP_SEL_DEVICE, &e) != (int)pages)
		fail_msg("demote user %" PRIu64 ": %s", user, e.msg);
	assert_int_equal(info_of(eng, user).pages_host, pages);
	shard_unlock(s, 0);
}

static void check_ok(struct shard_set *s)
{
	struct errbuf e = { .msg = "" };

	if (shard_set_check(s, &e))
		fail_msg("shard_set_check: %s", e.msg);
}

static struct kvp_tier_stats host_stats(struct shard_set *s)
{
	struct kvp_stats st;

	shard_set_stats(s, &st);
	return st.tier[KVP_TIER_HOST];
}

static void two_pools_take_distinct_frames_of_one_tier(void **state)
{
	struct kvp_tier_stats a, b;
	struct engine *eng;

	(void)state;
	mk_pair(RECLAIM_OFF);
	assert_ptr_equal(g_b->pool[KVP_TIER_HOST], g_a->pool[KVP_TIER_HOST]);
	assert_ptr_equal(g_b->mem[KVP_TIER_HOST].base, g_a->mem[KVP_TIER_HOST].base);
	assert_ptr_not_equal(g_b->pool[KVP_TIER_DEVICE], g_a->pool[KVP_TIER_DEVICE]);
	assert_int_equal(g_a->sharers.n, 2);

	put_on_host(g_a, 1, 2);
	put_on_host(g_b, 2, 3);
	put_on_host(g_a, 3, 1);
	a = host_stats(g_a);
	b = host_stats(g_b);
	assert_int_equal(a.frames_total, HOST);
	assert_int_equal(b.frames_total, HOST);
	assert_int_equal(a.frames_used, 3);
	assert_int_equal(b.frames_used, 3);
	assert_int_equal(a.frames_free, HOST - 6);
	assert_int_equal(b.frames_free, HOST - 6);
	check_ok(g_a); /* every frame of both sets, none held twice */
	check_ok(g_b);
	{
		/* A frame of A's marked B's too: the owner's check names both. */
		struct frames *fa = &g_a->v[0].eng->frames[KVP_TIER_HOST];
		struct frames *fb = &g_b->v[0].eng->frames[KVP_TIER_HOST];
		struct errbuf e = { .msg = "" };
		uint64_t saved = fb->used[0];

		fb->used[0] |= fa->used[0];
		assert_int_equal(shard_set_check(g_a, &e), -EFAULT);
		assert_msg_has(&e, "of set 0 and shard 0 of set 1");
		fb->used[0] = saved;
		check_ok(g_a);
	}

	/* Bytes on the host tier, read where they are: distinct frames. */
	eng = shard_lock(g_a, 0);
	verify(eng, 1, 0, 2 * PT);
	verify(eng, 3, 0, PT);
	shard_unlock(g_a, 0);
	eng = shard_lock(g_b, 0);
	verify(eng, 2, 0, 3 * PT);
	shard_unlock(g_b, 0);
}

static void a_full_shared_tier_is_freed_by_either_reclaimer(void **state)
{
	struct timespec ms = { 0, 1000000 };
	struct errbuf e = { .msg = "" };
	struct engine *eng;
	int tries = 0, rc;

	(void)state;
	mk_pair(RECLAIM_ON);
	assert_int_equal(g_b->rc.low[KVP_TIER_HOST], 2);
	assert_int_equal(g_b->rc.high[KVP_TIER_HOST], 4);
	/* A fills the whole tier, user 11 oldest. */
	for (uint64_t u = 11; u <= 14; u++)
		put_on_host(g_a, u, 2);
	assert_int_equal(frame_pool_free(g_a->pool[KVP_TIER_HOST]) +
			 host_stats(g_a).frames_free, 0);

	/* B's reclaimer, woken for B (whose histories are all on the device),
	 * frees the shared tier up to its high watermark from A's oldest. */
	shard_reclaim_hint(g_b);
	while (frame_pool_free(g_a->pool[KVP_TIER_HOST]) < 4 && tries++ < 5000)
		nanosleep(&ms, NULL);
	assert_true(frame_pool_free(g_a->pool[KVP_TIER_HOST]) >= 4);
	eng = shard_lock(g_a, 0);
	assert_false(info_of(eng, 11).exists);
	assert_false(info_of(eng, 12).exists);
	verify(eng, 13, 0, 2 * PT);
	verify(eng, 14, 0, 2 * PT);
	shard_unlock(g_a, 0);

	/* B's demotion now finds host frames. */
	eng = shard_lock(g_b, 0);
	put(eng, 21, 0, 2 * PT);
	rc = engine_evict(eng, 21, KVP_SEL_DEVICE, &e);
	shard_unlock(g_b, 0);
	assert_int_equal(rc, 2);
	check_ok(g_a);
	eng = shard_lock(g_b, 0);
	verify(eng, 21, 0, 2 * PT);
	shard_unlock(g_b, 0);
}

static void a_sharer_destroyed_first_gives_its_frames_back(void **state)
{
	(void)state;
	mk_pair(RECLAIM_OFF);
	put_on_host(g_a, 1, 2);
	put_on_host(g_b, 2, 5);
	assert_int_equal(host_stats(g_a).frames_free, HOST - 7);
	shard_set_destroy(g_b);
	g_b = NULL;
	assert_int_equal(g_a->sharers.n, 1);
	assert_int_equal(host_stats(g_a).frames_used, 2);
	assert_int_equal(host_stats(g_a).frames_free, HOST - 2);
	check_ok(g_a);
}

static void a_sharer_that_does_not_match_is_refused(void **state)
{
	struct errbuf e = { .msg = "" };
	struct shard_set *c;
	int rc;

	(void)state;
	mk_pair(RECLAIM_OFF);
	put_on_host(g_a, 1, 2);
	c = mk_set(g_a, HOST * 2, RECLAIM_OFF, &rc, &e);
	assert_int_equal(rc, -EINVAL);
	assert_null(c);
	assert_msg_has(&e, "host_frames in every pool");
	/* A sharer cannot be shared from either. */
	e.msg[0] = '\0';
	c = mk_set(g_b, HOST, RECLAIM_OFF, &rc, &e);
	assert_int_equal(rc, -EINVAL);
	assert_msg_has(&e, "from the set that owns it");
	assert_int_equal(g_a->sharers.n, 2);
	assert_int_equal(host_stats(g_a).frames_used, 2);
	assert_int_equal(host_stats(g_a).frames_free, HOST - 2);
	check_ok(g_a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(two_pools_take_distinct_frames_of_one_tier,
					  pair_teardown),
		cmocka_unit_test_teardown(a_full_shared_tier_is_freed_by_either_reclaimer,
					  pair_teardown),
		cmocka_unit_test_teardown(a_sharer_destroyed_first_gives_its_frames_back,
					  pair_teardown),
		cmocka_unit_test_teardown(a_sharer_that_does_not_match_is_refused,
					  pair_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
