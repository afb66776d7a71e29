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

#include "disk_engine.h"
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

static bool g_opaque_on; /* engines made now have an opaque device tier */
static uint32_t g_skip;   /* engine_config.remote_chunk_skip of engines made now */

static struct engine *engine_with_remote(void)
{
	struct engine_config cfg = { .device_frames = 32, .host_frames = 16,
				     .disk_tenant = 7, .remote = g_rt,
				     .remote_chunk_skip = g_skip };
	struct engine *eng = NULL;
	struct errbuf e;

	test_layout(&cfg.layout);
	if (g_opaque_on)
		cfg.backend = shm_opaque_backend();
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
	struct errbuf e = { .msg = "" };
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
	/* And the onloaded pages are ordinary idle pages: evictable, and
	 * not written back to the store they came from. */
	assert_int_equal(share_evictable(g_b), NTOK / PT);
	remote_tier_stats(g_rt, &st);
	while (share_evictable(g_b))
		share_evict_oldest(g_b);
	CHECK(g_b);
	remote_tier_flush(g_rt);
	{
		struct remote_tier_stats after;

		remote_tier_stats(g_rt, &after);
		assert_int_equal(after.put_pages, st.put_pages);
	}
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

/* A run of 40 pages of 1 MiB goes to the store in batches of 16 MiB (each
 * with the whole remote_timeout_ms, as a batch must be answered whole
 * within it): more rounds than the three of a single batch, every page
 * back byte for byte. */
static void test_long_run_goes_in_16mib_batches(void **state)
{
	enum { N = 40 };
	struct remote_tier_config c = { .timeout_ms = 2000, .queue_bytes = 64ull << 20 };
	struct remote_key keys[N];
	struct remote_fetch *f;
	struct remote_tier *rt;
	struct rc_node_stats st;
	struct remote_tier_stats ts;
	struct errbuf e;
	uint64_t rounds0 = 0, rounds = 0;
	char err[128];
	uint8_t *page;

	(void)state;
	assert_int_equal(kvp_layout_init(&c.layout, 8, 8, 128, KVP_DTYPE_BF16, 32, err,
					 sizeof(err)), 0);
	assert_int_equal(c.layout.page_bytes, 1 << 20);
	c.url = g_redis.url;
	assert_int_equal(remote_tier_open(&rt, &c, &e), 0);
	page = malloc(c.layout.page_bytes);
	assert_non_null(page);
	for (int i = 0; i < N; i++) {
		keys[i] = (struct remote_key){ .kind = DISK_KIND_PREFIX, .tenant = 11,
					       .layout_id = disk_layout_id(&c.layout) };
		keys[i].hash[0] = (uint8_t)i;
		keys[i].hash[1] = 0x16;
		memset(page, i + 1, c.layout.page_bytes);
		assert_int_equal(remote_tier_put(rt, &keys[i], page), 0);
	}
	remote_tier_flush(rt);
	remote_tier_stats(rt, &ts);
	assert_int_equal(ts.written_pages, N);
	for (uint32_t k = 0; remote_tier_node_stats(rt, k, &st); k++)
		rounds0 += st.rounds;
	assert_int_equal(remote_tier_fetch(rt, keys, N, &f), -EINPROGRESS);
	remote_tier_wait(rt, &keys[0]);
	assert_int_equal(remote_tier_fetch(rt, keys, N, &f), 0);
	assert_int_equal(remote_fetch_pages(f), N);
	for (int i = 0; i < N; i++) {
		memset(page, i + 1, c.layout.page_bytes);
		assert_memory_equal(remote_fetch_page(f, (uint32_t)i), page, c.layout.page_bytes);
	}
	remote_fetch_done(rt, f, 0);
	for (uint32_t k = 0; remote_tier_node_stats(rt, k, &st); k++)
		rounds += st.rounds;
	assert_true(rounds - rounds0 > 3);
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

/* ------------------------------------------------------------ chunks */

#define CTOK (3 * PT + 2) /* four pages, the last one part full */
#define META "{\"doc\":\"a.pdf\",\"page\":3}"
#define NOW 1000000ull

/* The store's node holding key k (slots split evenly: redis_local.h). */
static int node_of(const struct remote_key *k)
{
	char key[REMOTE_KEY_MAX];

	remote_key_format(k, key);
	return (int)(redis_cluster_slot(key, strlen(key)) * 3 / RC_SLOTS);
}

static void store_cmd(const struct remote_key *k, const char *cmd)
{
	char key[REMOTE_KEY_MAX];
	redisReply *r;

	remote_key_format(k, key);
	r = redis_local_cmd(&g_redis, node_of(k), "%s %s", cmd, key);
	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_INTEGER);
	freeReplyObject(r);
}

static struct remote_key chunk_key(const struct kvp_chunk_id *id, uint32_t page)
{
	struct remote_key k = { .kind = DISK_KIND_CHUNK, .tenant = 7, .page = page };
	struct kvp_layout l;

