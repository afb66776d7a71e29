/* SPDX-License-Identifier: MIT */
/*
 * test_remote_user.c - user histories in the remote tier
 * (remote_user_histories = yes; daemon/remote/remote_user.c) under two
 * engines, each with a remote tier of its own (two daemons' pools), over
 * one Redis Cluster of three redis-server processes on loopback: engine
 * A's history dropped by its reclaimer is written behind; engine B's
 * prepare of the same user is held (-EINPROGRESS) while the record and its
 * pages are fetched, then onloads the same tokens, byte for byte. With the
 * setting off nothing of a history is written; a page of another snapshot
 * in the store, a record DELeted by an explicit eviction, a store node
 * killed: each is a miss (an empty history), counted, in bounded time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "disk_engine.h"
#include "backend.h"
#include "clock.h"
#include "disk_record.h"
#include "disk_tier.h"
#include "engine_helpers.h"
#include "engine_internal.h"
#include "redis_cluster.h"
#include "redis_local.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "remote_value.h"
#include "shard.h"
#include "share.h"

#define NTOK (5 * PT + 2) /* five full pages and two tokens: six pages */
#define TENANT 7

static struct redis_local g_redis;
static struct remote_tier *g_rta, *g_rtb; /* A's and B's, histories on */
static struct engine *g_a, *g_b;

/* A remote tier over the test's cluster; queue_pages 0: the default queue. */
static struct remote_tier *tier_open(bool user_histories, uint32_t queue_pages)
{
	struct remote_tier_config c = { .timeout_ms = 300,
					.user_histories = user_histories };
	struct remote_tier *rt = NULL;
	struct errbuf e;

	test_layout(&c.layout);
	c.queue_bytes = queue_pages * c.layout.page_bytes;
	c.url = g_redis.url;
	if (remote_tier_open(&rt, &c, &e))
		fail_msg("remote_tier_open: %s", e.msg);
	return rt;
}

static int setup(void **state)
{
	int ret = redis_local_start(&g_redis, 3);

	(void)state;
	if (ret == 77)
		exit(77);
	if (ret)
		return ret;
	g_rta = tier_open(true, 0);
	g_rtb = tier_open(true, 0);
	return 0;
}

static int teardown_all(void **state)
{
	(void)state;
	remote_tier_close(g_rta);
	remote_tier_close(g_rtb);
	redis_local_stop(&g_redis);
	return 0;
}

/* An engine over rt, with a disk tier (or NULL) on a backend (NULL: shm). */
static struct engine *engine_with(struct remote_tier *rt, struct disk_tier *dt,
				  const struct backend_ops *be)
{
	struct engine_config cfg = { .device_frames = 32, .host_frames = 16,
				     .disk_tenant = TENANT, .remote = rt, .disk = dt,
				     .backend = be };
	struct engine *eng = NULL;
	struct errbuf e;

	test_layout(&cfg.layout);
	if (engine_create(&eng, &cfg, &e))
		fail_msg("engine_create: %s", e.msg);
	return eng;
}

static struct engine *engine_on(struct remote_tier *rt)
{
	return engine_with(rt, NULL, NULL);
}

/* The engines of a test, destroyed even when it fails. */
static int teardown_engines(void **state)
{
	(void)state;
	engine_destroy(g_a);
	engine_destroy(g_b);
	g_a = g_b = NULL;
	return 0;
}

/* Keys in the store, every node. */
static long long store_keys(void)
{
	long long n = 0;

	for (int i = 0; i < g_redis.n; i++) {
		redisReply *r;

		if (!g_redis.pid[i])
			continue;
		r = redis_local_cmd(&g_redis, i, "DBSIZE");
		assert_non_null(r);
		assert_int_equal(r->type, REDIS_REPLY_INTEGER);
		n += r->integer;
		freeReplyObject(r);
	}
	return n;
}

/* The key of user's page (or REMOTE_PAGE_REC) and the node holding it. */
static int user_key(struct engine *eng, uint64_t user, uint32_t page, char *key)
{
	struct remote_key k = { .kind = DISK_KIND_USER, .tenant = TENANT,
				.page = page };

	k.layout_id = disk_layout_id(engine_layout(eng));
	memcpy(k.hash, &user, 8);
	remote_key_format(&k, key);
	/* redis_local splits the slots evenly, in node order. */
	return (int)(redis_cluster_slot(key, strlen(key)) * (uint32_t)g_redis.n / RC_SLOTS);
}

