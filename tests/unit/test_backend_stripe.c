/* SPDX-License-Identifier: MIT */
/*
 * test_backend_stripe.c - the striped backend of a tensor-parallel pool
 * (daemon/engine/backend_stripe.c) over two rank backends: the device
 * tier is one allocation per rank of frames * rank_page_bytes; copies of
 * multi-frame runs land rank r's page of frame f at f * rank_page_bytes of
 * rank r's allocation and at host offset h * page_bytes + r *
 * rank_page_bytes; device to device copies per rank; read() gathers; a
 * fence or ticket lands when every rank's has (over the fake async
 * backend, whose copies land when the test says).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "fake_async_backend.h"

#define RPB 64u            /* rank page bytes */
#define PB (2 * RPB)       /* the engine's page: both ranks' */
#define FRAMES 8u

struct fix {
	void *ctx;
	struct tier_mem dev, host;
};

static int setup_shm(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	struct errbuf e = { .msg = "" };

	assert_non_null(f);
	assert_int_equal(backend_stripe_open(&backend_shm, NULL, 2, RPB, &f->ctx,
					     &e), 0);
	assert_int_equal(backend_stripe.tier_alloc(f->ctx, KVP_TIER_DEVICE,
						   FRAMES * PB, &f->dev, &e), 0);
	assert_int_equal(backend_stripe.tier_alloc(f->ctx, KVP_TIER_HOST,
						   FRAMES * PB, &f->host, &e), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	backend_stripe.tier_free(f->ctx, &f->dev);
	backend_stripe.tier_free(f->ctx, &f->host);
	backend_stripe_close(f->ctx);
	free(f);
	return 0;
}

/* Rank r's mapping of the device tier, as its client maps it. */
static unsigned char *rank_map(struct fix *f, uint32_t r)
{
	uint64_t bytes = 0;
	int fd = backend_stripe_fd(f->ctx, &f->dev, r, &bytes);
	void *p;

	assert_true(fd >= 0);
	assert_int_equal(bytes, FRAMES * RPB);
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	return p;
}

static unsigned char byte_of(uint32_t frame, uint32_t rank, uint32_t i)
{
	return (unsigned char)(frame * 31 + rank * 101 + i * 7 + 1);
}

static void test_alloc_per_rank(void **state)
{
	struct fix *f = *state;
	uint64_t b0 = 0, b1 = 0;
	int fd0 = backend_stripe_fd(f->ctx, &f->dev, 0, &b0);
	int fd1 = backend_stripe_fd(f->ctx, &f->dev, 1, &b1);

	assert_false(f->dev.host_visible);
	assert_int_equal(f->dev.bytes, FRAMES * PB);
	assert_int_equal(f->dev.fd, fd0);
	assert_true(fd0 >= 0 && fd1 >= 0 && fd0 != fd1);
	assert_int_equal(b0, FRAMES * RPB);
	assert_int_equal(b1, FRAMES * RPB);
	assert_int_equal(lseek(fd1, 0, SEEK_END), (off_t)(FRAMES * RPB));
	/* The host tier is rank 0's, whole frames, host-visible. */
	assert_true(f->host.host_visible);
	assert_int_equal(f->host.bytes, FRAMES * PB);
	/* No rank 2, and the host tier is no striped tier. */
	assert_int_equal(backend_stripe_fd(f->ctx, &f->dev, 2, &b0), -EINVAL);
	assert_int_equal(backend_stripe_fd(f->ctx, &f->host, 0, &b0), -EINVAL);
}

static void test_open_refuses(void **state)
{
	struct errbuf e = { .msg = "" };
	void *ctx = NULL;

	(void)state;
	assert_int_equal(backend_stripe_open(&backend_shm, NULL, 1, RPB, &ctx, &e),
			 -EINVAL);
	assert_non_null(strstr(e.msg, "use 2 to 8 ranks"));
	assert_int_equal(backend_stripe_open(&backend_shm, NULL, 9, RPB, &ctx, &e),
			 -EINVAL);
	assert_int_equal(backend_stripe_open(&backend_shm, NULL, 2, 0, &ctx, &e),
			 -EINVAL);
}

/* Device frames 2..4 written per rank, D2H to host frames 5..7 in one
 * run; then H2D back to device frames 0..2; each rank sees its own. */
static void test_d2h_h2d_runs(void **state)
{
	struct fix *f = *state;
	struct errbuf e = { .msg = "" };
	unsigned char *m[2] = { rank_map(f, 0), rank_map(f, 1) };
	unsigned char *host = f->host.base;
	struct copy_run run = { .dst_off = 5 * PB, .src_off = 2 * PB,
				.bytes = 3 * PB };

	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t fr = 2; fr < 5; fr++)
			for (uint32_t i = 0; i < RPB; i++)
				m[r][fr * RPB + i] = byte_of(fr, r, i);
	assert_int_equal(backend_stripe.copy(f->ctx, COPY_D2H, &f->host, &f->dev,
					     &run, 1, &e), 0);
	for (uint32_t j = 0; j < 3; j++)
		for (uint32_t r = 0; r < 2; r++)
			for (uint32_t i = 0; i < RPB; i++)
				assert_int_equal(host[(5 + j) * PB + r * RPB + i],
						 byte_of(2 + j, r, i));
	/* Frames the run does not name are untouched. */
	for (uint32_t i = 0; i < 5 * PB; i++)
		assert_int_equal(host[i], 0);

	run = (struct copy_run){ .dst_off = 0, .src_off = 5 * PB, .bytes = 3 * PB };
	assert_int_equal(backend_stripe.copy(f->ctx, COPY_H2D, &f->dev, &f->host,
					     &run, 1, &e), 0);
	for (uint32_t j = 0; j < 3; j++)
		for (uint32_t r = 0; r < 2; r++)
			for (uint32_t i = 0; i < RPB; i++)
				assert_int_equal(m[r][j * RPB + i], byte_of(2 + j, r, i));

	/* read() of the logical device tier: frame 3, both ranks' pages,
	 * and a range that starts inside rank 0's page and ends in rank 1's. */
	{
		unsigned char buf[PB];

		assert_int_equal(backend_stripe.read(f->ctx, &f->dev, 3 * PB, buf,
						     PB, &e), 0);
		for (uint32_t r = 0; r < 2; r++)
			for (uint32_t i = 0; i < RPB; i++)
				assert_int_equal(buf[r * RPB + i], byte_of(3, r, i));
		assert_int_equal(backend_stripe.read(f->ctx, &f->dev, 4 * PB + RPB - 3,
						     buf, 6, &e), 0);
		for (uint32_t i = 0; i < 3; i++) {
			assert_int_equal(buf[i], byte_of(4, 0, RPB - 3 + i));
			assert_int_equal(buf[3 + i], byte_of(4, 1, i));
		}
		/* Host tier reads go to rank 0's backend as they are. */
		assert_int_equal(backend_stripe.read(f->ctx, &f->host, 6 * PB + RPB,
						     buf, RPB, &e), 0);
		for (uint32_t i = 0; i < RPB; i++)
			assert_int_equal(buf[i], byte_of(3, 1, i));
		assert_int_equal(backend_stripe.read(f->ctx, &f->dev, FRAMES * PB, buf,
						     1, &e), -ERANGE);
	}
	munmap(m[0], FRAMES * RPB);
	munmap(m[1], FRAMES * RPB);
}