	test_layout(&l);
	k.layout_id = disk_layout_id(&l);
	memcpy(k.hash, id->b, 32);
	return k;
}

/* Engine A registers, fills and seals a chunk of toks, then lets eviction
 * take everything: the chunk goes to the store. *name its name id. */
static void a_chunk_to_store(const uint32_t *toks, uint64_t key, struct kvp_chunk_id *id,
			     struct kvp_chunk_id *name)
{
	struct engine *a = engine_with_remote();
	struct remote_tier_stats st0, st;
	struct share_chunk_reg r;
	struct errbuf e = { .msg = "" };

	remote_tier_stats(g_rt, &st0);
	chunk_put(a, toks, CTOK, KVP_CHUNK_CONTEXT, META, OWNER, NOW, key, false, id);
	assert_int_equal(share_chunk_register(a, toks, CTOK, KVP_CHUNK_CONTEXT, NULL,
					      OWNER, NOW, &r, &e), 0);
	assert_false(r.created);
	*name = r.name;
	while (share_evictable(a))
		share_evict_oldest(a);
	CHECK(a);
	remote_tier_flush(g_rt);
	remote_tier_stats(g_rt, &st);
	/* Its four pages and its record under both ids. */
	assert_int_equal(st.written_pages - st0.written_pages, 4 + 2);
	engine_destroy(a);
}

/* An acquire on eng, held while the store is asked (as a ring worker
 * holds it), the message naming the remote tier; its rc. */
static int acquire_held(struct engine *eng, const struct kvp_chunk_id *id,
			struct engine_lease *L, struct errbuf *e)
{
	int rc, rounds = 0;

