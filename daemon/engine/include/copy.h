/* SPDX-License-Identifier: MIT */
/*
 * copy.h - the one copy engine: page copies between tiers, batched in runs.
 *
 * Callers add (dst frame, src frame) pairs; pairs that continue the last run
 * on both sides extend it, so contiguous pages move as one copy. A batch has
 * a fixed capacity and flushes itself through the backend when full, so
 * adding never fails for want of memory halfway through an operation.
 *
 * A batch is synchronous (COPY_SYNC: every flush goes through the backend's
 * copy(), landed when copy_end() returns) or asynchronous (COPY_ASYNC:
 * through copy_async(); copy_end() leaves in b->fence the fence of the last
 * flush, which covers the earlier ones because fences land in order), or
 * pipelined (COPY_PIPE, device -> host only: through copy_start(); b->fence
 * is the ticket of the last flush, for copy_wait()), or between two
 * contexts of one backend (COPY_PEER, copy_begin_peer(): one tier of two
 * pools, a history moved between GPUs; memcpy where both tiers are
 * host-visible, else the backend's copy_peer; landed when copy_end()
 * returns).
 */
#ifndef KVPOOL_COPY_H
#define KVPOOL_COPY_H

#include <stdint.h>

#include "backend.h"

#define COPY_BATCH_RUNS 256

enum copy_mode {
	COPY_SYNC,
	COPY_ASYNC,
	COPY_PIPE,
	COPY_PEER,
};

struct copy_batch {
	const struct backend_ops *be;
	void *be_ctx;         /* COPY_PEER: the destination's */
	void *src_ctx;        /* COPY_PEER: the source's */
	enum copy_dir dir;
	enum copy_mode mode;
	const struct tier_mem *dst, *src;
	uint64_t page_bytes;
	uint64_t bytes;   /* total bytes added since copy_begin() */
	uint64_t sync_ns; /* COPY_SYNC, and COPY_ASYNC flushes that landed on
			   * return (fence 0): wall time the copies took */
	uint32_t n;
	uint64_t fence;   /* COPY_ASYNC, COPY_PIPE: what the flushed copies land with */
	uint64_t first_fence; /* COPY_ASYNC: the first flush's fence (0: none) */
	int err;          /* first backend error, sticky until copy_begin() */
	struct errbuf errmsg;
	struct copy_run runs[COPY_BATCH_RUNS];
};

void copy_begin(struct copy_batch *b, const struct backend_ops *be,
		void *be_ctx, enum copy_dir dir, enum copy_mode mode,
		const struct tier_mem *dst, const struct tier_mem *src,
		uint64_t page_bytes);
/* A COPY_PEER batch: src (a tier of src_ctx) into dst (of dst_ctx). */
void copy_begin_peer(struct copy_batch *b, const struct backend_ops *be,
		     void *dst_ctx, void *src_ctx, const struct tier_mem *dst,
		     const struct tier_mem *src, uint64_t page_bytes);
void copy_page(struct copy_batch *b, uint32_t dst_frame, uint32_t src_frame);
/* Flush everything added (COPY_SYNC: landed; COPY_ASYNC: in flight until
 * b->fence lands); returns 0 or the first backend error. */
int copy_end(struct copy_batch *b, struct errbuf *e);

#endif /* KVPOOL_COPY_H */