static void test_d2d_and_bad_runs(void **state)
{
	struct fix *f = *state;
	struct errbuf e = { .msg = "" };
	unsigned char *m[2] = { rank_map(f, 0), rank_map(f, 1) };
	struct copy_run runs[2] = {
		{ .dst_off = 6 * PB, .src_off = 1 * PB, .bytes = 2 * PB },
		{ .dst_off = 0, .src_off = 4 * PB, .bytes = PB },
	};

	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t i = 0; i < FRAMES * RPB; i++)
			m[r][i] = byte_of(i / RPB, r, i % RPB);
	assert_int_equal(backend_stripe.copy(f->ctx, COPY_D2D, &f->dev, &f->dev,
					     runs, 2, &e), 0);
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t i = 0; i < RPB; i++) {
			assert_int_equal(m[r][6 * RPB + i], byte_of(1, r, i));
			assert_int_equal(m[r][7 * RPB + i], byte_of(2, r, i));
			assert_int_equal(m[r][0 * RPB + i], byte_of(4, r, i));
			assert_int_equal(m[r][5 * RPB + i], byte_of(5, r, i));
		}
	/* Half a frame on the device side is a bug, refused with nothing copied. */
	runs[0] = (struct copy_run){ .dst_off = 0, .src_off = RPB, .bytes = PB };
	assert_int_equal(backend_stripe.copy(f->ctx, COPY_D2H, &f->host, &f->dev,
					     runs, 1, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "not whole frames"));
	for (uint32_t i = 0; i < FRAMES * PB; i++)
		assert_int_equal(((unsigned char *)f->host.base)[i], 0);
	munmap(m[0], FRAMES * RPB);
	munmap(m[1], FRAMES * RPB);
}

/* A move between two striped pools (engine_move.h): pool b's device
 * frames 1..2 and 5 into pool a's 6..7 and 0, rank r to rank r, each rank
 * its own bytes; pools of other geometry and host tiers are refused with
 * nothing copied. */
