/* SPDX-License-Identifier: MIT */
/*
 * fake_async_backend.h - a test backend whose onloads land when the test
 * says so: the shm backend's tiers (host-visible memfds) and synchronous
 * copies, but copy_async() only queues its runs and hands out a fence; the
 * bytes are copied when the fence lands (fake_land, or the engine's
 * fence_wait), so anything that reads the destination early sees stale
 * bytes, as it would on a GPU.
 *
 * It also watches the engine: a synchronous copy, a read or a new queued
 * copy that writes bytes a queued copy reads or writes, or reads bytes a
 * queued copy writes, is a conflict (counted, the first one described) -
 * a frame reused or read while an onload still uses it.
 */
#ifndef KVPOOL_TEST_FAKE_ASYNC_BACKEND_H
#define KVPOOL_TEST_FAKE_ASYNC_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

struct fake_copy {
	uint64_t fence;
	const struct tier_mem *dst, *src;
	struct copy_run run;
};

struct fake_async {
	bool land_at_once;      /* true: copy_async behaves like copy (fence 0) */
	uint64_t issued;        /* last fence handed out */
	uint64_t landed;        /* every fence <= landed has landed */
	struct fake_copy *q;    /* queued runs, in fence order */
	uint32_t nq, capq;
	uint32_t async_calls;   /* copy_async calls that queued something */
	uint32_t waits;         /* fence_wait calls that had to land a fence */
	/* fence_ns: FAKE_FENCE_NS a fence; every fence asked for is counted
	 * (twice for one asked twice), one not landed is a conflict. */
	uint64_t ns_fences;
	uint32_t conflicts;
	char conflict[256];     /* the first conflict */
};

/* The device time fence_ns says each fence's copies took. */
#define FAKE_FENCE_NS 1000u

/* ctx: a struct fake_async, zeroed (or land_at_once set) by the test. */
extern const struct backend_ops fake_async_backend;

/* Land every fence <= fence, in order (copies the queued bytes). */
void fake_land(struct fake_async *f, uint64_t fence);
/* Land everything queued. */
void fake_land_all(struct fake_async *f);
/* Does a queued copy read or write bytes [off, off+bytes) of tier m? */
bool fake_busy(const struct fake_async *f, const struct tier_mem *m,
	       uint64_t off, uint64_t bytes);
/* Free the queue (the tiers are the engine's). */
void fake_fini(struct fake_async *f);

#endif /* KVPOOL_TEST_FAKE_ASYNC_BACKEND_H */
