/* SPDX-License-Identifier: MIT */
/*
 * test_gpu_issuer.c - the cuda backend's onload issuer
 * (daemon/engine/backend_cuda_issue.c) through backend_ops on device 0,
 * with the issuer and with KVPOOL_ONLOAD_INLINE=1 (the caller enqueues):
 *
 *  - a burst of 100 onloads, more than the issuer's queue (32) and the
 *    fence ring (64) hold, gets strictly increasing fences that land in
 *    order (once the last has, every earlier one says so) and every
 *    device page holds its host page's bytes;
 *  - a synchronous device -> device copy asked for right after an onload
 *    (a copy on write of the page the onload fills) copies the onloaded
 *    bytes, as stream order gave it when onloads were enqueued inline,
 *    50 times with fresh bytes;
 *  - printed, not asserted: the caller's time per copy_async of 8 runs
 *    with the issuer and inline: what a worker pays per onload.
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

#include "backend.h"
#include "clock.h"
#include "gpu_test_util.h"

#define DEVICE 0
#define PAGE (64u << 10)
#define FRAMES 128u
#define BURST 100u

struct fx {
	void *ctx;
	struct tier_mem dev, host;
};

static void fx_open(struct fx *f, bool inline_onloads)
{
	struct errbuf e = { .msg = "" };

	if (inline_onloads)
		setenv("KVPOOL_ONLOAD_INLINE", "1", 1);
	else
		unsetenv("KVPOOL_ONLOAD_INLINE");
	if (backend_cuda_open(DEVICE, &f->ctx, &e))
		fail_msg("backend_cuda_open: %s", e.msg);
	unsetenv("KVPOOL_ONLOAD_INLINE");
	if (backend_cuda.tier_alloc(f->ctx, KVP_TIER_DEVICE, (uint64_t)FRAMES * PAGE,
				    &f->dev, &e) ||
	    backend_cuda.tier_alloc(f->ctx, KVP_TIER_HOST, (uint64_t)FRAMES * PAGE,
				    &f->host, &e))
		fail_msg("tier_alloc: %s", e.msg);
}

static void fx_close(struct fx *f)
{
	backend_cuda.tier_free(f->ctx, &f->dev);
	backend_cuda.tier_free(f->ctx, &f->host);
	backend_cuda_close(f->ctx);
}

static void fill(struct fx *f, uint32_t frame, uint64_t seed)
{
	uint64_t *p = (uint64_t *)((char *)f->host.base + (size_t)frame * PAGE);

	for (size_t i = 0; i < PAGE / 8; i++)
		p[i] = seed * 0x9e3779b97f4a7c15ull + i;
}

/* Device frame dframe holds what host frame hframe held when filled. */
static void expect_frame(struct fx *f, uint32_t dframe, uint32_t hframe,
			 const char *when)
{
	unsigned char *got = malloc(PAGE);
	struct errbuf e = { .msg = "" };

	assert_non_null(got);
	if (backend_cuda.read(f->ctx, &f->dev, (uint64_t)dframe * PAGE, got, PAGE, &e))
		fail_msg("%s: read of device frame %u: %s", when, dframe, e.msg);
	if (memcmp(got, (char *)f->host.base + (size_t)hframe * PAGE, PAGE))
		fail_msg("%s: device frame %u differs from host frame %u", when,
			 dframe, hframe);
	free(got);
}

static void burst_lands_in_order(bool inline_onloads)
{
	uint64_t fence[BURST];
	struct errbuf e = { .msg = "" };
	struct fx f;

	fx_open(&f, inline_onloads);
	for (uint32_t i = 0; i < BURST; i++) {
		struct copy_run r = { .dst_off = (uint64_t)i * PAGE,
				      .src_off = (uint64_t)i * PAGE, .bytes = PAGE };

		fill(&f, i, i + 1);
		if (backend_cuda.copy_async(f.ctx, COPY_H2D, &f.dev, &f.host, &r, 1,
					    &fence[i], &e))
			fail_msg("copy_async %u: %s", i, e.msg);
		assert_true(fence[i] > 0);
		if (i)
			assert_true(fence[i] > fence[i - 1]);
	}
	backend_cuda.fence_wait(f.ctx, fence[BURST - 1]);
	for (uint32_t i = 0; i < BURST; i++)
		assert_int_equal(backend_cuda.fence_done(f.ctx, fence[i]), 1);
	for (uint32_t i = 0; i < BURST; i++)
		expect_frame(&f, i, i, "after the burst");
	fx_close(&f);
}