static void test_copy_peer(void **state)
{
	struct fix *f = *state, *g;
	struct errbuf e = { .msg = "" };
	unsigned char *a[2] = { rank_map(f, 0), rank_map(f, 1) }, *b[2];
	struct copy_run runs[2] = {
		{ .dst_off = 6 * PB, .src_off = 1 * PB, .bytes = 2 * PB },
		{ .dst_off = 0, .src_off = 5 * PB, .bytes = PB },
	};
	void *other = NULL;

	assert_int_equal(setup_shm((void **)&g), 0);
	b[0] = rank_map(g, 0);
	b[1] = rank_map(g, 1);
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t i = 0; i < FRAMES * RPB; i++) {
			b[r][i] = byte_of(i / RPB, r, i % RPB);
			a[r][i] = 0;
		}
	assert_non_null(backend_stripe.copy_peer);
	assert_int_equal(backend_stripe.copy_peer(f->ctx, &f->dev, g->ctx, &g->dev,
						  runs, 2, &e), 0);
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t i = 0; i < RPB; i++) {
			assert_int_equal(a[r][6 * RPB + i], byte_of(1, r, i));
			assert_int_equal(a[r][7 * RPB + i], byte_of(2, r, i));
			assert_int_equal(a[r][0 * RPB + i], byte_of(5, r, i));
			assert_int_equal(a[r][1 * RPB + i], 0);
		}
	/* Another geometry (3 ranks), a host tier, half a frame: refused. */
	assert_int_equal(backend_stripe_open(&backend_shm, NULL, 3, RPB, &other, &e), 0);
	assert_int_equal(backend_stripe.copy_peer(f->ctx, &f->dev, other, &g->dev,
						  runs, 1, &e), -EINVAL);
	assert_non_null(strstr(e.msg, "same ranks and page size"));
	assert_int_equal(backend_stripe.copy_peer(f->ctx, &f->host, g->ctx, &g->dev,
						  runs, 1, &e), -EINVAL);
	runs[0].bytes = RPB;
	assert_int_equal(backend_stripe.copy_peer(f->ctx, &f->dev, g->ctx, &g->dev,
						  runs, 1, &e), -EINVAL);
	assert_int_equal(a[0][1 * RPB], 0);
	backend_stripe_close(other);
	for (uint32_t r = 0; r < 2; r++) {
		munmap(a[r], FRAMES * RPB);
		munmap(b[r], FRAMES * RPB);
	}
	teardown((void **)&g);
}

/* Many frames, scattered (each its own run, reversed): more rank runs
 * than one batch to a rank backend (STRIPE_RUNS, 256). */
#define MANY 600u
static void test_many_runs(void **state)
{
	struct errbuf e = { .msg = "" };
	struct copy_run *runs = calloc(MANY, sizeof(*runs));
	struct tier_mem dev, host;
	unsigned char *m[2], *hb;
	uint64_t bytes;
	void *ctx;

	(void)state;
	assert_non_null(runs);
	assert_int_equal(backend_stripe_open(&backend_shm, NULL, 2, RPB, &ctx, &e), 0);
	assert_int_equal(backend_stripe.tier_alloc(ctx, KVP_TIER_DEVICE, MANY * PB,
						   &dev, &e), 0);
	assert_int_equal(backend_stripe.tier_alloc(ctx, KVP_TIER_HOST, MANY * PB,
						   &host, &e), 0);
	hb = host.base;
	for (uint32_t r = 0; r < 2; r++) {
		int fd = backend_stripe_fd(ctx, &dev, r, &bytes);

		assert_int_equal(bytes, MANY * RPB);
		m[r] = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		assert_true(m[r] != MAP_FAILED);
	}
	for (uint32_t j = 0; j < MANY; j++) {
		runs[j] = (struct copy_run){ .dst_off = (MANY - 1 - j) * PB,
					     .src_off = j * PB, .bytes = PB };
		for (uint32_t i = 0; i < PB; i++)
			hb[j * PB + i] = byte_of(j, i / RPB, i % RPB);
	}
	assert_int_equal(backend_stripe.copy(ctx, COPY_H2D, &dev, &host, runs,
					     MANY, &e), 0);
	for (uint32_t j = 0; j < MANY; j++)
		for (uint32_t r = 0; r < 2; r++)
			for (uint32_t i = 0; i < RPB; i++)
				assert_int_equal(m[r][(MANY - 1 - j) * RPB + i],
						 byte_of(j, r, i));
	/* And back, device -> host, into a cleared host tier. */
	memset(hb, 0, MANY * PB);
	for (uint32_t j = 0; j < MANY; j++)
		runs[j] = (struct copy_run){ .dst_off = j * PB,
					     .src_off = (MANY - 1 - j) * PB, .bytes = PB };
	assert_int_equal(backend_stripe.copy(ctx, COPY_D2H, &host, &dev, runs,
					     MANY, &e), 0);
	for (uint32_t j = 0; j < MANY; j++)
		for (uint32_t i = 0; i < PB; i++)
			assert_int_equal(hb[j * PB + i], byte_of(j, i / RPB, i % RPB));
	munmap(m[0], MANY * RPB);
	munmap(m[1], MANY * RPB);
	backend_stripe.tier_free(ctx, &dev);
	backend_stripe.tier_free(ctx, &host);
	backend_stripe_close(ctx);
	free(runs);
}