/* user's history on eng dropped by the reclaimer: demoted to the host
 * tier, dropped from there; then written to the store. */
static void reclaim(struct engine *eng, struct remote_tier *rt, uint64_t user)
{
	struct engine_user_info in = info_of(eng, user);
	struct errbuf e = { .msg = "" };

	assert_true(in.exists);
	assert_true(engine_evict(eng, user, KVP_SEL_DEVICE, &e) > 0);
	assert_int_equal(info_of(eng, user).pages_host, in.pages);
	assert_true(engine_reclaim_host(eng, UINT32_MAX) >= in.pages);
	in = info_of(eng, user);
	assert_int_equal(in.pages_device + in.pages_host, 0);
	assert_true(!in.exists || in.pages_disk); /* only on disk, if anywhere */
	CHECK(eng);
	remote_tier_flush(rt);
}

/* user's history written on eng (the pattern of tokens [0, n)), then
 * dropped by the reclaimer. */
static void compute_and_reclaim(struct engine *eng, struct remote_tier *rt,
				uint64_t user, uint32_t n)
{
	put(eng, user, 0, n);
	reclaim(eng, rt, user);
}

/* A prepare as a ring worker makes it (held and retried while the store is
 * asked), bounded; *held: it was held at least once. */
static struct engine_lease prep_held(struct engine *eng, uint64_t user, uint64_t pos,
				     uint32_t n, bool *held)
{
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint64_t t0 = mono_ns();
	int rc;

	*held = false;
	while ((rc = engine_prepare_flags(eng, user, pos, n, OWNER,
					  ENGINE_PREPARE_DEFER, &L, &e)) == -EINPROGRESS) {
		/* The remote tier's round, or the disk tier's read: the typed
		 * wait names which (tier.h), as the message does. */
		enum engine_wait why = engine_wait_take();

		assert_non_null(strstr(e.msg, " tier"));
		assert_true(why == ENGINE_WAIT_REMOTE || why == ENGINE_WAIT_DISK);
		assert_non_null(strstr(e.msg, why == ENGINE_WAIT_REMOTE ?
				       "remote tier" : "disk tier"));
		*held = true;
		usleep(1000);
		/* Two rounds of at most the timeout (300 ms) each. */
		assert_true(mono_ns() - t0 < 3000000000ull);
	}
	if (rc)
		fail_msg("engine_prepare_flags(user %" PRIu64 "): %d: %s", user, rc, e.msg);
	CHECK(eng);
	return L;
}

static void test_b_gets_a_history_byte_for_byte(void **state)
{
	struct remote_tier_stats sa0, sa, sb0, sb;
	struct engine_lease L;
	bool held;

	(void)state;
	g_a = engine_on(g_rta);
	g_b = engine_on(g_rtb);
	remote_tier_stats(g_rta, &sa0);
	compute_and_reclaim(g_a, g_rta, 11, NTOK);
	remote_tier_stats(g_rta, &sa);
	assert_int_equal(sa.user_puts - sa0.user_puts, 1);
	/* Six pages and the record, all taken by the store. */
	assert_int_equal(sa.put_pages - sa0.put_pages, NTOK / PT + 2);
	assert_int_equal(sa.written_pages - sa0.written_pages, NTOK / PT + 2);

	remote_tier_stats(g_rtb, &sb0);
	L = prep_held(g_b, 11, NTOK, 0, &held);
	assert_true(held);
	assert_int_equal(L.start, 0);
	assert_int_equal(L.len, NTOK);
	assert_int_equal(L.npages, NTOK / PT + 1);
	release_ok(g_b, L.id);
	verify(g_b, 11, 0, NTOK);
	remote_tier_stats(g_rtb, &sb);
	assert_int_equal(sb.user_fetched - sb0.user_fetched, 1);
	assert_int_equal(sb.bad_values - sb0.bad_values, 0);
	/* Two rounds: the record, then its six pages. */
	assert_int_equal(sb.fetch_pages - sb0.fetch_pages, 1 + NTOK / PT + 1);
	/* Dropped again unchanged: the store has it, nothing is written. */
	reclaim(g_b, g_rtb, 11);
	remote_tier_stats(g_rtb, &sb);
	assert_int_equal(sb.user_puts - sb0.user_puts, 0);
	assert_int_equal(sb.put_pages - sb0.put_pages, 0);
	L = prep_held(g_b, 11, NTOK, 0, &held);
	assert_true(held);
	assert_int_equal(L.len, NTOK);
	release_ok(g_b, L.id);
	/* B goes on from there as with any history of its own, and what it
	 * wrote is written when the history is dropped. */
	put(g_b, 11, NTOK, 3);
	verify(g_b, 11, 0, NTOK + 3);
	reclaim(g_b, g_rtb, 11);
	remote_tier_stats(g_rtb, &sb);
	assert_int_equal(sb.user_puts - sb0.user_puts, 1);
	L = prep_held(g_a, 11, NTOK + 3, 0, &held);
	assert_int_equal(L.len, NTOK + 3);
	release_ok(g_a, L.id);
	verify(g_a, 11, 0, NTOK + 3);
	CHECK(g_a);
	CHECK(g_b);
}

