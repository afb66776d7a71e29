/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_remote.c - the tiers below the device for prefix pages on the
 * cuda backend, in-process, on CUDA device 0: the remote tier (a Redis
 * Cluster of three redis-server processes on loopback,
 * tools/common/redis_local.c) and the disk tier (a file in a temporary
 * directory).
 *
 *  - engine A (one kvpoold's pool) computes a prompt's pages on the device
 *    (bytes written as a client kernel would), lets the sequence go and
 *    evicts its prefix pages: each goes device -> host frame -> store or
 *    disk (share_bounce.c), since the CPU cannot read the device tier;
 *  - engine B's lookup of the same tokens is held while the pages are
 *    fetched, then answers with them copied host -> device into its own
 *    frames; the bytes read back from B's device tier are A's;
 *  - the same for a sealed chunk, evicted from A with both tiers (one
 *    device -> host copy feeds both) and acquired by name on B, which has
 *    the store only;
 *  - a user history (remote_user_histories): A's pages written on the GPU,
 *    demoted to the host tier and dropped from it by the reclaimer (written
 *    behind to the store), prepared on B: B's device pages hold A's bytes.
 *
 * Exits 77 (skip) with a message where no CUDA device; the remote case
 * skips itself where there is no redis-server.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "disk_engine.h"
#include "backend.h"
#include "disk_tier.h"
#include "engine.h"
#include "engine_share.h"
#include "gpu_test_util.h"
#include "redis_local.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "share.h"

#define DEVICE 0
#define P 16
#define NTOK (3 * P + 1) /* three full pages and one token */
#define SEED 31

static struct kvp_layout L;
static struct redis_local g_redis;
static struct remote_tier *g_rt;   /* NULL: no redis-server here */
static struct disk_tier *g_dt;
static char g_dir[64];

struct fx {
	void *ctx;
	struct engine *eng;
};

static void fx_open(struct fx *f, struct disk_tier *dt, struct remote_tier *rt)
{
	/* Host frames: the bounce frames of the device <-> store copies. */
	struct engine_config ec = { .layout = L, .device_frames = 16, .host_frames = 8,
				    .backend = &backend_cuda, .disk_tenant = 7,
				    .disk = dt, .remote = rt };
	struct errbuf e = { .msg = "" };

	if (backend_cuda_open(DEVICE, &f->ctx, &e))
		fail_msg("backend_cuda_open: %s", e.msg);
	ec.backend_ctx = f->ctx;
	if (engine_create(&f->eng, &ec, &e))
		fail_msg("engine_create on cuda: %s", e.msg);
}

static void fx_close(struct fx *f)
{
	struct errbuf e = { .msg = "" };

	if (engine_check(f->eng, &e))
		fail_msg("engine_check: %s", e.msg);
	engine_destroy(f->eng);
	backend_cuda_close(f->ctx);
}

/* Token pos's K and V, all layers, [layers][2][heads][dim]. */
static void token_bytes(uint64_t pos, unsigned char *out)
{
	for (uint64_t i = 0; i < L.token_bytes; i++)
		out[i] = (unsigned char)((SEED * 131 + pos * 31 + i * 7) ^ (i >> 8));
}

/* Copy token row <-> (frame, slot) of the device tier, as a kernel would. */
static void token_io(struct engine *eng, uint32_t frame, uint32_t slot,
		     unsigned char *row, bool write)
{
	unsigned char *base = engine_tier(eng, KVP_TIER_DEVICE)->base;

	for (uint32_t l = 0; l < L.layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			unsigned char *d = base + (uint64_t)frame * L.page_bytes +
					   l * L.layer_stride + kv * L.kv_stride +
					   slot * L.token_stride;

			assert_int_equal(write ? cudaMemcpy(d, row, L.token_stride,
							    cudaMemcpyHostToDevice)
					       : cudaMemcpy(row, d, L.token_stride,
							    cudaMemcpyDeviceToHost),
					 cudaSuccess);
			row += L.token_stride;
		}
}

/* A's tokens [0, n) (token_bytes) written into the new tokens of write
 * lease lease on eng's device tier, as a client kernel would, landed. */
static void write_tokens(struct engine *eng, uint64_t lease, uint32_t n)
{
	unsigned char *row = malloc(L.token_bytes);
	struct kvp_slot *s = calloc(n, sizeof(*s));
	struct errbuf e = { .msg = "" };

	assert_non_null(row);
	assert_non_null(s);
	assert_int_equal(engine_lease_slots(eng, lease, 0, n, s, &e), 0);
	for (uint32_t i = 0; i < n; i++) {
		token_bytes(i, row);
		token_io(eng, s[i].frame, s[i].slot, row, true);
	}
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
	free(s);
	free(row);
}

/* Tokens [0, n) in eng's device frames (frames[t / P], slot t % P) are
 * A's (token_bytes); what names the case in a failure. */
static void expect_tokens(struct engine *eng, const uint32_t *frames, uint32_t n,
			  const char *what)
{
	unsigned char *row = malloc(L.token_bytes), *want = malloc(L.token_bytes);

	assert_non_null(row);
	assert_non_null(want);
	for (uint32_t i = 0; i < n; i++) {
		token_io(eng, frames[i / P], i % P, row, false);
		token_bytes(i, want);
		if (memcmp(row, want, L.token_bytes))
			fail_msg("B's token %" PRIu32 " of %s differs from A's", i, what);
	}
	free(row);
	free(want);
}

static int setup(void **state)
{
	struct remote_tier_config c = { .timeout_ms = 2000, .user_histories = true };
	struct disk_tier_config dc = { .size = 16u << 20 };
	struct errbuf e = { .msg = "" };
	char msg[128] = "";
	int ret;

	(void)state;
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvp-gpu-remote-XXXXXX");
	if (!mkdtemp(g_dir))
		return -1;
	dc.dir = g_dir;
	dc.layout = L;
	if (disk_codec_parse("none", &dc.codec, msg, sizeof(msg)) ||
	    disk_tier_open(&g_dt, &dc, &e)) {
		fprintf(stderr, "disk tier: %s%s\n", msg, e.msg);
		return -1;
	}
	ret = redis_local_start(&g_redis, 3);
	if (ret == 77)
		return 0; /* the remote case skips */
	if (ret)
		return ret;
	c.layout = L;
	c.url = g_redis.url;
	if (remote_tier_open(&g_rt, &c, &e)) {
		fprintf(stderr, "remote_tier_open: %s\n", e.msg);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	char path[128];

	(void)state;
	if (g_rt) {
		remote_tier_close(g_rt);
		redis_local_stop(&g_redis);
	}
	disk_tier_close(g_dt);
	snprintf(path, sizeof(path), "%s/kvpool.disk", g_dir);
	unlink(path);
	rmdir(g_dir);
	return 0;
}

/* A computes tok's pages on the device, lets them go and evicts them into
 * the tier below (dt or rt); B (the same tiers) looks them up, and its
 * device pages must hold A's bytes. */
static void a_then_b(struct disk_tier *dt, struct remote_tier *rt, uint32_t tok0,
		     bool publish)
{
	uint32_t tok[NTOK];
	struct errbuf e = { .msg = "" };
	struct engine_lease a;
	struct share_prefix_hit hit;
	struct fx fa, fb;
	int ret, rounds = 0;

	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = tok0 + i * 3u;

	fx_open(&fa, dt, rt);
	/* With a remote tier, seq_alloc first asks the store for the prompt
	 * (held while that round is out, as a ring worker holds it). */
	while ((ret = share_seq_alloc(fa.eng, 1, tok, NTOK, 3, &a, &e)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 5000);
	}
	assert_int_equal(ret, 0);
	assert_int_equal(a.len, 0); /* nobody computed it before */
	rounds = 0;
	write_tokens(fa.eng, a.id, NTOK);
	assert_int_equal(engine_commit(fa.eng, a.id, NTOK, &e), 0);
	engine_release_owner(fa.eng, 3);
	assert_int_equal(share_evictable(fa.eng), NTOK / P);
	if (publish) { /* ahead of eviction (the reclaimer's tick in kvpoold) */
		bool more;

		assert_int_equal(remote_publish(fa.eng, 64, &more), NTOK / P);
		assert_false(more);
	}
	while (share_evictable(fa.eng))
		share_evict_oldest(fa.eng);
	if (rt)
		remote_tier_flush(rt);
	if (dt)
		disk_tier_flush(dt);
	fx_close(&fa);

	fx_open(&fb, dt, rt);
	while ((ret = share_prefix_find(fb.eng, tok, NTOK, &hit)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 5000);
	}
	assert_int_equal(ret, 0);
	assert_int_equal(hit.npages, NTOK / P);
	expect_tokens(fb.eng, hit.frames, hit.npages * P, "the prompt");
	fx_close(&fb);
}

/* A's pages to the store (at eviction, or published ahead of it through
 * host frames, then evicted): the store gets each page once, B's bytes
 * are A's. */
static void through_the_store(uint32_t tok0, bool publish)
{
	struct remote_tier_stats st0, st;

	if (!g_rt)
		skip(); /* no redis-server here */
	remote_tier_stats(g_rt, &st0);
	a_then_b(NULL, g_rt, tok0, publish);
	remote_tier_stats(g_rt, &st);
	assert_int_equal(st.put_pages - st0.put_pages, NTOK / P);
	assert_int_equal(st.written_pages - st0.written_pages, NTOK / P);
	assert_int_equal(st.onloaded_pages - st0.onloaded_pages, NTOK / P);
	assert_int_equal(st.bad_values, 0);
}

static void test_b_gets_a_device_pages_through_the_store(void **state)
{
	(void)state;
	through_the_store(4000, false);
}

/* A fills a chunk on the device and seals it; eviction sends it down to
 * dt and rt at once; B (rt only) acquires it by name: A's bytes. */
static void test_b_gets_a_device_chunk_through_the_store(void **state)
{
	uint32_t tok[NTOK];
	struct remote_tier_stats st0, st;
	struct errbuf e = { .msg = "" };
	struct share_chunk_reg r;
	struct engine_lease b;
	struct fx fa, fb;
	int ret, rounds = 0;

	(void)state;
	if (!g_rt)
		skip(); /* no redis-server here */
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 20000 + i * 5u;
	remote_tier_stats(g_rt, &st0);
	fx_open(&fa, g_dt, g_rt);
	while ((ret = share_chunk_register(fa.eng, tok, NTOK, KVP_CHUNK_CONTEXT, NULL,
					   3, 1, &r, &e)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 5000);
	}
	assert_int_equal(ret, 0);
	assert_true(r.created); /* nobody had it */
	write_tokens(fa.eng, r.lease.id, NTOK);
	assert_int_equal(share_chunk_seal(fa.eng, r.lease.id, 3, &e), 0);
	while (share_evictable(fa.eng))
		share_evict_oldest(fa.eng);
	remote_tier_flush(g_rt);
	disk_tier_flush(g_dt);
	fx_close(&fa);
	remote_tier_stats(g_rt, &st);
	/* Its pages (ceil(NTOK / P)) and its record under both ids. */
	assert_int_equal(st.written_pages - st0.written_pages, (NTOK + P - 1) / P + 2);

	fx_open(&fb, NULL, g_rt);
	rounds = 0;
	while ((ret = share_chunk_acquire(fb.eng, &r.name, 3, 2, &b, &e)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 5000);
	}
	if (ret)
		fail_msg("B's acquire of A's chunk: %d %s", ret, e.msg);
	assert_int_equal(b.len, NTOK);
	expect_tokens(fb.eng, b.frames, NTOK, "the chunk"); /* its page table */
	assert_int_equal(engine_release(fb.eng, b.id, NULL), 0);
	fx_close(&fb);
}

/* A user's history through the store on the GPU. */
static void test_b_gets_a_user_history_through_the_store(void **state)
{
	const uint64_t user = 4242;
	struct errbuf e = { .msg = "" };
	struct engine_lease a, b;
	struct fx fa, fb;
	int ret, rounds = 0;

	(void)state;
	if (!g_rt)
		skip(); /* no redis-server here */
	fx_open(&fa, NULL, g_rt);
	while ((ret = engine_prepare_flags(fa.eng, user, 0, NTOK, 3,
					   ENGINE_PREPARE_DEFER, &a, &e)) == -EINPROGRESS) {
		usleep(1000); /* the store asked for a user nobody has: a miss */
		assert_true(++rounds < 5000);
	}
	assert_int_equal(ret, 0);
	assert_int_equal(a.len, 0);
	write_tokens(fa.eng, a.id, NTOK);
	assert_int_equal(engine_commit(fa.eng, a.id, NTOK, &e), 0);
	assert_int_equal(engine_release(fa.eng, a.id, NULL), 0);
	/* The reclaimer's way: device -> host tier, then dropped from it. */
	assert_true(engine_evict(fa.eng, user, KVP_SEL_DEVICE, &e) > 0);
	assert_true(engine_reclaim_host(fa.eng, UINT32_MAX) > 0);
	remote_tier_flush(g_rt);
	fx_close(&fa);

	fx_open(&fb, NULL, g_rt);
	rounds = 0;
	while ((ret = engine_prepare_flags(fb.eng, user, NTOK, 0, 3,
					   ENGINE_PREPARE_DEFER, &b, &e)) == -EINPROGRESS) {
		usleep(1000);
		assert_true(++rounds < 5000);
	}
	if (ret)
		fail_msg("B's prepare of A's user: %d %s", ret, e.msg);
	assert_true(rounds > 0); /* it was asked of the store */
	assert_int_equal(b.len, NTOK);
	/* The onload: its fence is the promise (backend.h); the GPU's issuer
	 * may not have enqueued it yet (backend_cuda_issue.c). */
	engine_fence_wait(fb.eng, b.fence);
	expect_tokens(fb.eng, b.frames, NTOK, "the user");
	assert_int_equal(engine_release(fb.eng, b.id, NULL), 0);
	fx_close(&fb);
}

static void test_b_gets_a_device_pages_through_the_disk(void **state)
{
	(void)state;
	a_then_b(g_dt, NULL, 9000, false);
}

static void test_b_gets_a_device_pages_published_ahead(void **state)
{
	(void)state;
	through_the_store(6000, true);
}

int main(void)
{
	engine_tier_register(ENGINE_TIER_DISK, &disk_tier_ops);
	engine_tier_register(ENGINE_TIER_REMOTE, &remote_tier_ops);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_b_gets_a_device_pages_through_the_store),
		cmocka_unit_test(test_b_gets_a_device_pages_through_the_disk),
		cmocka_unit_test(test_b_gets_a_device_chunk_through_the_store),
		cmocka_unit_test(test_b_gets_a_device_pages_published_ahead),
		cmocka_unit_test(test_b_gets_a_user_history_through_the_store),
	};
	char err[KVP_ERRLEN];

	if (gpu_test_no_device())
		return 77;
	if (kvp_layout_init(&L, 4, 2, 64, KVP_DTYPE_BF16, P, err, sizeof(err))) {
		fprintf(stderr, "layout: %s\n", err);
		return 1;
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}