/* Fences and tickets over two fake async ranks: the stripe's lands only
 * when both ranks' have; shm ranks (landed at once) give fence 0. */
static void test_fences(void **state)
{
	struct fake_async fa[2] = { { .land_at_once = false }, { .land_at_once = false } };
	void *rctx[2] = { &fa[0], &fa[1] };
	struct errbuf e = { .msg = "" };
	struct tier_mem dev, host;
	struct copy_run run = { .dst_off = PB, .src_off = 0, .bytes = 2 * PB };
	uint64_t fence = 0, fence2 = 0;
	unsigned char *hb, buf[RPB];
	void *ctx;

	(void)state;
	assert_int_equal(backend_stripe_open(&fake_async_backend, rctx, 2, RPB, &ctx,
					     &e), 0);
	assert_int_equal(backend_stripe.tier_alloc(ctx, KVP_TIER_DEVICE, 4 * PB,
						   &dev, &e), 0);
	assert_int_equal(backend_stripe.tier_alloc(ctx, KVP_TIER_HOST, 4 * PB,
						   &host, &e), 0);
	hb = host.base;
	memset(hb, 0x5a, 2 * PB);
	assert_int_equal(backend_stripe.copy_async(ctx, COPY_H2D, &dev, &host, &run,
						   1, &fence, &e), 0);
	assert_true(fence != 0);
	assert_false(backend_stripe.fence_done(ctx, fence));
	fake_land_all(&fa[0]);
	assert_false(backend_stripe.fence_done(ctx, fence)); /* rank 1's is out */
	fake_land_all(&fa[1]);
	assert_true(backend_stripe.fence_done(ctx, fence));
	assert_true(backend_stripe.fence_done(ctx, 0));
	assert_int_equal(backend_stripe.read(ctx, &dev, 2 * PB + RPB, buf, RPB, &e), 0);
	for (uint32_t i = 0; i < RPB; i++)
		assert_int_equal(buf[i], 0x5a);

	/* A second fence is a larger number; fence_wait lands every rank's. */
	assert_int_equal(backend_stripe.copy_async(ctx, COPY_H2D, &dev, &host, &run,
						   1, &fence2, &e), 0);
	assert_true(fence2 > fence);
	backend_stripe.fence_wait(ctx, fence2);
	assert_true(backend_stripe.fence_done(ctx, fence2));
	assert_true(fa[0].landed >= 1 && fa[1].landed >= 1);
	/* fence_ns: the slowest rank's (the fake says FAKE_FENCE_NS a fence). */
	assert_true(backend_stripe.fence_ns(ctx, fence, fence2) >= FAKE_FENCE_NS);

	backend_stripe.tier_free(ctx, &dev);
	backend_stripe.tier_free(ctx, &host);
	backend_stripe_close(ctx);
	fake_fini(&fa[0]);
	fake_fini(&fa[1]);
}

/* On shm ranks every copy lands before it returns: fence and ticket 0,
 * and a ticket waits for nothing. */
static void test_shm_fence_zero(void **state)
{
	struct fix *f = *state;
	struct errbuf e = { .msg = "" };
	struct copy_run run = { .dst_off = 0, .src_off = PB, .bytes = PB };
	uint64_t fence = 1, ticket = 1;

	assert_int_equal(backend_stripe.copy_async(f->ctx, COPY_H2D, &f->dev,
						   &f->host, &run, 1, &fence, &e), 0);
	assert_int_equal(fence, 0);
	assert_int_equal(backend_stripe.copy_start(f->ctx, &f->host, &f->dev, &run,
						   1, &ticket, &e), 0);
	assert_int_equal(ticket, 0);
	assert_int_equal(backend_stripe.copy_wait(f->ctx, ticket), 0);
	for (uint32_t i = 0; i < PB; i++)
		assert_int_equal(((unsigned char *)f->host.base)[i],
				 ((unsigned char *)f->host.base)[PB + i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_alloc_per_rank, setup_shm, teardown),
		cmocka_unit_test(test_open_refuses),
		cmocka_unit_test_setup_teardown(test_d2h_h2d_runs, setup_shm, teardown),
		cmocka_unit_test_setup_teardown(test_d2d_and_bad_runs, setup_shm, teardown),
		cmocka_unit_test_setup_teardown(test_copy_peer, setup_shm, teardown),
		cmocka_unit_test(test_many_runs),
		cmocka_unit_test(test_fences),
		cmocka_unit_test_setup_teardown(test_shm_fence_zero, setup_shm, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