static void copy_after_onload_reads_its_bytes(bool inline_onloads)
{
	struct errbuf e = { .msg = "" };
	struct fx f;

	fx_open(&f, inline_onloads);
	for (uint32_t i = 0; i < 50; i++) {
		uint32_t h = i % 8, a = 2 * (i % 8), b = a + 1;
		struct copy_run on = { .dst_off = (uint64_t)a * PAGE,
				       .src_off = (uint64_t)h * PAGE, .bytes = PAGE };
		struct copy_run cow = { .dst_off = (uint64_t)b * PAGE,
					.src_off = (uint64_t)a * PAGE, .bytes = PAGE };
		uint64_t fc;

		fill(&f, h, 1000 + i);
		if (backend_cuda.copy_async(f.ctx, COPY_H2D, &f.dev, &f.host, &on, 1,
					    &fc, &e))
			fail_msg("onload %u: %s", i, e.msg);
		/* No wait for the fence: the copy must come after it. */
		if (backend_cuda.copy(f.ctx, COPY_D2D, &f.dev, &f.dev, &cow, 1, &e))
			fail_msg("device copy %u: %s", i, e.msg);
		expect_frame(&f, b, h, "device copy right after an onload");
		backend_cuda.fence_wait(f.ctx, fc);
	}
	fx_close(&f);
}

/* What the caller pays per onload of 8 runs (printed, not asserted). */
static double enqueue_us(bool inline_onloads)
{
	struct copy_run r[8];
	struct errbuf e = { .msg = "" };
	uint64_t fence = 0, n = 0;
	struct fx f;

	fx_open(&f, inline_onloads);
	for (uint32_t i = 0; i < 8; i++)
		r[i] = (struct copy_run){ .dst_off = (uint64_t)(2 * i) * PAGE,
					  .src_off = (uint64_t)(2 * i) * PAGE,
					  .bytes = PAGE };
	for (uint32_t i = 0; i < 1000; i++) {
		uint64_t s = mono_ns();

		if (backend_cuda.copy_async(f.ctx, COPY_H2D, &f.dev, &f.host, r, 8,
					    &fence, &e))
			fail_msg("copy_async: %s", e.msg);
		n += mono_ns() - s;
		if (i % 16 == 15)
			backend_cuda.fence_wait(f.ctx, fence); /* not the ring's wait */
	}
	backend_cuda.fence_wait(f.ctx, fence);
	fx_close(&f);
	return (double)n / 1000 / 1000;
}

static void test_burst_with_the_issuer(void **state)
{
	(void)state;
	burst_lands_in_order(false);
}

static void test_burst_inline(void **state)
{
	(void)state;
	burst_lands_in_order(true);
}

static void test_copy_after_onload_with_the_issuer(void **state)
{
	(void)state;
	copy_after_onload_reads_its_bytes(false);
}

static void test_copy_after_onload_inline(void **state)
{
	(void)state;
	copy_after_onload_reads_its_bytes(true);
}

static void test_caller_cost(void **state)
{
	double with = enqueue_us(false), inl = enqueue_us(true);

	(void)state;
	gpu_test_say("issuer", "copy_async of 8 runs, caller's time: %.2f us with "
		     "the issuer, %.2f us inline (%.1fx)", with, inl,
		     with > 0 ? inl / with : 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_burst_with_the_issuer),
		cmocka_unit_test(test_burst_inline),
		cmocka_unit_test(test_copy_after_onload_with_the_issuer),
		cmocka_unit_test(test_copy_after_onload_inline),
		cmocka_unit_test(test_caller_cost),
	};

	if (gpu_test_no_device())
		return 77;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