	while ((rc = share_chunk_acquire(eng, id, OWNER, NOW, L, e)) == -EINPROGRESS) {
		assert_non_null(strstr(e->msg, "remote tier"));
		usleep(1000);
		assert_true(++rounds < 3000); /* bounded: the timeout is 300 ms */
	}
	return rc;
}

/* B acquires A's chunk by its entry id, C by its name, D registers the
 * same tokens and finds it sealed: each is held for the store's rounds,
 * and gets A's bytes and the chunk's name and metadata. */
static void chunk_across_engines(uint32_t base)
{
	struct kvp_chunk_id id, name;
	struct kvp_chunk_info info;
	struct share_chunk_reg r;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	struct remote_tier_stats st0, st;
	uint32_t toks[CTOK];
	struct engine *b;
	int rc, rounds = 0;

	tokens_seq(toks, CTOK, base);
	a_chunk_to_store(toks, KEY, &id, &name);
	remote_tier_stats(g_rt, &st0);
	for (int way = 0; way < 2; way++) {
		b = engine_with_remote();
		assert_int_equal(acquire_held(b, way ? &name : &id, &L, &e), 0);
		assert_int_equal(L.len, CTOK);
		assert_int_equal(engine_release(b, L.id, NULL), 0);
		expect_chunk_bytes(b, &id, KEY, CTOK);
		assert_int_equal(share_chunk_info(b, &name, &info, &e), 0);
		assert_string_equal(info.meta, META);
		assert_int_equal(info.tokens, CTOK);
		CHECK(b);
		engine_destroy(b);
	}
	/* A get (kvp_chunk_get) of A's chunk by its entry id: its row, the
	 * chunk brought back first. */
	b = engine_with_remote();
	while ((rc = share_chunk_from_below(b, &id, &e)) == -EINPROGRESS) {
		assert_non_null(strstr(e.msg, "remote tier"));
		usleep(1000);
		assert_true(++rounds < 3000);
	}
	assert_int_equal(rc, 0);
	assert_int_equal(share_chunk_info(b, &id, &info, &e), 0);
	assert_string_equal(info.meta, META);
	expect_chunk_bytes(b, &id, KEY, CTOK);
	CHECK(b);
	engine_destroy(b);
	rounds = 0;
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.fetches - st0.fetches, 3);       /* one each */
	assert_int_equal(st.onloaded_pages - st0.onloaded_pages, 3 * 4);
	assert_int_equal(st.bad_values - st0.bad_values, 0);
	b = engine_with_remote();
	while ((rc = share_chunk_register(b, toks, CTOK, KVP_CHUNK_CONTEXT, NULL,
					  OWNER, NOW, &r, &e)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 3000);
	}
	assert_int_equal(rc, 0);
	assert_true(rounds > 0);
	assert_false(r.created); /* nothing to compute: A's */
	assert_int_equal(r.state, KVP_CHUNK_READY);
	expect_chunk_bytes(b, &id, KEY, CTOK);
	CHECK(b);
	engine_destroy(b);
}

static void test_chunk_from_the_store_by_id_name_and_register(void **state)
{
	(void)state;
	chunk_across_engines(4000);
}

/* The same through a device tier the CPU cannot read (cuda's). */
static void test_chunk_from_the_store_opaque_device_tier(void **state)
{
	(void)state;
	g_opaque_on = true;
	chunk_across_engines(4500);
	g_opaque_on = false;
}

/* A chunk the store has only in part (a page lost), or whose record does
 * not check, is a miss after one round: never a chunk with wrong or
 * missing bytes; nothing is left behind in B. A chunk nobody stored is a
 * miss too, in bounded time. */
static void test_chunk_partial_or_damaged_is_a_miss(void **state)
{
	struct kvp_chunk_id id, name, nobody;
	struct remote_tier_stats st0, st;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint32_t toks[CTOK];
	struct remote_key k;
	char key[REMOTE_KEY_MAX];
	redisReply *rp;

	(void)state;
	tokens_seq(toks, CTOK, 6000);
	a_chunk_to_store(toks, KEY, &id, &name);
	g_b = engine_with_remote();
	k = chunk_key(&name, 2);
	store_cmd(&k, "DEL"); /* page 2 lost */
	assert_int_equal(acquire_held(g_b, &id, &L, &e), -ENOENT);
	assert_int_equal(stats_of(g_b).chunks, 0);
	CHECK(g_b);
	/* The record under the name id flipped: dropped, counted. */
	remote_tier_stats(g_rt, &st0);
	k = chunk_key(&name, REMOTE_PAGE_REC);
	remote_key_format(&k, key);
	rp = redis_local_cmd(&g_redis, node_of(&k), "SETRANGE %s 150 X", key);
	assert_non_null(rp);
	freeReplyObject(rp);
	assert_int_equal(acquire_held(g_b, &name, &L, &e), -ENOENT);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.bad_values - st0.bad_values, 1);
	memset(&nobody, 0x3c, sizeof(nobody));
	assert_int_equal(acquire_held(g_b, &nobody, &L, &e), -ENOENT);
	assert_non_null(strstr(e.msg, "is not registered"));
	assert_int_equal(stats_of(g_b).chunks, 0);
	CHECK(g_b);
	engine_destroy(g_b);
	g_b = NULL;
}

/* A delete reaches the store: B brings A's chunk back and deletes it by
 * its name; C's acquire by either id is a miss. A chunk only in the store
 * deleted by its name: a miss too. */
