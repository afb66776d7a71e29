/* SPDX-License-Identifier: MIT */
/*
 * test_remote_engine.c - the remote tier under two engines (two daemons'
 * pools) sharing one Redis Cluster of three redis-server processes on
 * loopback: engine A's prefix pages evicted from its device tier are
 * written behind; engine B's lookup of the same tokens misses locally,
 * is held (-EINPROGRESS) while one batched round fetches the run, then
 * answers with the pages onloaded into its device tier, byte for byte A's
 * and published in its own prefix cache (engine_check passes). A damaged
 * value stops the run there (counted, never served); a full write-behind
 * queue drops (counted) without waiting; a device tier the CPU cannot
 * read (cuda's) goes through the backend both ways; a store node killed
 * makes its pages misses within the timeout, nothing else changes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hiredis/hiredis.h>
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

#include "backend.h"
#include "clock.h"
#include "engine_helpers.h"
#include "engine_share.h"
#include "redis_cluster.h"
#include "redis_local.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "remote_value.h"
#include "share_helpers.h"

#define NTOK (6 * PT + 1) /* six full pages and one token */
#define KEY 77

static struct redis_local g_redis;
static struct remote_tier *g_rt;
static struct engine *g_b;

static int setup(void **state)
{
	struct remote_tier_config c = { .timeout_ms = 300 };
	struct errbuf e;
	int ret = redis_local_start(&g_redis, 3);

	(void)state;
	if (ret == 77)
		exit(77);
	if (ret)
		return ret;
	test_layout(&c.layout);
	c.url = g_redis.url;
	return remote_tier_open(&g_rt, &c, &e);
}

static int teardown_all(void **state)
{
	(void)state;
	remote_tier_close(g_rt);
	redis_local_stop(&g_redis);
	return 0;
}

/* The shm backend with its device tier marked not host-visible: what the
 * cuda backend's is (reached through read and copy only). */
static struct backend_ops g_opaque;

static int opaque_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
			struct tier_mem *out, struct errbuf *e)
{
	int ret = backend_shm.tier_alloc(ctx, tier, bytes, out, e);

	if (!ret && tier == KVP_TIER_DEVICE)
		out->host_visible = false;
	return ret;
}

static bool g_opaque_on; /* engines made now have an opaque device tier */

static struct engine *engine_with_remote(void)
{
	struct engine_config cfg = { .device_frames = 32, .host_frames = 16,
				     .disk_tenant = 7, .remote = g_rt };
	struct engine *eng = NULL;
	struct errbuf e;

	test_layout(&cfg.layout);
	if (g_opaque_on) {
		g_opaque = backend_shm;
		g_opaque.tier_alloc = opaque_alloc;
		cfg.backend = &g_opaque;
	}
	if (engine_create(&eng, &cfg, &e))
		fail_msg("engine_create: %s", e.msg);
	return eng;
}

/* seq_put, retried while the remote tier's round for the prompt's prefix
 * is out, as kvpoold's operations are (the first seq_alloc of a prompt asks
 * the store for it). */
static void seq_put_retry(struct engine *eng, uint64_t seq, const uint32_t *tokens,
			  uint32_t n, uint64_t key)
{
	struct engine_lease L;
	struct errbuf e = { "" };
	struct tlease t;
	int rc, rounds = 0;

	while ((rc = share_seq_alloc(eng, seq, tokens, n, OWNER, &L, &e)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 3000);
	}
	if (rc)
		fail_msg("share_seq_alloc: %d: %s", rc, e.msg);
	tlease_copy(&t, &L);
	write_key(eng, &t, key, 0, t.L.n_new);
	commit_ok(eng, t.L.id, t.L.n_new);
	release_ok(eng, t.L.id);
}

/* Engine A computes the prompt (a sequence of pattern KEY), lets it go and
 * evicts everything: its pages go to the store. */
static void a_computes_and_evicts(const uint32_t *tokens)
{
	struct engine *a = engine_with_remote();
	struct remote_tier_stats st0, st;

	remote_tier_stats(g_rt, &st0);
	seq_put_retry(a, 1, tokens, NTOK, KEY);
	seq_free_ok(a, 1, OWNER);
	while (share_evictable(a))
		share_evict_oldest(a);
	CHECK(a);
	remote_tier_flush(g_rt);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.put_pages - st0.put_pages, NTOK / PT);
	assert_int_equal(st.written_pages - st0.written_pages, NTOK / PT);
	engine_destroy(a);
}