/* A sequence made from a user only in the store (KVP_SRC_USER): held while
 * the store is asked, then made of the history brought back. */
static void test_seq_create_of_a_user_in_the_store(void **state)
{
	struct kvp_seq_src src = { .kind = KVP_SRC_USER, .id = 13 };
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	int rc, rounds = 0;

	(void)state;
	g_a = engine_on(g_rta);
	g_b = engine_on(g_rtb);
	compute_and_reclaim(g_a, g_rta, 13, NTOK);
	while ((rc = share_seq_create(g_b, 5, &src, 1, 0, OWNER, &L, &e)) == -EINPROGRESS) {
		assert_non_null(strstr(e.msg, "remote tier"));
		usleep(1000);
		assert_true(++rounds < 3000);
	}
	if (rc)
		fail_msg("share_seq_create: %d: %s", rc, e.msg);
	assert_true(rounds > 0);
	assert_int_equal(L.len, NTOK);
	CHECK(g_b);
	assert_int_equal(share_seq_free(g_b, 5, OWNER, &e), 0);
	verify(g_b, 13, 0, NTOK);
}

/* A's own history, asked for again right after eviction dropped it, while
 * its write may still be queued: the prepare waits for the write, then
 * gets the history back whole (never the store's older copy, or none). */
static void test_own_history_back_right_after_eviction(void **state)
{
	struct remote_tier_stats s0, s;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	bool held;

	(void)state;
	g_a = engine_on(g_rta);
	compute_and_reclaim(g_a, g_rta, 14, NTOK); /* an older snapshot there */
	L = prep_held(g_a, 14, NTOK, 3, &held);
	write_commit_release(g_a, &L, 14, 3);
	remote_tier_stats(g_rta, &s0);
	assert_true(engine_evict(g_a, 14, KVP_SEL_DEVICE, &e) > 0);
	assert_true(engine_reclaim_host(g_a, UINT32_MAX) > 0);
	L = prep_held(g_a, 14, NTOK + 3, 0, &held);
	assert_true(held);
	assert_int_equal(L.len, NTOK + 3);
	release_ok(g_a, L.id);
	verify(g_a, 14, 0, NTOK + 3);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_fetched - s0.user_fetched, 1);
}

static uint32_t expand_none(const struct remote_key *rec, const void *val,
			    uint64_t page_bytes, uint8_t hash[32])
{
	(void)rec, (void)val, (void)page_bytes, (void)hash;
	return 0;
}

/* The tier itself: a record written (or DELeted) after it was fetched makes
 * that fetch stale: never handed out, the next ask reads the new one. */