static void test_chunk_delete_reaches_the_store(void **state)
{
	struct kvp_chunk_id id, name;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint32_t toks[CTOK];
	struct engine *c;

	(void)state;
	tokens_seq(toks, CTOK, 8000);
	a_chunk_to_store(toks, KEY, &id, &name);
	g_b = engine_with_remote();
	assert_int_equal(acquire_held(g_b, &id, &L, &e), 0);
	assert_int_equal(engine_release(g_b, L.id, NULL), 0);
	assert_int_equal(share_chunk_delete(g_b, &name, &e), 1);
	remote_tier_flush(g_rt);
	c = engine_with_remote();
	assert_int_equal(acquire_held(c, &id, &L, &e), -ENOENT);
	assert_int_equal(acquire_held(c, &name, &L, &e), -ENOENT);
	engine_destroy(c);

	tokens_seq(toks, CTOK, 8500);
	a_chunk_to_store(toks, KEY, &id, &name);
	/* Known here only as a name: the store's copy goes by it. */
	share_chunk_delete(g_b, &name, &e);
	remote_tier_flush(g_rt);
	c = engine_with_remote();
	assert_int_equal(acquire_held(c, &name, &L, &e), -ENOENT);
	assert_int_equal(acquire_held(c, &id, &L, &e), -ENOENT); /* page 0 gone */
	CHECK(c);
	engine_destroy(c);
	engine_destroy(g_b);
	g_b = NULL;
}

/* A sequence built over a chunk only in the store: the chunk comes back
 * first (held meanwhile), then the sequence shares its pages. */
static void test_seq_create_over_a_chunk_in_the_store(void **state)
{
	struct kvp_seq_src src = { .kind = KVP_SRC_CHUNK };
	struct kvp_chunk_id name;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint32_t toks[CTOK];
	int rc, rounds = 0;

	(void)state;
	tokens_seq(toks, CTOK, 9500);
	a_chunk_to_store(toks, KEY, &src.chunk, &name);
	g_b = engine_with_remote();
	while ((rc = share_seq_create(g_b, 1, &src, 1, 1, OWNER, &L, &e)) ==
	       -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 3000);
	}
	if (rc)
		fail_msg("seq_create over a chunk in the store = %d: %s", rc, e.msg);
	assert_int_equal(L.len, CTOK);
	assert_int_equal(engine_release(g_b, L.id, NULL), 0);
	expect_seq_bytes(g_b, 1, 0, CTOK, KEY, 0);
	seq_free_ok(g_b, 1, OWNER);
	CHECK(g_b);
	engine_destroy(g_b);
	g_b = NULL;
}

/* Ahead of eviction: what A computed (a prompt's pages, a sealed chunk)
 * and keeps is queued for the store by remote_publish (the reclaimer's
 * tick in kvpoold), a bounded batch at a time; B gets it while A still
 * holds it; A's eviction later writes nothing again. */
static void test_published_ahead_of_eviction(void **state)
{
	struct engine *a = engine_with_remote();
	struct remote_tier_stats st0, st;
	struct kvp_chunk_id id;
	struct engine_lease L;
	struct errbuf e = { .msg = "" };
	uint32_t tokens[NTOK], toks[CTOK], n = 0, rounds = 0;
	struct share_prefix_hit hit;
	bool more = true;

	(void)state;
	tokens_seq(tokens, NTOK, 11000);
	tokens_seq(toks, CTOK, 12000);
	seq_put_retry(a, 1, tokens, NTOK, KEY);
	seq_free_ok(a, 1, OWNER);
	chunk_put(a, toks, CTOK, KVP_CHUNK_CONTEXT, META, OWNER, NOW, KEY, false, &id);
	remote_tier_stats(g_rt, &st0);
	/* Two pages a call: a batch is bounded, a chunk goes a piece at a
	 * time (its records with its last piece). */
	while (more) {
		uint32_t got = remote_publish(a, 2, &more);

		assert_true(got <= 2);
		n += got;
		assert_true(++rounds < 10);
	}
	assert_int_equal(n, NTOK / PT + 4);
	assert_int_equal(remote_publish(a, 2, &more), 0);
	assert_false(more);
	remote_tier_flush(g_rt);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.written_pages - st0.written_pages, NTOK / PT + 4 + 2);
	CHECK(a);
	/* B, while A still has them all. */
	g_b = engine_with_remote();
	hit = b_lookup(g_b, tokens, true);
	assert_int_equal(hit.npages, NTOK / PT);
	expect_frames_bytes(g_b, hit.frames, 0, (NTOK / PT) * PT, KEY, 0);
	assert_int_equal(acquire_held(g_b, &id, &L, &e), 0);
	assert_int_equal(engine_release(g_b, L.id, NULL), 0);
	expect_chunk_bytes(g_b, &id, KEY, CTOK);
	CHECK(g_b);
	engine_destroy(g_b);
	g_b = NULL;
	/* A's eviction: nothing is written twice. */
	remote_tier_stats(g_rt, &st0);
	while (share_evictable(a))
		share_evict_oldest(a);
	remote_tier_flush(g_rt);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.put_pages, st0.put_pages);
	CHECK(a);
	engine_destroy(a);
}

