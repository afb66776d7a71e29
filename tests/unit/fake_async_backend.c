/* SPDX-License-Identifier: MIT */
/*
 * fake_async_backend.c - onloads that land when the test says (see
 * fake_async_backend.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_async_backend.h"

static bool overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
	return a < b + bn && b < a + an;
}

/* Record a conflict of an access to [off, off+bytes) of m with the queue:
 * a write clashes with any queued access, a read with a queued write. */
static void check_access(struct fake_async *f, const char *what,
			 const struct tier_mem *m, uint64_t off, uint64_t bytes,
			 bool write)
{
	for (uint32_t i = 0; i < f->nq; i++) {
		const struct fake_copy *c = &f->q[i];
		bool hit = (c->dst == m && overlap(off, bytes, c->run.dst_off,
						   c->run.bytes)) ||
			   (write && c->src == m &&
			    overlap(off, bytes, c->run.src_off, c->run.bytes));

		if (!hit)
			continue;
		if (!f->conflicts++)
			snprintf(f->conflict, sizeof(f->conflict), "%s %s bytes [%"
				 PRIu64 ", +%" PRIu64 ") that the onload of fence %"
				 PRIu64 " still %s", what, write ? "writes" : "reads",
				 off, bytes, c->fence, c->dst == m ? "writes" : "reads");
		return;
	}
}

static void check_runs(struct fake_async *f, const char *what,
		       const struct tier_mem *dst, const struct tier_mem *src,
		       const struct copy_run *runs, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		check_access(f, what, dst, runs[i].dst_off, runs[i].bytes, true);
		check_access(f, what, src, runs[i].src_off, runs[i].bytes, false);
	}
}

static int fake_tier_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
			   struct tier_mem *out, struct errbuf *e)
{
	return backend_shm.tier_alloc(NULL, tier, bytes, out, e);
}

static void fake_tier_free(void *ctx, struct tier_mem *m)
{
	struct fake_async *f = ctx;

	if (f->nq)
		check_access(f, "tier_free", m, 0, m->bytes, true);
	backend_shm.tier_free(NULL, m);
}

static int fake_copy_sync(void *ctx, enum copy_dir dir,
			  const struct tier_mem *dst, const struct tier_mem *src,
			  const struct copy_run *runs, uint32_t n,
			  struct errbuf *e)
{
	check_runs(ctx, "a synchronous copy", dst, src, runs, n);
	return backend_shm.copy(NULL, dir, dst, src, runs, n, e);
}

static int fake_copy_async(void *ctx, enum copy_dir dir,
			   const struct tier_mem *dst, const struct tier_mem *src,
			   const struct copy_run *runs, uint32_t n,
			   uint64_t *fence, struct errbuf *e)
{
	struct fake_async *f = ctx;

	*fence = 0;
	if (f->land_at_once)
		return fake_copy_sync(ctx, dir, dst, src, runs, n, e);
	check_runs(f, "a queued copy", dst, src, runs, n);
	if (f->nq + n > f->capq) {
		uint32_t cap = f->capq ? f->capq : 64;
		struct fake_copy *q;

		while (cap < f->nq + n)
			cap *= 2;
		q = realloc(f->q, cap * sizeof(*q));
		if (!q)
			return errbuf_set(e, -ENOMEM, "fake backend: out of memory");
		f->q = q;
		f->capq = cap;
	}
	*fence = ++f->issued;
	for (uint32_t i = 0; i < n; i++)
		f->q[f->nq++] = (struct fake_copy){ .fence = *fence, .dst = dst,
						    .src = src, .run = runs[i] };
	f->async_calls++;
	return 0;
}

void fake_land(struct fake_async *f, uint64_t fence)
{
	uint32_t i = 0;

	if (fence > f->issued)
		fence = f->issued;
	while (i < f->nq && f->q[i].fence <= fence) {
		const struct fake_copy *c = &f->q[i++];

		memcpy((char *)c->dst->base + c->run.dst_off,
		       (const char *)c->src->base + c->run.src_off, c->run.bytes);
	}
	memmove(f->q, f->q + i, (f->nq - i) * sizeof(*f->q));
	f->nq -= i;
	if (fence > f->landed)
		f->landed = fence;
}

void fake_land_all(struct fake_async *f)
{
	fake_land(f, f->issued);
}

static int fake_fence_done(void *ctx, uint64_t fence)
{
	const struct fake_async *f = ctx;

	return fence <= f->landed;
}

static void fake_fence_wait(void *ctx, uint64_t fence)
{
	struct fake_async *f = ctx;

	if (fence <= f->landed)
		return;
	f->waits++;
	fake_land(f, fence);
}

static uint64_t fake_fence_ns(void *ctx, uint64_t first, uint64_t last)
{
	struct fake_async *f = ctx;

	if (!first || first > last || last > f->landed) {
		if (!f->conflicts++)
			snprintf(f->conflict, sizeof(f->conflict), "fence_ns(%" PRIu64
				 ", %" PRIu64 ") with fences <= %" PRIu64 " landed",
				 first, last, f->landed);
		return 0;
	}
	f->ns_fences += last - first + 1;
	return (last - first + 1) * FAKE_FENCE_NS;
}

static int fake_read(void *ctx, const struct tier_mem *m, uint64_t off,
		     void *dst, uint64_t bytes, struct errbuf *e)
{
	check_access(ctx, "a read", m, off, bytes, false);
	return backend_shm.read(NULL, m, off, dst, bytes, e);
}

bool fake_busy(const struct fake_async *f, const struct tier_mem *m,
	       uint64_t off, uint64_t bytes)
{
	for (uint32_t i = 0; i < f->nq; i++) {
		const struct fake_copy *c = &f->q[i];

		if ((c->dst == m && overlap(off, bytes, c->run.dst_off, c->run.bytes)) ||
		    (c->src == m && overlap(off, bytes, c->run.src_off, c->run.bytes)))
			return true;
	}
	return false;
}

void fake_fini(struct fake_async *f)
{
	free(f->q);
	f->q = NULL;
	f->nq = f->capq = 0;
}

const struct backend_ops fake_async_backend = {
	.name = "fake-async",
	.tier_alloc = fake_tier_alloc,
	.tier_free = fake_tier_free,
	.copy = fake_copy_sync,
	.copy_async = fake_copy_async,
	.fence_done = fake_fence_done,
	.fence_wait = fake_fence_wait,
	.fence_ns = fake_fence_ns,
	.read = fake_read,
};