static void test_a_record_written_makes_its_fetch_stale(void **state)
{
	struct remote_key k = { .kind = DISK_KIND_USER, .tenant = TENANT,
				.page = REMOTE_PAGE_REC };
	struct remote_fetch *f = NULL;
	char rec[16] = "old record";

	(void)state;
	k.layout_id = 99;
	k.hash[0] = 0x61;
	assert_int_equal(remote_tier_put_rec(g_rta, &k, rec, sizeof(rec)), 0);
	remote_tier_flush(g_rta);
	assert_int_equal(remote_tier_fetch_rec(g_rta, &k, expand_none, 8, &f), -EINPROGRESS);
	remote_tier_wait(g_rta, &k);
	/* Done, not taken yet: then written again. */
	memcpy(rec, "new record", 11);
	assert_int_equal(remote_tier_put_rec(g_rta, &k, rec, sizeof(rec)), 0);
	/* Pending now, or written already: the remote thread may take it at
	 * once (it did under ASan on a loaded machine), so not asserted. */
	remote_tier_flush(g_rta);
	assert_false(remote_tier_put_pending(g_rta, &k));
	assert_int_equal(remote_tier_fetch_rec(g_rta, &k, expand_none, 8, &f), -EINPROGRESS);
	remote_tier_wait(g_rta, &k);
	assert_int_equal(remote_tier_fetch_rec(g_rta, &k, expand_none, 8, &f), 0);
	assert_int_equal(remote_fetch_pages(f), 1);
	assert_string_equal(remote_fetch_page(f, 0), "new record");
	remote_fetch_done(g_rta, f, 0);
	/* A DEL the same way: the fetch done before it is not handed out. */
	assert_int_equal(remote_tier_fetch_rec(g_rta, &k, expand_none, 8, &f), -EINPROGRESS);
	remote_tier_wait(g_rta, &k);
	assert_int_equal(remote_tier_del(g_rta, &k), 0);
	remote_tier_flush(g_rta);
	assert_int_equal(remote_tier_fetch_rec(g_rta, &k, expand_none, 8, &f), -EINPROGRESS);
	remote_tier_wait(g_rta, &k);
	assert_int_equal(remote_tier_fetch_rec(g_rta, &k, expand_none, 8, &f), 0);
	assert_int_equal(remote_fetch_pages(f), 0);
	remote_fetch_done(g_rta, f, 0);
}

/* With a disk tier too: a dropped history goes to both; a prepare on the
 * same node reads the disk's copy (no store round); the disk selection's
 * eviction deletes the store's copy as well. */
static void test_disk_tier_first_and_disk_evict_deletes(void **state)
{
	struct disk_tier_config dc = { .size = 8u << 20 };
	struct remote_tier_stats s0, s;
	struct disk_tier *dt = NULL;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	char dir[64], path[128], msg[128];
	bool held;

	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/kvpool-test-remote-user-XXXXXX");
	assert_non_null(mkdtemp(dir));
	dc.dir = dir;
	test_layout(&dc.layout);
	assert_int_equal(disk_codec_parse("none", &dc.codec, msg, sizeof(msg)), 0);
	if (disk_tier_open(&dt, &dc, &e))
		fail_msg("disk_tier_open: %s", e.msg);
	g_a = engine_with(g_rta, dt, NULL);
	remote_tier_stats(g_rta, &s0);
	compute_and_reclaim(g_a, g_rta, 15, NTOK);
	disk_tier_flush(dt);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_puts - s0.user_puts, 1);
	assert_int_equal(info_of(g_a, 15).pages_disk, NTOK / PT + 1);
	remote_tier_stats(g_rta, &s0);
	L = prep_held(g_a, 15, NTOK, 0, &held);
	assert_int_equal(L.len, NTOK);
	release_ok(g_a, L.id);
	verify(g_a, 15, 0, NTOK);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.fetches - s0.fetches, 0); /* the disk's copy */
	/* Dropped again (to both), then the disk copy thrown away: the
	 * store's goes too, and the next prepare is a miss. */
	reclaim(g_a, g_rta, 15);
	disk_tier_flush(dt);
	remote_tier_stats(g_rta, &s0);
	assert_true(engine_evict(g_a, 15, KVP_SEL_DISK, &e) > 0);
	remote_tier_flush(g_rta);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_dels - s0.user_dels, 1);
	L = prep_held(g_a, 15, 0, 0, &held);
	assert_true(held);
	assert_int_equal(L.len, 0);
	release_ok(g_a, L.id);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_missed - s0.user_missed, 1);
	engine_destroy(g_a);
	g_a = NULL;
	disk_tier_close(dt);
	snprintf(path, sizeof(path), "%s/kvpool.disk", dir);
	unlink(path);
	rmdir(dir);
}

