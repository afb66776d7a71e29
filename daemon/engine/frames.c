/* SPDX-License-Identifier: MIT */
/*
 * frames.c - a tier's frame pool and a shard's cache of it (see frames.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bug.h"
#include "frames.h"

int frame_pool_init(struct frame_pool *p, uint32_t total)
{
	memset(p, 0, sizeof(*p));
	p->stack = malloc(((size_t)total ? total : 1) * sizeof(*p->stack));
	if (!p->stack)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	p->total = total;
	p->nfree = total;
	/* Top of the stack is frame 0, so a fresh tier hands out 0, 1, 2, ... */
	for (uint32_t i = 0; i < total; i++)
		p->stack[i] = total - 1 - i;
	return 0;
}

void frame_pool_fini(struct frame_pool *p)
{
	if (!p->stack)
		return;
	pthread_mutex_destroy(&p->lock);
	free(p->stack);
	p->stack = NULL;
}

int frames_init_shared(struct frames *f, struct frame_pool *p, uint32_t cap)
{
	size_t words = ((size_t)p->total + 63) / 64;

	memset(f, 0, sizeof(*f));
	f->pool = p;
	f->total = p->total;
	f->cap = cap ? cap : 1;
	f->stack = malloc(((size_t)p->total ? p->total : 1) * sizeof(*f->stack));
	f->used = calloc(words ? words : 1, sizeof(*f->used));
	if (!f->stack || !f->used) {
		free(f->stack);
		free(f->used);
		memset(f, 0, sizeof(*f));
		return -ENOMEM;
	}
	return 0;
}

int frames_init(struct frames *f, uint32_t total)
{
	struct frame_pool *p = malloc(sizeof(*p));
	int ret;

	if (!p)
		return -ENOMEM;
	ret = frame_pool_init(p, total);
	if (!ret)
		ret = frames_init_shared(f, p, total);
	if (ret) {
		frame_pool_fini(p);
		free(p);
		memset(f, 0, sizeof(*f));
		return ret;
	}
	f->own_pool = true;
	frames_reserve(f, total); /* all of it, in the pool's order */
	return 0;
}

void frames_fini(struct frames *f)
{
	if (!f->pool)
		return;
	if (f->own_pool) {
		frame_pool_fini(f->pool);
		free(f->pool);
	} else {
		frames_flush(f);
	}
	free(f->stack);
	free(f->used);
	memset(f, 0, sizeof(*f));
}

/* Move the pool's top k frames onto the cache's top, in the pool's order. */
uint32_t frames_reserve(struct frames *f, uint32_t n)
{
	struct frame_pool *p = f->pool;
	uint32_t k;

	if (f->nfree >= n || !frame_pool_free(p))
		return f->nfree;
	pthread_mutex_lock(&p->lock);
	k = n - f->nfree;
	if (k > p->nfree)
		k = p->nfree;
	memcpy(f->stack + f->nfree, p->stack + p->nfree - k, k * sizeof(*f->stack));
	__atomic_store_n(&p->nfree, p->nfree - k, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&p->lock);
	f->nfree += k;
	return f->nfree;
}

/* Give the cache's bottom k frames back (the coldest: the top is what was
 * freed last), in their order. */
static void frames_give_back(struct frames *f, uint32_t k)
{
	struct frame_pool *p = f->pool;

	if (!k)
		return;
	pthread_mutex_lock(&p->lock);
	memcpy(p->stack + p->nfree, f->stack, k * sizeof(*f->stack));
	__atomic_store_n(&p->nfree, p->nfree + k, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&p->lock);
	f->nfree -= k;
	memmove(f->stack, f->stack + k, f->nfree * sizeof(*f->stack));
}

void frames_move(struct frames *dst, struct frames *src, uint32_t n)
{
	KVP_BUG_ON(n > src->nfree || dst->pool != src->pool,
		   "frames move within one pool, and only as many as the source has free");
	memcpy(dst->stack + dst->nfree, src->stack + src->nfree - n,
	       n * sizeof(*dst->stack));
	src->nfree -= n;
	dst->nfree += n;
}

void frames_flush(struct frames *f)
{
	if (!f->own_pool)
		frames_give_back(f, f->nfree);
}

bool frames_in_use(const struct frames *f, uint32_t frame)
{
	return frame < f->total && (f->used[frame / 64] >> (frame % 64) & 1);
}

uint32_t frames_alloc(struct frames *f)
{
	uint32_t frame;

	if (!f->nfree && frames_reserve(f, f->cap / 2 + 1) == 0)
		return FRAME_NONE;
	frame = f->stack[--f->nfree];
	f->used[frame / 64] |= 1ull << (frame % 64);
	f->nused++;
	return frame;
}

void frames_free(struct frames *f, uint32_t frame)
{
	if (!frames_in_use(f, frame)) {
		/* An engine bug: continuing would hand one frame to two pages. */
		fprintf(stderr, "kvpool: BUG: free of frame %u not in use (total %u)\n",
			frame, f->total);
		KVP_BUG("a frame is freed only while in use (else two pages share it)");
	}
	f->used[frame / 64] &= ~(1ull << (frame % 64));
	f->nused--;
	f->stack[f->nfree++] = frame;
}

void frames_trim(struct frames *f)
{
	if (f->nfree > f->cap && !f->own_pool)
		frames_give_back(f, f->nfree - f->cap / 2);
}
