/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_move.c - engine_history_move (engine_move.h) on the cuda
 * backend: two engines, each on a backend context of its own, as two pools
 * of one kvpoold. Always on device 0 twice (two contexts of one GPU: the
 * copy_peer path without a second GPU); with 2 GPUs also from GPU 0 to GPU
 * 1 and back (a peer copy where they reach each other, else staged through
 * pinned host memory: the test says which). For each pair: a history with
 * device pages and one with host pages only move, their bytes read back
 * from the destination exactly as written (engine_read_tokens), the source
 * keeps nothing, engine_check passes on both.
 *
 * Then one host tier shared by two pools' shard sets (shard.h: pool 0's
 * set allocates it, pinned and portable, from its GPU's context; pool 1's
 * set, on the other GPU, takes frames of it): a history of pool 1
 * demoted into it by pool 1's GPU, read there, onloaded back by pool 1's
 * GPU and read from the device, bytes as written; pool 0's history beside
 * it in distinct frames; shard_set_check accounts for both. On GPU 0 twice
 * and, with 2 GPUs, GPU 0's tier used by GPU 1.
 *
 * And a chunk copied between the pools (engine_chunk_copy,
 * share_chunk_copy.c): a root registered and filled in one, copied into the
 * other under the same id, read there (share_chunk_read_tokens) exactly as
 * written; a second copy copies nothing. Same pairs of devices.
 *
 * Exits 77 (skip) with a message where no CUDA device is present.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "backend.h"
#include "engine.h"
#include "engine_move.h"
#include "gpu_test_util.h"
#include "kvp_kernels.h"
#include "kvpool.h"
#include "shard.h"
#include "share.h"

#define CK(x) assert_int_equal((x), cudaSuccess)

static struct kvp_layout L; /* 16 KiB pages */

struct pool {
	int device;
	void *ctx;
	struct engine *eng;
};

static void pool_open(struct pool *p, int device)
{
	struct engine_config ec = {
		.layout = L, .device_frames = 64, .host_frames = 64,
		.backend = &backend_cuda,
	};
	struct errbuf e = { .msg = "" };

	p->device = device;
	if (backend_cuda_open(device, &p->ctx, &e))
		fail_msg("backend_cuda_open(%d): %s", device, e.msg);
	ec.backend_ctx = p->ctx;
	if (engine_create(&p->eng, &ec, &e))
		fail_msg("engine_create on cuda device %d: %s", device, e.msg);
}

static void pool_check(struct pool *p)
{
	struct errbuf e = { .msg = "" };

	if (engine_check(p->eng, &e))
		fail_msg("engine_check (device %d): %s", p->device, e.msg);
}

static void pool_close(struct pool *p)
{
	pool_check(p);
	engine_destroy(p->eng);
	backend_cuda_close(p->ctx);
}

/* kv written into lease's first n slots of p's device tier as a client's
 * kernel would (here through a host image and the CPU reference). */