/* A user from `from` on of the shard set s's shard i. */
static uint64_t user_of_shard(struct shard_set *s, uint32_t i, uint64_t from)
{
	while (shard_of_user(s, from) != i)
		from++;
	return from;
}

/*
 * In a shard set, a history fetched for a shard short of host room (the
 * other shard's histories hold every host frame): the prepare is refused
 * with -EAGAIN, and its retry with every shard locked (as kvpoold's) takes
 * the fetch kept for it: no second round, no wait on the network there.
 */
static void test_shard_short_of_host_room_keeps_the_fetch(void **state)
{
	struct shard_set_config sc = { .shards = 2, .reclaim = RECLAIM_OFF };
	struct remote_tier_stats s0, s;
	struct shard_set *set = NULL;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct engine *e0, *e1;
	uint64_t u, f = 1000;
	int rc;

	(void)state;
	g_a = engine_on(g_rta);
	test_layout(&sc.ec.layout);
	sc.ec.device_frames = 64;
	sc.ec.host_frames = 12;
	sc.ec.disk_tenant = TENANT;
	sc.ec.remote = g_rtb;
	if (shard_set_create(&set, &sc, &e))
		fail_msg("shard_set_create: %s", e.msg);
	u = user_of_shard(set, 0, 61);
	compute_and_reclaim(g_a, g_rta, u, NTOK);
	/* Shard 1's histories on the host tier, every frame of it. */
	e1 = shard_lock(set, 1);
	while (frame_pool_free(set->pool[KVP_TIER_HOST]) ||
	       stats_of(e1).tier[KVP_TIER_HOST].frames_free) {
		f = user_of_shard(set, 1, f + 1);
		put(e1, f, 0, 2 * PT);
		assert_true(engine_evict(e1, f, KVP_SEL_DEVICE, &e) > 0);
		assert_int_equal(info_of(e1, f).pages_host, 2);
	}
	shard_unlock(set, 1);

	remote_tier_stats(g_rtb, &s0);
	e0 = shard_lock(set, 0);
	while ((rc = engine_prepare_flags(e0, u, NTOK, 0, OWNER,
					  ENGINE_PREPARE_DEFER, &L, &e)) == -EINPROGRESS)
		usleep(1000);
	assert_int_equal(rc, -EAGAIN);
	assert_non_null(strstr(e.msg, "remote tier"));
	shard_unlock(set, 0);
	e0 = shard_lock_all(set);
	rc = engine_prepare_flags(e0, u, NTOK, 0, OWNER, 0, &L, &e);
	if (rc)
		fail_msg("the prepare with every shard: %d: %s", rc, e.msg);
	assert_int_equal(L.len, NTOK);
	release_ok(e0, L.id);
	verify(e0, u, 0, NTOK);
	shard_unlock_all(set);
	remote_tier_stats(g_rtb, &s);
	assert_int_equal(s.fetches - s0.fetches, 1);
	assert_int_equal(s.user_fetched - s0.user_fetched, 1);
	shard_set_destroy(set);
}

/* A clean stop (kvpoold's): every history A holds is written to the store,
 * wherever it is (device, host), and B serves those users next; one that
 * came from the store unchanged is not written again. */
static void test_flush_all_hands_users_over(void **state)
{
	struct remote_tier_stats s0, s;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	bool held;

	(void)state;
	g_a = engine_on(g_rta);
	g_b = engine_on(g_rtb);
	compute_and_reclaim(g_a, g_rta, 71, NTOK);
	L = prep_held(g_a, 71, NTOK, 0, &held); /* back from the store */
	release_ok(g_a, L.id);
	put(g_a, 72, 0, NTOK);               /* on the device tier */
	put(g_a, 73, 0, 2 * PT);
	assert_true(engine_evict(g_a, 73, KVP_SEL_DEVICE, &e) > 0); /* host only */
	remote_tier_stats(g_rta, &s0);
	assert_int_equal(engine_remote_user_flush_all(g_a), 2);
	remote_tier_flush(g_rta);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_puts - s0.user_puts, 2);
	engine_destroy(g_a);
	g_a = NULL;
	for (uint64_t u = 71; u <= 73; u++) {
		uint32_t n = u == 73 ? 2 * PT : NTOK;

		L = prep_held(g_b, u, n, 0, &held);
		assert_true(held);
		assert_int_equal(L.len, n);
		release_ok(g_b, L.id);
		verify(g_b, u, 0, n);
	}
}