/* B's lookup, held while the remote round is out, as a ring worker does. */
static struct share_prefix_hit b_lookup(struct engine *b, const uint32_t *tokens,
					bool expect_held)
{
	struct share_prefix_hit hit;
	int ret = share_prefix_find(b, tokens, NTOK, &hit);
	uint32_t rounds = 0;

	if (expect_held)
		assert_int_equal(ret, -EINPROGRESS);
	while (ret == -EINPROGRESS) {
		uint64_t t0 = mono_ns();

		usleep(1000);
		ret = share_prefix_find(b, tokens, NTOK, &hit);
		assert_true(mono_ns() - t0 < 2000000000ull);
		assert_true(++rounds < 3000); /* bounded: the timeout is 300 ms */
	}
	assert_int_equal(ret, 0);
	CHECK(b);
	return hit;
}

static void test_b_onloads_a_pages_byte_for_byte(void **state)
{
	uint32_t tokens[NTOK];
	struct share_prefix_hit hit;
	struct remote_tier_stats st;
	struct kvp_stats ks;

	(void)state;
	tokens_seq(tokens, NTOK, 1000);
	a_computes_and_evicts(tokens);
	g_b = engine_with_remote();
	hit = b_lookup(g_b, tokens, true);
	assert_int_equal(hit.npages, NTOK / PT);
	assert_int_equal(hit.tokens, (NTOK / PT) * PT);
	expect_frames_bytes(g_b, hit.frames, 0, (NTOK / PT) * PT, KEY, 0);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.onloaded_pages, NTOK / PT);
	assert_int_equal(st.bad_values, 0);
	/* Counted once, as one lookup that hit. */
	ks = stats_of(g_b);
	assert_int_equal(ks.prefix_lookups, 1);
	assert_int_equal(ks.prefix_hit_tokens, (NTOK / PT) * PT);
	/* Now local: no remote round. */
	hit = b_lookup(g_b, tokens, false);
	assert_int_equal(hit.npages, NTOK / PT);
	/* And the onloaded pages are ordinary idle pages: evictable. */
	assert_int_equal(share_evictable(g_b), NTOK / PT);
	engine_destroy(g_b);
	g_b = NULL;
}

static void test_damaged_value_stops_the_run_and_is_counted(void **state)
{
	uint32_t tokens[NTOK];
	struct share_prefix_hit hit;
	struct remote_tier_stats st0, st;
	struct remote_key k = { .kind = DISK_KIND_PREFIX, .tenant = 7 };
	uint8_t h[NTOK / PT][32];
	char key[REMOTE_KEY_MAX];
	redisReply *r;
	int node;

	(void)state;
	tokens_seq(tokens, NTOK, 5000);
	a_computes_and_evicts(tokens);
	g_b = engine_with_remote();
	/* Page 3's value flipped in the store. */
	share_prefix_hashes(g_b, tokens, NTOK, h);
	k.layout_id = disk_layout_id(engine_layout(g_b));
	memcpy(k.hash, h[3], 32);
	remote_key_format(&k, key);
	node = (int)(redis_cluster_slot(key, strlen(key)) * 3 / RC_SLOTS);
	r = redis_local_cmd(&g_redis, node, "SETRANGE %s 200 X", key);
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_INTEGER);
	freeReplyObject(r);
	remote_tier_stats(g_rt, &st0);
	hit = b_lookup(g_b, tokens, true);
	assert_int_equal(hit.npages, 3);
	expect_frames_bytes(g_b, hit.frames, 0, 3 * PT, KEY, 0);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.bad_values - st0.bad_values, 1);
	engine_destroy(g_b);
	g_b = NULL;
}

/* A sequence made straight from the tokens (no lookup first) starts from
 * the store's pages too: held while they are fetched, then shared. */
static void test_seq_alloc_starts_from_the_store(void **state)
{
	uint32_t tokens[NTOK];
	struct engine_lease l;
	struct errbuf e;
	int ret, rounds = 0;

	(void)state;
	tokens_seq(tokens, NTOK, 3000);
	a_computes_and_evicts(tokens);
	g_b = engine_with_remote();
	while ((ret = share_seq_alloc(g_b, 5, tokens, NTOK, OWNER, &l, &e)) == -EINPROGRESS) {
		assert_non_null(strstr(e.msg, "remote tier"));
		usleep(1000);
		assert_true(++rounds < 3000);
	}
	assert_int_equal(ret, 0);
	assert_true(rounds > 0);
	assert_int_equal(l.len, (NTOK / PT) * PT);
	assert_int_equal(l.n_new, NTOK - (NTOK / PT) * PT);
	expect_frames_bytes(g_b, l.frames, 0, (NTOK / PT) * PT, KEY, 0);
	assert_int_equal(engine_release(g_b, l.id, NULL), 0);
	seq_free_ok(g_b, 5, OWNER);
	CHECK(g_b);
	engine_destroy(g_b);
	g_b = NULL;
}

/* A device tier the CPU cannot read (cuda's): evicted pages go out through
 * the backend's read, fetched ones come in through a host frame and the
 * backend's copy; the bytes are the same. */
