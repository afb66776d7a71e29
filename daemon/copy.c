/* SPDX-License-Identifier: MIT */
/*
 * copy.c - batched, run-coalescing page copies between tiers (see copy.h).
 */
#include <string.h>
#include <time.h>

#include "clock.h"
#include "copy.h"

void copy_begin(struct copy_batch *b, const struct backend_ops *be,
		void *be_ctx, enum copy_dir dir, enum copy_mode mode,
		const struct tier_mem *dst, const struct tier_mem *src,
		uint64_t page_bytes)
{
	b->be = be;
	b->be_ctx = be_ctx;
	b->dir = dir;
	b->mode = mode;
	b->dst = dst;
	b->src = src;
	b->page_bytes = page_bytes;
	b->bytes = 0;
	b->sync_ns = 0;
	b->n = 0;
	b->fence = 0;
	b->err = 0;
	b->errmsg.msg[0] = '\0';
}

static void copy_flush(struct copy_batch *b)
{
	int ret;

	if (!b->n)
		return;
	if (b->mode == COPY_ASYNC) {
		uint64_t fence = 0;

		ret = b->be->copy_async(b->be_ctx, b->dir, b->dst, b->src,
					b->runs, b->n, &fence, &b->errmsg);
		if (fence > b->fence)
			b->fence = fence;
	} else {
		uint64_t t0 = mono_ns();

		ret = b->be->copy(b->be_ctx, b->dir, b->dst, b->src, b->runs,
				  b->n, &b->errmsg);
		b->sync_ns += mono_ns() - t0;
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
