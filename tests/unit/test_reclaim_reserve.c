/* SPDX-License-Identifier: MIT */
/*
 * test_reclaim_reserve - the device pool's low watermark is a reserve for
 * prepares without an onload (daemon/engine/engine.c, prepare_waits()).
 *
 * One shard with the background reclaimer on (shard.h), a device tier of
 * 64 frames (low watermark 4, high 8), a host tier that holds all of them,
 * and the daemon's prepare flags:
 *  - a prepare that would onload, with 6 frames free, waits (-EINPROGRESS,
 *    a stall counted, nothing changed) rather than leave 3 < 4 free;
 *  - a prepare of new tokens in the same state takes its 3 frames at once;
 *  - the waiting prepare, retried, succeeds once the reclaimer has freed
 *    room, and reads back the bytes it wrote before it was demoted;
 *  - without ENGINE_PREPARE_WAIT_RECLAIM (the worker's last try, after
 *    RECLAIM_WAIT_NS) an onload dips into the reserve instead of waiting;
 *  - a stall raises the device watermarks (the boost), which decay after
 *    200 ms without one (shard_set_config.boost); without it they stay fixed.
 * The reclaimer runs only when kicked (the engine never hints it; ops.c
 * does), so the state before each call is exact.
 */
#include <errno.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine_helpers.h"
#include "errbuf.h"
#include "shard.h"
#include "tier.h"

#define DEV 64u
/* Room for every device page: a reclaimer round (RECLAIM_BATCH pages) may
 * demote the whole device tier, and the host pass must not drop X. */
#define HOST 1024u
#define X 7u            /* the user whose 3 pages go to the host tier */
#define WAIT (ENGINE_PREPARE_WAIT_RECLAIM | ENGINE_PREPARE_COUNT)

static struct shard_set *g_set;
static bool g_boost; /* shard_set_config.boost of the next set */
static bool g_locked; /* a failed assert leaves shard 0 locked */

static struct engine *lock0(void)
{
	struct engine *eng = shard_lock(g_set, 0);

	g_locked = true;
	return eng;
}

static void unlock0(void)
{
	g_locked = false;
	shard_unlock(g_set, 0);
}

static int set_teardown(void **state)
{
	(void)state;
	if (g_set && g_locked)
		unlock0(); /* or the reclaimer's join below waits forever */
	if (g_set)
		shard_set_destroy(g_set);
	g_set = NULL;
	g_boost = false;
	return 0;
}

/* A one-shard set, its engine locked, with X's 12 tokens on the host only
 * and the device pool holding exactly `free_frames` free frames. */
static struct engine *setup_pool(uint32_t free_frames)
{
	struct shard_set_config sc = { .shards = 1, .reclaim = RECLAIM_ON,
				       .boost = g_boost };
	struct errbuf e = { .msg = "" };
	struct engine *eng;
	uint64_t u = 100;

	test_layout(&sc.ec.layout);
	sc.ec.device_frames = DEV;
	sc.ec.host_frames = HOST;
	if (shard_set_create(&g_set, &sc, &e))
		fail_msg("shard_set_create: %s", e.msg);
	assert_int_equal(g_set->rc.low[KVP_TIER_DEVICE], 4);
	eng = lock0();
	put(eng, X, 0, 3 * PT);
	if (engine_evict(eng, X, KVP_SEL_DEVICE, &e) != 3)
		fail_msg("demote X: %s", e.msg);
	assert_int_equal(info_of(eng, X).pages_device, 0);
	assert_int_equal(info_of(eng, X).pages_host, 3);
	while (DEV - dev_used(eng) > free_frames)
		put(eng, u++, 0, PT);
	CHECK(eng);
	return eng;
}

/* Free device frames: the pool's and the shard's cache. */
static uint64_t dev_free(struct engine *eng)
{
	struct kvp_stats st;

	engine_stats(eng, &st);
	return frame_pool_free(g_set->pool[KVP_TIER_DEVICE]) +
	       st.tier[KVP_TIER_DEVICE].frames_free;
}