static void test_opaque_device_tier_round_trips(void **state)
{
	uint32_t tokens[NTOK];
	struct share_prefix_hit hit;

	(void)state;
	g_opaque_on = true;
	tokens_seq(tokens, NTOK, 7000);
	a_computes_and_evicts(tokens);
	g_b = engine_with_remote();
	assert_false(engine_tier(g_b, KVP_TIER_DEVICE)->host_visible);
	hit = b_lookup(g_b, tokens, true);
	g_opaque_on = false;
	assert_int_equal(hit.npages, NTOK / PT);
	expect_frames_bytes(g_b, hit.frames, 0, (NTOK / PT) * PT, KEY, 0);
	engine_destroy(g_b);
	g_b = NULL;
}

/* The write-behind queue is bounded: with every store node stopped (writes
 * wait for the timeout), a burst of evictions past the queue is dropped and
 * counted, and the one that evicts never waits. */
static void test_full_queue_drops_and_counts(void **state)
{
	struct remote_tier_config c = { .timeout_ms = 200 };
	struct remote_tier_stats st;
	struct remote_tier *rt;
	struct remote_key k = { .kind = DISK_KIND_PREFIX, .tenant = 9 };
	struct errbuf e;
	uint8_t *page;
	uint64_t t0;
	int dropped = 0;

	(void)state;
	test_layout(&c.layout);
	c.url = g_redis.url;
	c.queue_bytes = 2 * c.layout.page_bytes;
	assert_int_equal(remote_tier_open(&rt, &c, &e), 0);
	page = calloc(1, c.layout.page_bytes);
	assert_non_null(page);
	for (int i = 0; i < 3; i++)
		kill(g_redis.pid[i], SIGSTOP);
	t0 = mono_ns();
	for (int i = 0; i < 20; i++) {
		k.hash[0] = (uint8_t)i;
		dropped += remote_tier_put(rt, &k, page) == -ENOSPC;
	}
	assert_true(mono_ns() - t0 < 100000000ull); /* never on the network */
	for (int i = 0; i < 3; i++)
		kill(g_redis.pid[i], SIGCONT);
	remote_tier_flush(rt);
	remote_tier_stats(rt, &st);
	assert_true(dropped >= 17); /* two queued, one maybe taken by the thread */
	assert_int_equal(st.put_pages, 20);
	assert_int_equal(st.put_dropped, (uint64_t)dropped);
	assert_int_equal(st.queued_bytes, 0);
	remote_tier_close(rt);
	free(page);
}

static void test_killed_store_node_is_a_miss_in_bounded_time(void **state)
{
	uint32_t tokens[NTOK];
	uint8_t h[NTOK / PT][32];
	struct remote_key k = { .kind = DISK_KIND_PREFIX, .tenant = 7 };
	struct share_prefix_hit hit;
	char key[REMOTE_KEY_MAX];
	uint32_t first_gone = NTOK / PT;
	uint64_t t0;
	int node;

	(void)state;
	tokens_seq(tokens, NTOK, 9000);
	a_computes_and_evicts(tokens);
	g_b = engine_with_remote();
	share_prefix_hashes(g_b, tokens, NTOK, h);
	k.layout_id = disk_layout_id(engine_layout(g_b));
	/* The node holding page 2's key dies. */
	memcpy(k.hash, h[2], 32);
	remote_key_format(&k, key);
	node = (int)(redis_cluster_slot(key, strlen(key)) * 3 / RC_SLOTS);
	kill(g_redis.pid[node], SIGKILL);
	waitpid(g_redis.pid[node], NULL, 0);
	g_redis.pid[node] = 0;
	for (uint32_t i = 0; i < NTOK / PT && first_gone == NTOK / PT; i++) {
		memcpy(k.hash, h[i], 32);
		remote_key_format(&k, key);
		if ((int)(redis_cluster_slot(key, strlen(key)) * 3 / RC_SLOTS) == node)
			first_gone = i;
	}
	t0 = mono_ns();
	hit = b_lookup(g_b, tokens, true);
	assert_true(mono_ns() - t0 < 2000000000ull);
	/* The run up to the first page on the dead node; those pages A's. */
	assert_int_equal(hit.npages, first_gone);
	expect_frames_bytes(g_b, hit.frames, 0, first_gone * PT, KEY, 0);
	engine_destroy(g_b);
	g_b = NULL;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_b_onloads_a_pages_byte_for_byte),
		cmocka_unit_test(test_damaged_value_stops_the_run_and_is_counted),
		cmocka_unit_test(test_seq_alloc_starts_from_the_store),
		cmocka_unit_test(test_opaque_device_tier_round_trips),
		cmocka_unit_test(test_full_queue_drops_and_counts),
		/* Last: it kills a node for good. */
		cmocka_unit_test(test_killed_store_node_is_a_miss_in_bounded_time),
	};

	return cmocka_run_group_tests(tests, setup, teardown_all);
}