/* On a device tier the CPU cannot read (a GPU's), eviction's write skips a
 * history with pages only there, and a clean stop demotes it to the host
 * tier first: then it goes to the store as any other. */
static void test_flush_all_of_gpu_pages_goes_through_the_host(void **state)
{
	struct remote_tier_stats s0, s;
	struct engine_lease L;
	bool held;

	(void)state;
	g_a = engine_with(g_rta, NULL, shm_opaque_backend());
	g_b = engine_on(g_rtb);
	put(g_a, 75, 0, NTOK);
	remote_tier_stats(g_rta, &s0);
	engine_remote_user_out(g_a, engine_find_history(g_a, 75));
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.put_pages, s0.put_pages); /* device-only: skipped */
	assert_int_equal(engine_remote_user_flush_all(g_a), 1);
	remote_tier_flush(g_rta);
	assert_int_equal(info_of(g_a, 75).pages_host, NTOK / PT + 1);
	L = prep_held(g_b, 75, NTOK, 0, &held);
	assert_int_equal(L.len, NTOK);
	release_ok(g_b, L.id);
	verify(g_b, 75, 0, NTOK);
}

/* A new user costs B one round (the price of the setting), then is a new
 * history; counted as a miss. */
static void test_new_user_is_one_round_then_a_miss(void **state)
{
	struct remote_tier_stats s0, s;
	struct engine_lease L;
	bool held;

	(void)state;
	g_b = engine_on(g_rtb);
	remote_tier_stats(g_rtb, &s0);
	L = prep_held(g_b, 12, 0, 5, &held);
	assert_true(held);
	assert_int_equal(L.len, 0);
	write_commit_release(g_b, &L, 12, 5);
	verify(g_b, 12, 0, 5);
	remote_tier_stats(g_rtb, &s);
	assert_int_equal(s.fetches - s0.fetches, 1);
	assert_int_equal(s.user_missed - s0.user_missed, 1);
	/* In memory now: no round. */
	L = prep_held(g_b, 12, 5, 0, &held);
	assert_false(held);
	release_ok(g_b, L.id);
}

/* The setting off: nothing of a history is written, and a prepare of a
 * user not in memory asks the store nothing. */
static void test_setting_off_writes_nothing(void **state)
{
	struct remote_tier *rt = tier_open(false, 0);
	struct remote_tier_stats s;
	struct engine_lease L;
	long long keys0;
	bool held;

	(void)state;
	keys0 = store_keys();
	g_a = engine_on(rt);
	compute_and_reclaim(g_a, rt, 21, NTOK);
	assert_int_equal(store_keys(), keys0);
	L = prep_held(g_a, 21, 0, 2, &held);
	assert_false(held);
	assert_int_equal(L.len, 0);
	release_ok(g_a, L.id);
	remote_tier_stats(rt, &s);
	assert_int_equal(s.put_pages, 0);
	assert_int_equal(s.fetches, 0);
	assert_int_equal(s.user_puts, 0);
	engine_destroy(g_a);
	g_a = NULL;
	remote_tier_close(rt);
}

/* A history longer than the write-behind queue has room for is not
 * queued at all (counted): part of it would only tear what the store has. */