/* A chunk type not kept in the store (remote_chunk_types without it, as
 * kvpoold's default leaves out queries): its registration asks no round,
 * it is neither published nor written at eviction; a kept type on the same
 * engine still is. */
static void test_chunk_type_not_kept_costs_no_round(void **state)
{
	struct remote_tier_stats st0, st;
	struct share_chunk_reg r;
	struct errbuf e = { .msg = "" };
	struct kvp_chunk_id ctx;
	uint32_t qt[CTOK], ct[CTOK];
	struct engine *a;
	bool more;

	(void)state;
	g_skip = 1u << KVP_CHUNK_QUERY;
	a = engine_with_remote();
	g_skip = 0;
	tokens_seq(qt, CTOK, 13000);
	tokens_seq(ct, CTOK, 14000);
	remote_tier_stats(g_rt, &st0);
	/* No store round: created at once. */
	assert_int_equal(share_chunk_register(a, qt, CTOK, KVP_CHUNK_QUERY, NULL, OWNER,
					      NOW, &r, &e), 0);
	assert_true(r.created);
	assert_int_equal(share_chunk_seal(a, r.lease.id, OWNER, &e), 0);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.fetches, st0.fetches);
	chunk_put(a, ct, CTOK, KVP_CHUNK_CONTEXT, NULL, OWNER, NOW, KEY, false, &ctx);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.fetches, st0.fetches + 1); /* the context's */
	/* Published: the context alone. */
	assert_int_equal(remote_publish(a, 64, &more), 4);
	assert_false(more);
	while (share_evictable(a))
		share_evict_oldest(a);
	remote_tier_flush(g_rt);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.put_pages - st0.put_pages, 4 + 2);
	CHECK(a);
	engine_destroy(a);
}

int main(void)
{
	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_b_onloads_a_pages_byte_for_byte),
		cmocka_unit_test(test_damaged_value_stops_the_run_and_is_counted),
		cmocka_unit_test(test_seq_alloc_starts_from_the_store),
		cmocka_unit_test(test_long_run_goes_in_16mib_batches),
		cmocka_unit_test(test_opaque_device_tier_round_trips),
		cmocka_unit_test(test_full_queue_drops_and_counts),
		cmocka_unit_test(test_chunk_from_the_store_by_id_name_and_register),
		cmocka_unit_test(test_chunk_from_the_store_opaque_device_tier),
		cmocka_unit_test(test_chunk_partial_or_damaged_is_a_miss),
		cmocka_unit_test(test_chunk_delete_reaches_the_store),
		cmocka_unit_test(test_seq_create_over_a_chunk_in_the_store),
		cmocka_unit_test(test_published_ahead_of_eviction),
		cmocka_unit_test(test_chunk_type_not_kept_costs_no_round),
		/* Last: it kills a node for good. */
		cmocka_unit_test(test_killed_store_node_is_a_miss_in_bounded_time),
	};

	return cmocka_run_group_tests(tests, setup, teardown_all);
}
