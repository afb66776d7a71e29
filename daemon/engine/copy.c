/* SPDX-License-Identifier: MIT */
/*
 * copy.c - batched, run-coalescing page copies between tiers (see copy.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "copy.h"

/*
 * The copy profile (KVPOOL_COPY_PROFILE=FILE, a diagnostic): per direction,
 * the flushes, runs, bytes and wall time of every batch, and a histogram of
 * run lengths in pages, appended to FILE at exit. It says whether copies
 * coalesce and how much each synchronisation carries (issue 14).
 */
#define PROF_BINS 6 /* runs of 1, 2-3, 4-7, 8-15, 16-31, 32+ pages */
static struct {
	uint64_t flushes, runs, bytes, ns;
	uint64_t dst_joined; /* runs whose destination continues the last's */
	uint64_t hist[PROF_BINS];
} prof[3];
static int prof_on = -1;

static void prof_dump(void)
{
	static const char *const dir[3] = { "d2h", "h2d", "d2d" };
	FILE *f = fopen(getenv("KVPOOL_COPY_PROFILE"), "a");

	if (!f)
		return;
	for (int d = 0; d < 3; d++) {
		uint64_t fl = __atomic_load_n(&prof[d].flushes, __ATOMIC_RELAXED);

		if (!fl)
			continue;
		fprintf(f, "copy %s flushes %llu runs %llu bytes %llu sync_ns %llu dst_joined "
			"%llu runs_by_pages", dir[d], (unsigned long long)fl,
			(unsigned long long)prof[d].runs, (unsigned long long)prof[d].bytes,
			(unsigned long long)prof[d].ns, (unsigned long long)prof[d].dst_joined);
		for (int i = 0; i < PROF_BINS; i++)
			fprintf(f, " %llu", (unsigned long long)prof[d].hist[i]);
		fputc('\n', f);
	}
	fclose(f);
}

static bool prof_enabled(void)
{
	int on = __atomic_load_n(&prof_on, __ATOMIC_RELAXED);

	if (on < 0) {
		on = getenv("KVPOOL_COPY_PROFILE") != NULL;
		if (on && __atomic_exchange_n(&prof_on, on, __ATOMIC_RELAXED) < 0)
			atexit(prof_dump);
		__atomic_store_n(&prof_on, on, __ATOMIC_RELAXED);
	}
	return on;
}

static void prof_flush(const struct copy_batch *b, uint64_t ns)
{
	uint64_t bytes = 0;

	if (!prof_enabled() || b->dir > COPY_D2D)
		return;
	for (uint32_t i = 0; i < b->n; i++) {
		uint64_t pages = b->runs[i].bytes / b->page_bytes;
		int bin = 0;

		while (bin < PROF_BINS - 1 && pages >= 2ull << bin)
			bin++;
		__atomic_add_fetch(&prof[b->dir].hist[bin], 1, __ATOMIC_RELAXED);
		if (i && b->runs[i].dst_off == b->runs[i - 1].dst_off + b->runs[i - 1].bytes)
			__atomic_add_fetch(&prof[b->dir].dst_joined, 1, __ATOMIC_RELAXED);
		bytes += b->runs[i].bytes;
	}
	__atomic_add_fetch(&prof[b->dir].flushes, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&prof[b->dir].runs, b->n, __ATOMIC_RELAXED);
	__atomic_add_fetch(&prof[b->dir].bytes, bytes, __ATOMIC_RELAXED);
	__atomic_add_fetch(&prof[b->dir].ns, ns, __ATOMIC_RELAXED);
}

void copy_begin(struct copy_batch *b, const struct backend_ops *be,
		void *be_ctx, enum copy_dir dir, enum copy_mode mode,
		const struct tier_mem *dst, const struct tier_mem *src,
		uint64_t page_bytes)
{
	b->be = be;
	b->be_ctx = be_ctx;
	b->src_ctx = NULL;
	b->dir = dir;
	b->mode = mode;
	b->dst = dst;
	b->src = src;
	b->page_bytes = page_bytes;
	b->bytes = 0;
	b->sync_ns = 0;
	b->n = 0;
	b->fence = 0;
	b->first_fence = 0;
	b->err = 0;
	b->errmsg.msg[0] = '\0';
}

