/* SPDX-License-Identifier: MIT */
/*
 * frames.h - the frame allocator of one tier: a pool shared by a pool's
 * shards, and each shard's cache of it (memcached's slab classes and
 * jemalloc's tcache work the same way).
 *
 * A tier is an array of equal frames (one page each). The frame_pool holds
 * the free frames no shard holds, on a stack under its own mutex. A shard's
 * `struct frames` is its view of the tier: a cache of free frames only that
 * shard hands out (no lock: the shard's own lock covers it), refilled from
 * the pool and trimmed back to it in batches, and a bitmap of the frames
 * the shard gave to its pages, which catches a double free or a free of a
 * frame never handed out (engine bugs: they abort loudly).
 *
 * Frames a shard frees land in its own cache, so an engine that evicts to
 * make room gets exactly the frames it freed, whatever other shards do
 * meanwhile: plan, evict, allocate stays exact without a global lock.
 *
 * A single engine (unit tests, kvbench engine, one shard) owns a private
 * pool whose frames all start in its cache: the behaviour of one stack, a
 * fresh tier handing out 0, 1, 2, ... so copies of a burst coalesce.
 *
 * Contracts:
 *  - frames_reserve(f, n) before allocating n frames; after it returns >= n
 *    the next n frames_alloc calls succeed;
 *  - f->nfree is the cache's count; frames free in the pool or other
 *    shards' caches are not this shard's until reserved;
 *  - frame_pool_free() is a racy hint (for the reclaimer's watermarks).
 */
#ifndef KVPOOL_FRAMES_H
#define KVPOOL_FRAMES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define FRAME_NONE UINT32_MAX

struct frame_pool {
	pthread_mutex_t lock;       /* stack and nfree */
	uint32_t total;
	uint32_t nfree;             /* on the stack; read without the lock: a hint */
	uint32_t *stack;            /* stack[0 .. nfree) are free; top = last */
};

struct frames {
	struct frame_pool *pool;
	uint32_t total;             /* the pool's */
	uint32_t nfree;             /* free frames in this cache */
	uint32_t cap;               /* above it, frees go back to the pool */
	uint32_t nused;             /* frames this shard handed out */
	uint32_t *stack;            /* [total]: stack[0 .. nfree) */
	uint64_t *used;             /* bitmap of frames this shard handed out */
	bool own_pool;              /* frames_init made the pool */
};

/* A shared pool of total frames (0 allowed), all free. 0 or -ENOMEM. */
int frame_pool_init(struct frame_pool *p, uint32_t total);
void frame_pool_fini(struct frame_pool *p);
static inline uint32_t frame_pool_free(const struct frame_pool *p)
{
	return __atomic_load_n(&p->nfree, __ATOMIC_RELAXED);
}

/* A private pool with every frame in f's cache (one engine alone). */
int frames_init(struct frames *f, uint32_t total);
/* A shard's cache of p, empty; flushes above cap (>= 1). */
int frames_init_shared(struct frames *f, struct frame_pool *p, uint32_t cap);
/* Frees f (and its pool when private). Cached frames go back to the pool. */
void frames_fini(struct frames *f);

/* Pull frames from the pool until the cache holds n or the pool is empty.
 * Returns the cache's count (>= n on success). */
uint32_t frames_reserve(struct frames *f, uint32_t n);
/* Move n cached frames from src's cache to dst's (two shards of one pool,
 * both locked); src must hold them. */
void frames_move(struct frames *dst, struct frames *src, uint32_t n);
/* Give every cached frame back to the pool (a shared one). */
void frames_flush(struct frames *f);

/* A frame from the cache (refilled from the pool when empty), or
 * FRAME_NONE when neither has one. */
uint32_t frames_alloc(struct frames *f);
/* Give frame back to the cache; aborts on a frame this shard did not hand
 * out. The cache only grows here: an engine evicting until its cache holds
 * what it needs keeps every frame it frees. */
void frames_free(struct frames *f, uint32_t frame);
/* Above cap, give the coldest frames back to the pool (down to cap / 2):
 * called as the shard's lock is dropped (shard.c). */
void frames_trim(struct frames *f);
/* Handed out by this shard (to one of its pages). */
bool frames_in_use(const struct frames *f, uint32_t frame);
static inline uint32_t frames_used(const struct frames *f)
{
	return f->nused;
}

#endif /* KVPOOL_FRAMES_H */