static uint64_t stalls(struct engine *eng)
{
	struct kvp_stats st;

	engine_stats(eng, &st);
	return st.reclaim_stalls;
}

static void onload_waits_for_the_reclaimer_plain_prepare_does_not(void **state)
{
	struct engine *eng = setup_pool(6);
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct engine_snap before = snap_of(eng, X);
	struct timespec ms = { 0, 1000000 };
	int rc, tries = 0;

	(void)state;
	/* X's 3 pages would leave 3 free, under the low watermark of 4. */
	rc = engine_prepare_flags(eng, X, 3 * PT, 0, OWNER, WAIT, &L, &e);
	assert_int_equal(rc, -EINPROGRESS);
	assert_msg_has(&e, "waiting for the reclaimer");
	/* The typed wait says whose (tier.h), once. */
	assert_int_equal(engine_wait_take(), ENGINE_WAIT_RECLAIM);
	assert_int_equal(engine_wait_take(), ENGINE_DONE);
	before.stats.reclaim_stalls++;
	before.stats.reclaim_onload_stalls++;
	/* Its frames may have moved from the pool to the shard's cache
	 * (frames.h): still free, none used. */
	assert_int_equal(dev_free(eng), 6);
	before.stats.tier[KVP_TIER_DEVICE].frames_free =
		stats_of(eng).tier[KVP_TIER_DEVICE].frames_free;
	assert_unchanged(eng, &before);

	/* New tokens of another user take 3 of the 6 at once. */
	rc = engine_prepare_flags(eng, 1, 0, 3 * PT, OWNER, WAIT, &L, &e);
	if (rc)
		fail_msg("plain prepare waited or failed: %d %s", rc, e.msg);
	assert_int_equal(L.onloaded_pages, 0);
	write_commit_release(eng, &L, 1, 3 * PT);
	CHECK(eng);
	unlock0();

	/* The reclaimer was kicked: X gets its pages once it made room. */
	for (;;) {
		eng = lock0();
		rc = engine_prepare_flags(eng, X, 3 * PT, 0, OWNER,
					  ENGINE_PREPARE_WAIT_RECLAIM, &L, &e);
		if (rc != -EINPROGRESS)
			break;
		unlock0();
		assert_true(++tries < 5000); /* 5 s */
		nanosleep(&ms, NULL);
	}
	if (rc)
		fail_msg("onload after the reclaimer ran: %d %s", rc, e.msg);
	assert_int_equal(L.onloaded_pages, 3);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	verify(eng, X, 0, 3 * PT);
	verify(eng, 1, 0, 3 * PT);
	CHECK(eng);
	unlock0();
}

static void last_try_takes_the_reserve(void **state)
{
	struct engine *eng = setup_pool(6);
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint64_t s0 = stalls(eng);
	int rc;

	(void)state;
	rc = engine_prepare_flags(eng, X, 3 * PT, 0, OWNER, ENGINE_PREPARE_COUNT,
				  &L, &e);
	if (rc)
		fail_msg("onload without the wait flag: %d %s", rc, e.msg);
	assert_int_equal(L.onloaded_pages, 3);
	assert_int_equal(stalls(eng), s0);
	assert_int_equal(dev_free(eng), 3);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	verify(eng, X, 0, 3 * PT);
	CHECK(eng);
	unlock0();
}

static void onload_above_the_reserve_does_not_wait(void **state)
{
	struct engine *eng = setup_pool(7);
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint64_t s0 = stalls(eng);
	int rc;

	(void)state;
	/* 7 - 3 = 4 free after it: exactly the watermark, no wait. */
	rc = engine_prepare_flags(eng, X, 3 * PT, 0, OWNER, WAIT, &L, &e);
	if (rc)
		fail_msg("onload with room to spare: %d %s", rc, e.msg);
	assert_int_equal(stalls(eng), s0);
	engine_fence_wait(eng, L.fence);
	release_ok(eng, L.id);
	CHECK(eng);
	unlock0();
}