static void test_history_past_the_queue_is_not_queued(void **state)
{
	struct remote_tier *rt = tier_open(true, 4);
	struct remote_tier_stats s;
	long long keys0;

	(void)state;
	keys0 = store_keys();
	g_a = engine_on(rt);
	compute_and_reclaim(g_a, rt, 81, NTOK); /* six pages and a record */
	remote_tier_stats(rt, &s);
	assert_int_equal(s.user_dropped, 1);
	assert_int_equal(s.user_puts, 0);
	assert_int_equal(s.put_pages, 0);
	assert_int_equal(store_keys(), keys0);
	compute_and_reclaim(g_a, rt, 82, 3 * PT); /* three: they fit */
	remote_tier_stats(rt, &s);
	assert_int_equal(s.user_puts, 1);
	engine_destroy(g_a);
	g_a = NULL;
	remote_tier_close(rt);
}

/* One page's value replaced by that page of an older snapshot (another
 * write id): B's prepare is a miss, counted, and no byte of it served. */
static void test_torn_snapshot_is_a_miss(void **state)
{
	struct remote_tier_stats s0, s;
	struct engine_lease L;
	char key[REMOTE_KEY_MAX];
	redisReply *old, *r;
	bool held;
	int node;

	(void)state;
	g_a = engine_on(g_rta);
	g_b = engine_on(g_rtb);
	compute_and_reclaim(g_a, g_rta, 31, NTOK);
	node = user_key(g_a, 31, 2, key);
	old = redis_local_cmd(&g_redis, node, "GET %s", key);
	assert_non_null(old);
	assert_int_equal(old->type, REDIS_REPLY_STRING);
	/* Written again (A brought it back, added a token, dropped it
	 * again): a new snapshot, every key overwritten in place, page 2's
	 * bytes the same but its write id not. */
	L = prep_held(g_a, 31, NTOK, 1, &held);
	assert_true(held);
	assert_int_equal(L.len, NTOK);
	write_commit_release(g_a, &L, 31, 1);
	reclaim(g_a, g_rta, 31);
	r = redis_local_cmd(&g_redis, node, "SET %s %b", key, old->str, (size_t)old->len);
	assert_non_null(r);
	freeReplyObject(r);
	freeReplyObject(old);

	remote_tier_stats(g_rtb, &s0);
	L = prep_held(g_b, 31, 0, 0, &held);
	assert_true(held);
	assert_int_equal(L.len, 0);
	assert_int_equal(L.npages, 0);
	remote_tier_stats(g_rtb, &s);
	assert_int_equal(s.user_torn - s0.user_torn, 1);
	assert_int_equal(s.user_fetched - s0.user_fetched, 0);
	assert_int_equal(s.bad_values - s0.bad_values, 1);
	release_ok(g_b, L.id);
	assert_false(info_of(g_b, 31).exists);
	CHECK(g_b);
}

/* An explicit eviction of everything of the user on A DELs its record in
 * the store: B's later prepare is a miss. */
static void test_evict_all_deletes_the_record(void **state)
{
	struct remote_tier_stats s0, s;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	char key[REMOTE_KEY_MAX];
	redisReply *r;
	bool held;
	int node;

	(void)state;
	g_a = engine_on(g_rta);
	g_b = engine_on(g_rtb);
	compute_and_reclaim(g_a, g_rta, 41, NTOK);
	node = user_key(g_a, 41, REMOTE_PAGE_REC, key);
	r = redis_local_cmd(&g_redis, node, "EXISTS %s", key);
	assert_int_equal(r->integer, 1);
	freeReplyObject(r);
	/* A brings it back (its own store copy), then throws it away. */
	L = prep_held(g_a, 41, NTOK, 0, &held);
	assert_int_equal(L.len, NTOK);
	release_ok(g_a, L.id);
	remote_tier_stats(g_rta, &s0);
	assert_true(engine_evict(g_a, 41, KVP_SEL_ALL, &e) > 0);
	remote_tier_flush(g_rta);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_dels - s0.user_dels, 1);
	r = redis_local_cmd(&g_redis, node, "EXISTS %s", key);
	assert_int_equal(r->integer, 0);
	freeReplyObject(r);

	remote_tier_stats(g_rtb, &s0);
	L = prep_held(g_b, 41, 0, 0, &held);
	assert_true(held);
	assert_int_equal(L.len, 0);
	release_ok(g_b, L.id);
	remote_tier_stats(g_rtb, &s);
	assert_int_equal(s.user_missed - s0.user_missed, 1);
	/* A leased user's eviction is refused: no DEL goes out. */
	L = prep_held(g_a, 42, 0, 4, &held);
	remote_tier_stats(g_rta, &s0);
	assert_int_equal(engine_evict(g_a, 42, KVP_SEL_ALL, &e), -EBUSY);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_dels, s0.user_dels);
	write_commit_release(g_a, &L, 42, 4);
	/* Everything of every user (kvctl evict --all --tier all): a DEL
	 * each, one on the device tier and one on the host tier. */
	put(g_a, 43, 0, 4);
	assert_true(engine_evict(g_a, 43, KVP_SEL_DEVICE, &e) > 0);
	remote_tier_stats(g_rta, &s0);
	assert_int_equal(engine_evict_all(g_a, KVP_SEL_ALL, NULL), 2);
	remote_tier_flush(g_rta);
	remote_tier_stats(g_rta, &s);
	assert_int_equal(s.user_dels - s0.user_dels, 2);
	assert_int_equal(s.user_puts, s0.user_puts);
}