void copy_begin_peer(struct copy_batch *b, const struct backend_ops *be,
		     void *dst_ctx, void *src_ctx, const struct tier_mem *dst,
		     const struct tier_mem *src, uint64_t page_bytes)
{
	copy_begin(b, be, dst_ctx, COPY_D2D, COPY_PEER, dst, src, page_bytes);
	b->src_ctx = src_ctx;
}

/* COPY_PEER: memory both sides can touch is copied here (shm's memfds,
 * every host tier); device memory of two GPUs by the backend. */
static int copy_peer_flush(struct copy_batch *b)
{
	if (b->dst->host_visible && b->src->host_visible) {
		for (uint32_t i = 0; i < b->n; i++)
			memcpy((char *)b->dst->base + b->runs[i].dst_off,
			       (const char *)b->src->base + b->runs[i].src_off,
			       b->runs[i].bytes);
		return 0;
	}
	if (!b->be->copy_peer)
		return errbuf_set(&b->errmsg, -EOPNOTSUPP, "the %s backend cannot "
				  "copy between two pools' device tiers", b->be->name);
	return b->be->copy_peer(b->be_ctx, b->dst, b->src_ctx, b->src, b->runs,
				b->n, &b->errmsg);
}

static void copy_flush(struct copy_batch *b)
{
	int ret;

	if (!b->n)
		return;
	if (b->mode == COPY_PEER) {
		uint64_t t0 = mono_ns();

		ret = b->err ? 0 : copy_peer_flush(b);
		b->sync_ns += mono_ns() - t0;
	} else if (b->mode == COPY_PIPE) {
		uint64_t ticket = 0;

		prof_flush(b, 0);
		ret = b->be->copy_start(b->be_ctx, b->dst, b->src, b->runs, b->n,
					&ticket, &b->errmsg);
		if (ticket > b->fence)
			b->fence = ticket;
	} else if (b->mode == COPY_ASYNC) {
		uint64_t fence = 0, t0 = mono_ns();

		prof_flush(b, 0);
		ret = b->be->copy_async(b->be_ctx, b->dir, b->dst, b->src,
					b->runs, b->n, &fence, &b->errmsg);
		/* Fence 0: the copy landed before it returned (shm), so its wall
		 * time is the copy's; otherwise the backend times it (fence_ns). */
		if (!fence)
			b->sync_ns += mono_ns() - t0;
		if (fence && !b->first_fence)
			b->first_fence = fence;
		if (fence > b->fence)
			b->fence = fence;
	} else {
		uint64_t t0 = mono_ns(), ns;

		ret = b->be->copy(b->be_ctx, b->dir, b->dst, b->src, b->runs,
				  b->n, &b->errmsg);
		ns = mono_ns() - t0;
		b->sync_ns += ns;
		prof_flush(b, ns);
	}
	if (ret && !b->err)
		b->err = ret;
	b->n = 0;
}

void copy_page(struct copy_batch *b, uint32_t dst_frame, uint32_t src_frame)
{
	uint64_t dst = (uint64_t)dst_frame * b->page_bytes;
	uint64_t src = (uint64_t)src_frame * b->page_bytes;
	struct copy_run *last = b->n ? &b->runs[b->n - 1] : NULL;

	b->bytes += b->page_bytes;
	if (last && last->dst_off + last->bytes == dst &&
	    last->src_off + last->bytes == src) {
		last->bytes += b->page_bytes;
		return;
	}
	if (b->n == COPY_BATCH_RUNS)
		copy_flush(b);
	b->runs[b->n++] = (struct copy_run){ .dst_off = dst, .src_off = src,
					     .bytes = b->page_bytes };
}

int copy_end(struct copy_batch *b, struct errbuf *e)
{
	copy_flush(b);
	if (b->err && e)
		*e = b->errmsg;
	return b->err;
}