static uint32_t boost(void)
{
	return __atomic_load_n(&g_set->rc.boost, __ATOMIC_RELAXED);
}

/* Waits until the reclaimer is idle (woken flag down). */
static void reclaimer_idle(void)
{
	struct timespec ms = { 0, 1000000 };
	int tries = 0;

	while (__atomic_load_n(&g_set->rc.wake, __ATOMIC_RELAXED)) {
		assert_true(++tries < 5000);
		nanosleep(&ms, NULL);
	}
}

/*
 * Staying ahead (shard.h): a stall raises the device watermarks by what
 * the waiting prepare needs (3 pages; a quarter of low is 1), a hint then
 * wakes the reclaimer at low + boost, and its pass frees up to high +
 * boost; a pass more than RECLAIM_BOOST_DECAY_NS (200 ms) after the last
 * stall halves the boost. Only the first try of a prepare counts: its
 * retries do not raise it again. Without shard_set_config.boost (kvpoold's
 * default, reclaim_boost = no) the watermarks stay where they are.
 */
static void a_stall_raises_the_watermarks_then_they_decay(void **state)
{
	struct timespec quarter = { 0, 250000000 };
	struct engine *eng;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	int rc;

	(void)state;
	g_boost = true;
	eng = setup_pool(6);
	assert_int_equal(boost(), 0);
	rc = engine_prepare_flags(eng, X, 3 * PT, 0, OWNER, WAIT, &L, &e);
	assert_int_equal(rc, -EINPROGRESS);
	assert_int_equal(engine_wait_take(), ENGINE_WAIT_RECLAIM);
	assert_int_equal(boost(), 3);
	/* A retry (no COUNT flag) waits without raising it again. */
	rc = engine_prepare_flags(eng, X, 3 * PT, 0, OWNER,
				  ENGINE_PREPARE_WAIT_RECLAIM, &L, &e);
	if (rc == -EINPROGRESS)
		assert_int_equal(engine_wait_take(), ENGINE_WAIT_RECLAIM);
	else if (rc == 0)
		release_ok(eng, L.id);
	else
		fail_msg("retry: %d %s", rc, e.msg);
	assert_int_equal(boost(), 3);
	unlock0();
	reclaimer_idle();
	/* Its pass freed beyond the plain high watermark of 8. */
	assert_true(dev_free(lock0()) >= 8 + 3);
	unlock0();
	nanosleep(&quarter, NULL);
	assert_true(shard_reclaim_kick(g_set, 1));
	reclaimer_idle();
	assert_int_equal(boost(), 1);
	CHECK(lock0());
	unlock0();
}

static void without_boost_the_watermarks_stay(void **state)
{
	struct engine *eng;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };

	(void)state;
	eng = setup_pool(6); /* shard_set_config.boost off, the default */
	assert_int_equal(engine_prepare_flags(eng, X, 3 * PT, 0, OWNER, WAIT, &L, &e),
			 -EINPROGRESS);
	assert_int_equal(engine_wait_take(), ENGINE_WAIT_RECLAIM);
	assert_int_equal(stalls(eng), 1);
	assert_int_equal(boost(), 0);
	unlock0();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(onload_waits_for_the_reclaimer_plain_prepare_does_not,
					  set_teardown),
		cmocka_unit_test_teardown(last_try_takes_the_reserve, set_teardown),
		cmocka_unit_test_teardown(onload_above_the_reserve_does_not_wait,
					  set_teardown),
		cmocka_unit_test_teardown(a_stall_raises_the_watermarks_then_they_decay,
					  set_teardown),
		cmocka_unit_test_teardown(without_boost_the_watermarks_stay, set_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