static void write_lease(struct pool *p, uint64_t lease, uint32_t n, const void *kv)
{
	const struct tier_mem *d = engine_tier(p->eng, KVP_TIER_DEVICE);
	struct kvp_slot *slots = malloc(n * sizeof(*slots));
	unsigned char *img = malloc(d->bytes);
	struct errbuf e = { .msg = "" };

	assert_non_null(slots);
	assert_non_null(img);
	if (engine_lease_slots(p->eng, lease, 0, n, slots, &e))
		fail_msg("slots of lease %#" PRIx64 ": %s", lease, e.msg);
	CK(cudaSetDevice(p->device));
	CK(cudaMemcpy(img, d->base, d->bytes, cudaMemcpyDeviceToHost));
	kvp_append_cpu(&L, img, slots, n, kv);
	CK(cudaMemcpy(d->base, img, d->bytes, cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
	free(img);
	free(slots);
}

/* prepare, write kv, commit, release. */
static void put(struct pool *p, uint64_t user, uint32_t n, const void *kv)
{
	struct errbuf e = { .msg = "" };
	struct engine_lease l;

	if (engine_prepare(p->eng, user, 0, n, 1, &l, &e))
		fail_msg("prepare of user %" PRIu64 ": %s", user, e.msg);
	write_lease(p, l.id, n, kv);
	assert_int_equal(engine_commit(p->eng, l.id, n, &e), 0);
	assert_int_equal(engine_release(p->eng, l.id, &e), 0);
}

static void expect(struct pool *p, uint64_t user, uint32_t n,
		   const unsigned char *want, const char *when)
{
	size_t bytes = (size_t)n * L.token_bytes;
	unsigned char *got = malloc(bytes);
	struct errbuf e = { .msg = "" };

	assert_non_null(got);
	if (engine_read_tokens(p->eng, user, 0, n, got, &e))
		fail_msg("%s: read of user %" PRIu64 ": %s", when, user, e.msg);
	for (size_t i = 0; i < bytes; i++)
		if (got[i] != want[i])
			fail_msg("%s: user %" PRIu64 " byte %zu (token %zu) differs",
				 when, user, i, i / L.token_bytes);
	free(got);
}

static unsigned char *random_kv(uint32_t n)
{
	size_t bytes = (size_t)n * L.token_bytes;
	unsigned char *kv = malloc(bytes);

	assert_non_null(kv);
	for (size_t i = 0; i < bytes; i += 8) {
		uint64_t r = gpu_rng();

		memcpy(kv + i, &r, bytes - i < 8 ? bytes - i : 8);
	}
	return kv;
}

static void move_ok(struct pool *src, struct pool *dst, uint64_t user,
		    uint32_t pages)
{
	struct engine_move_out o;
	struct errbuf e = { .msg = "" };
	struct engine_user_info u;
	int ret = engine_history_move(src->eng, dst->eng, user, &o, &e);

	if (ret)
		fail_msg("move of user %" PRIu64 " from device %d to %d: %d: %s",
			 user, src->device, dst->device, ret, e.msg);
	assert_int_equal(o.pages, pages);
	engine_info(src->eng, user, &u);
	assert_false(u.exists);
	pool_check(src);
	pool_check(dst);
}

static void moves_between(int a, int b)
{
	unsigned char *kv1 = random_kv(40), *kv2 = random_kv(20);
	struct pool p[2];
	struct errbuf e = { .msg = "" };
	struct engine_user_info u;

	gpu_test_say("move", "device %d -> device %d (%s)", a, b,
		     a == b ? "two contexts of one GPU" :
		     backend_cuda_peer_access(a, b) ? "peer to peer" :
		     "through pinned host memory");
	pool_open(&p[0], a);
	pool_open(&p[1], b);
	put(&p[0], 1, 40, kv1);                         /* 3 device pages */
	put(&p[0], 2, 20, kv2);                         /* 2 pages, then host only */
	assert_int_equal(engine_offload(p[0].eng, 2, &e), 2);
	assert_true(engine_evict(p[0].eng, 2, KVP_SEL_DEVICE, &e) >= 0);
	move_ok(&p[0], &p[1], 1, 3);
	move_ok(&p[0], &p[1], 2, 2);
	engine_info(p[1].eng, 1, &u);
	assert_int_equal(u.pages_device, 3);
	engine_info(p[1].eng, 2, &u);
	assert_int_equal(u.pages_host, 2);
	expect(&p[1], 1, 40, kv1, "after the move");
	expect(&p[1], 2, 20, kv2, "after the move (host pages)");
	move_ok(&p[1], &p[0], 1, 3);                    /* and back */
	expect(&p[0], 1, 40, kv1, "after the move back");
	pool_close(&p[1]);
	pool_close(&p[0]);
	free(kv1);
	free(kv2);
}

/* A chunk root of n tokens registered in p, kv written into its fill
 * lease's pages (write_lease), sealed; its id. */
static struct kvp_chunk_id chunk_put(struct pool *p, uint32_t n, const void *kv)
{
	struct errbuf e = { .msg = "" };
	struct share_chunk_reg reg;
	uint32_t tok[64];

	assert_true(n <= 64);
	for (uint32_t i = 0; i < n; i++)
		tok[i] = 3000 + 11 * i;
	if (share_chunk_register(p->eng, tok, n, KVP_CHUNK_SYSTEM, NULL, 1, 1, &reg, &e) ||
	    !reg.created)
		fail_msg("chunk register on device %d: %s", p->device, e.msg);
	write_lease(p, reg.lease.id, n, kv);
	if (share_chunk_seal(p->eng, reg.lease.id, 1, &e))
		fail_msg("chunk seal: %s", e.msg);
	return reg.id;
}

static void chunk_copied_between(int a, int b)
{
	unsigned char *kv = random_kv(40), *got;
	size_t bytes = (size_t)40 * L.token_bytes;
	struct engine_chunk_copy_out out;
	struct errbuf e = { .msg = "" };
	struct kvp_chunk_id id;
	struct pool p[2];

	gpu_test_say("move", "chunk copy device %d -> device %d", a, b);
	pool_open(&p[0], a);
	pool_open(&p[1], b);
	id = chunk_put(&p[0], 40, kv);
	if (engine_chunk_copy(p[0].eng, p[1].eng, &id, 9, 2, &out, &e))
		fail_msg("chunk copy from device %d to %d: %s", a, b, e.msg);
	assert_int_equal(out.entries, 1);
	assert_int_equal(out.pages, 3);
	got = malloc(bytes);
	assert_non_null(got);
	for (int i = 0; i < 2; i++) {
		if (share_chunk_read_tokens(p[i].eng, &id, 0, 40, got, &e))
			fail_msg("chunk read on device %d: %s", p[i].device, e.msg);
		if (memcmp(got, kv, bytes))
			fail_msg("the chunk's bytes on device %d differ from what was "
				 "written", p[i].device);
	}
	assert_int_equal(engine_chunk_copy(p[0].eng, p[1].eng, &id, 9, 3, &out, &e), 0);
	assert_int_equal(out.entries, 0);
	pool_close(&p[1]);
	pool_close(&p[0]);
	free(got);
	free(kv);
}

static void test_move_on_one_gpu(void **state)
{
	(void)state;
	moves_between(0, 0);
}

/* The two-GPU parts skip, saying so, on a machine with one. */
static void need_two_gpus(void)
{
	int n = 0;

	CK(cudaGetDeviceCount(&n));
	if (n < 2) {
		gpu_test_say("move", "SKIP the two-GPU part: %d GPU", n);
		skip();
	}
}

static void test_move_between_two_gpus(void **state)
{
	(void)state;
	need_two_gpus();
	moves_between(0, 1);
	moves_between(1, 0);
}

static struct shard_set *set_open(int device, void **ctx, struct shard_set *host_of)
{
	struct shard_set_config sc = {
		.ec = { .layout = L, .device_frames = 64, .host_frames = 64,
			.backend = &backend_cuda },
		.shards = 1, .reclaim = RECLAIM_OFF, .host_of = host_of,
	};
	struct errbuf e = { .msg = "" };
	struct shard_set *s = NULL;

	if (backend_cuda_open(device, ctx, &e))
		fail_msg("backend_cuda_open(%d): %s", device, e.msg);
	sc.ec.backend_ctx = *ctx;
	if (shard_set_create(&s, &sc, &e))
		fail_msg("shard_set_create on cuda device %d: %s", device, e.msg);
	return s;
}

static void set_check(struct shard_set *s, int device)
{
	struct errbuf e = { .msg = "" };

	if (shard_set_check(s, &e))
		fail_msg("shard_set_check (device %d): %s", device, e.msg);
}

static void host_tier_shared(int a, int b)
{
	unsigned char *kv0 = random_kv(40), *kv1 = random_kv(40);
	struct errbuf e = { .msg = "" };
	struct engine_user_info u;
	struct engine_lease l;
	struct pool p[2] = { { .device = a }, { .device = b } };
	struct shard_set *s[2];

	gpu_test_say("move", "host tier of device %d's pool shared by device %d's",
		     a, b);
	s[0] = set_open(a, &p[0].ctx, NULL);
	s[1] = set_open(b, &p[1].ctx, s[0]);
	p[0].eng = s[0]->v[0].eng;
	p[1].eng = s[1]->v[0].eng;
	assert_ptr_equal(engine_tier(p[1].eng, KVP_TIER_HOST)->base,
			 engine_tier(p[0].eng, KVP_TIER_HOST)->base);
	put(&p[0], 1, 40, kv0);
	put(&p[1], 2, 40, kv1);
	for (int i = 0; i < 2; i++) {
		uint64_t user = 1 + (uint64_t)i;

		/* Demoted by its own GPU into the one host tier. */
		assert_int_equal(engine_offload(p[i].eng, user, &e), 3);
		assert_true(engine_evict(p[i].eng, user, KVP_SEL_DEVICE, &e) >= 0);
		engine_info(p[i].eng, user, &u);
		assert_int_equal(u.pages_device, 0);
		assert_int_equal(u.pages_host, 3);
	}
	set_check(s[0], a); /* both sets' host frames, none held twice */
	expect(&p[0], 1, 40, kv0, "in the shared host tier");
	expect(&p[1], 2, 40, kv1, "in the shared host tier");
	for (int i = 0; i < 2; i++) {
		uint64_t user = 1 + (uint64_t)i;

		/* Onloaded by its own GPU, then read from the device alone. */
		if (engine_prepare(p[i].eng, user, 40, 0, 1, &l, &e))
			fail_msg("onload of user %" PRIu64 ": %s", user, e.msg);
		if (l.fence)
			engine_fence_wait(p[i].eng, l.fence);
		assert_int_equal(engine_release(p[i].eng, l.id, &e), 0);
		assert_true(engine_evict(p[i].eng, user, KVP_SEL_HOST, &e) >= 0);
		engine_info(p[i].eng, user, &u);
		assert_int_equal(u.pages_device, 3);
		assert_int_equal(u.pages_host, 0);
	}
	expect(&p[0], 1, 40, kv0, "onloaded from the shared host tier");
	expect(&p[1], 2, 40, kv1, "onloaded from the shared host tier");
	set_check(s[1], b);
	set_check(s[0], a);
	shard_set_destroy(s[1]); /* the sharer first */
	shard_set_destroy(s[0]);
	backend_cuda_close(p[1].ctx);
	backend_cuda_close(p[0].ctx);
	free(kv0);
	free(kv1);
}

static void test_chunk_copy_on_one_gpu(void **state)
{
	(void)state;
	chunk_copied_between(0, 0);
}

static void test_chunk_copy_between_two_gpus(void **state)
{
	(void)state;
	need_two_gpus();
	chunk_copied_between(0, 1);
	chunk_copied_between(1, 0);
}

static void test_host_tier_shared_on_one_gpu(void **state)
{
	(void)state;
	host_tier_shared(0, 0);
}

static void test_host_tier_shared_by_two_gpus(void **state)
{
	(void)state;
	need_two_gpus();
	host_tier_shared(0, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_move_on_one_gpu),
		cmocka_unit_test(test_move_between_two_gpus),
		cmocka_unit_test(test_chunk_copy_on_one_gpu),
		cmocka_unit_test(test_chunk_copy_between_two_gpus),
		cmocka_unit_test(test_host_tier_shared_on_one_gpu),
		cmocka_unit_test(test_host_tier_shared_by_two_gpus),
	};
	char err[KVP_ERRLEN];

	gpu_rng_seed(0x31u);
	if (gpu_test_no_device())
		return 77;
	if (kvp_layout_init(&L, 2, 2, 64, KVP_DTYPE_BF16, 16, err, sizeof(err))) {
		fprintf(stderr, "layout: %s\n", err);
		return 1;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