/* The node holding one of the history's pages (not its record) killed:
 * B's prepare is a miss within the timeouts, counted as torn. Last: the
 * node stays dead. */
static void test_killed_store_node_is_a_miss_in_bounded_time(void **state)
{
	struct remote_tier_stats s0, s;
	struct engine_lease L;
	char key[REMOTE_KEY_MAX];
	int rec_node, node = -1;
	uint64_t t0;
	bool held;

	(void)state;
	g_a = engine_on(g_rta);
	g_b = engine_on(g_rtb);
	compute_and_reclaim(g_a, g_rta, 51, NTOK);
	rec_node = user_key(g_a, 51, REMOTE_PAGE_REC, key);
	for (uint32_t i = 0; i <= NTOK / PT && node < 0; i++)
		if (user_key(g_a, 51, i, key) != rec_node)
			node = user_key(g_a, 51, i, key);
	assert_true(node >= 0);
	kill(g_redis.pid[node], SIGKILL);
	waitpid(g_redis.pid[node], NULL, 0);
	g_redis.pid[node] = 0;

	remote_tier_stats(g_rtb, &s0);
	t0 = mono_ns();
	L = prep_held(g_b, 51, 0, 0, &held);
	assert_true(mono_ns() - t0 < 2000000000ull);
	assert_true(held);
	assert_int_equal(L.len, 0);
	release_ok(g_b, L.id);
	remote_tier_stats(g_rtb, &s);
	assert_int_equal(s.user_torn - s0.user_torn, 1);
	CHECK(g_b);
}

int main(void)
{
	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_b_gets_a_history_byte_for_byte,
					  teardown_engines),
		cmocka_unit_test_teardown(test_seq_create_of_a_user_in_the_store,
					  teardown_engines),
		cmocka_unit_test_teardown(test_own_history_back_right_after_eviction,
					  teardown_engines),
		cmocka_unit_test(test_a_record_written_makes_its_fetch_stale),
		cmocka_unit_test_teardown(test_flush_all_hands_users_over,
					  teardown_engines),
		cmocka_unit_test_teardown(test_flush_all_of_gpu_pages_goes_through_the_host,
					  teardown_engines),
		cmocka_unit_test_teardown(test_shard_short_of_host_room_keeps_the_fetch,
					  teardown_engines),
		cmocka_unit_test_teardown(test_disk_tier_first_and_disk_evict_deletes,
					  teardown_engines),
		cmocka_unit_test_teardown(test_new_user_is_one_round_then_a_miss,
					  teardown_engines),
		cmocka_unit_test_teardown(test_setting_off_writes_nothing,
					  teardown_engines),
		cmocka_unit_test_teardown(test_history_past_the_queue_is_not_queued,
					  teardown_engines),
		cmocka_unit_test_teardown(test_torn_snapshot_is_a_miss,
					  teardown_engines),
		cmocka_unit_test_teardown(test_evict_all_deletes_the_record,
					  teardown_engines),
		/* Last: it kills a node for good. */
		cmocka_unit_test_teardown(test_killed_store_node_is_a_miss_in_bounded_time,
					  teardown_engines),
	};

	return cmocka_run_group_tests(tests, setup, teardown_all);
}
