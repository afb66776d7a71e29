/* SPDX-License-Identifier: MIT */
/*
 * replay_sim.c - the hit-rate references of a trace (replay_sim.h): the
 * infinite cache, Belady's MIN on tokens (the upper bound) and
 * whole-history LRU, in one pass over the requests.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "replay_sim.h"

#define NEVER UINT64_MAX /* next use of a key that is not asked for again */

/* ---------------------------------------------------------------- MIN */

/* Max-heap of keys by next use: the root is evicted first. */
struct heap {
	uint32_t *k;     /* keys */
	uint32_t *pos;   /* key -> index in k, or UINT32_MAX */
	uint64_t *next;  /* key -> its next request (the priority) */
	uint32_t n;
};

static void heap_swap(struct heap *h, uint32_t a, uint32_t b)
{
	uint32_t x = h->k[a];

	h->k[a] = h->k[b];
	h->k[b] = x;
	h->pos[h->k[a]] = a;
	h->pos[h->k[b]] = b;
}

static void heap_fix(struct heap *h, uint32_t i)
{
	while (i && h->next[h->k[i]] > h->next[h->k[(i - 1) / 2]]) {
		heap_swap(h, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;

		if (l < h->n && h->next[h->k[l]] > h->next[h->k[m]])
			m = l;
		if (r < h->n && h->next[h->k[r]] > h->next[h->k[m]])
			m = r;
		if (m == i)
			return;
		heap_swap(h, i, m);
		i = m;
	}
}

static void heap_set(struct heap *h, uint32_t key, uint64_t next)
{
	h->next[key] = next;
	if (h->pos[key] == UINT32_MAX) {
		h->k[h->n] = key;
		h->pos[key] = h->n++;
	}
	heap_fix(h, h->pos[key]);
}

static void heap_pop(struct heap *h)
{
	uint32_t key = h->k[0];

	heap_swap(h, 0, --h->n);
	h->pos[key] = UINT32_MAX;
	if (h->n)
		heap_fix(h, 0);
}

/* ---------------------------------------------------------------- LRU */

struct lru {
	uint32_t *prev, *next;   /* UINT32_MAX: none */
	uint32_t head, tail;     /* head: most recent */
	uint64_t *pages;
	uint64_t total;
};

static void lru_unlink(struct lru *l, uint32_t k)
{
	if (l->prev[k] != UINT32_MAX)
		l->next[l->prev[k]] = l->next[k];
	else if (l->head == k)
		l->head = l->next[k];
	if (l->next[k] != UINT32_MAX)
		l->prev[l->next[k]] = l->prev[k];
	else if (l->tail == k)
		l->tail = l->prev[k];
	l->prev[k] = l->next[k] = UINT32_MAX;
}

static void lru_push_head(struct lru *l, uint32_t k)
{
	l->prev[k] = UINT32_MAX;
	l->next[k] = l->head;
	if (l->head != UINT32_MAX)
		l->prev[l->head] = k;
	l->head = k;
	if (l->tail == UINT32_MAX)
		l->tail = k;
}

/* ---------------------------------------------------------------- walk */

int sim_run(const struct trace *t, size_t nreq, uint32_t page_tokens,
	    uint64_t capacity_pages, uint64_t t0_ms, uint64_t bucket_ms,
	    uint32_t nbuckets, struct sim_result *r)
{
	const uint32_t K = t->nkeys;
	const uint64_t cap_tokens = capacity_pages * page_tokens;
	uint64_t *last = calloc(K + 1, sizeof(*last));     /* infinite: tokens */
	uint64_t *cached = calloc(K + 1, sizeof(*cached)); /* MIN: tokens */
	uint64_t *lru_tok = calloc(K + 1, sizeof(*lru_tok));
	uint64_t *next_use = malloc((nreq + 1) * sizeof(*next_use));
	uint64_t *seen = malloc((K + 1) * sizeof(*seen));
	struct heap h = { .k = malloc((K + 1) * sizeof(uint32_t)),
			  .pos = malloc((K + 1) * sizeof(uint32_t)),
			  .next = calloc(K + 1, sizeof(uint64_t)) };
	struct lru l = { .prev = malloc((K + 1) * sizeof(uint32_t)),
			 .next = malloc((K + 1) * sizeof(uint32_t)),
			 .head = UINT32_MAX, .tail = UINT32_MAX,
			 .pages = calloc(K + 1, sizeof(uint64_t)) };
	uint64_t total = 0;
	int rc = -ENOMEM;

	r->needed = 0;
	memset(r->hit, 0, sizeof(r->hit));
	if (!last || !cached || !lru_tok || !next_use || !seen || !h.k || !h.pos || !h.next ||
	    !l.prev || !l.next || !l.pages)
		goto out;
	memset(h.pos, 0xff, (K + 1) * sizeof(uint32_t));
	memset(l.prev, 0xff, (K + 1) * sizeof(uint32_t));
	memset(l.next, 0xff, (K + 1) * sizeof(uint32_t));
	for (uint32_t k = 0; k <= K; k++)
		seen[k] = NEVER;
	for (size_t i = nreq; i-- > 0;) {
		next_use[i] = seen[t->req[i].kid];
		seen[t->req[i].kid] = i;
	}

	for (size_t i = 0; i < nreq; i++) {
		const struct trace_req *q = &t->req[i];
		const uint32_t k = q->kid;
		const uint64_t need = trace_tokens(q->end);
		uint64_t hit[NSIM], pages = (need + page_tokens - 1) / page_tokens;
		uint64_t b;

		/* Infinite. */
		hit[SIM_INFINITE] = last[k] < need ? last[k] : need;
		last[k] = need;

		/* MIN on tokens: the request leaves its key holding need tokens
		 * (at most the whole cache); then evict farthest-next-use first. */
		hit[SIM_BEST] = cached[k] < need ? cached[k] : need;
		total += (need < cap_tokens ? need : cap_tokens) - cached[k];
		cached[k] = need < cap_tokens ? need : cap_tokens;
		heap_set(&h, k, next_use[i]);
		while (total > cap_tokens) {
			uint32_t v = h.k[0];
			uint64_t drop = total - cap_tokens;

			if (drop >= cached[v]) {
				drop = cached[v];
				heap_pop(&h);
			}
			cached[v] -= drop;
			total -= drop;
		}

		/* Whole-history LRU over pages. */
		hit[SIM_LRU] = lru_tok[k] < need ? lru_tok[k] : need;
		if (l.pages[k] || lru_tok[k])
			lru_unlink(&l, k);
		l.total += pages - l.pages[k];
		l.pages[k] = pages;
		lru_tok[k] = need;
		lru_push_head(&l, k);
		while (l.total > capacity_pages && l.tail != k) {
			uint32_t v = l.tail;

			l.total -= l.pages[v];
			l.pages[v] = 0;
			lru_tok[v] = 0;
			lru_unlink(&l, v);
		}

		r->needed += need;
		for (int s = 0; s < NSIM; s++)
			r->hit[s] += hit[s];
		if (!nbuckets || !r->bucket_needed)
			continue;
		b = q->ts_ms > t0_ms ? (q->ts_ms - t0_ms) / bucket_ms : 0;
		if (b >= nbuckets)
			b = nbuckets - 1;
		r->bucket_needed[b] += need;
		for (int s = 0; s < NSIM; s++)
			if (r->bucket_hit[s])
				r->bucket_hit[s][b] += hit[s];
	}
	rc = 0;
out:
	free(last);
	free(cached);
	free(lru_tok);
	free(next_use);
	free(seen);
	free(h.k);
	free(h.pos);
	free(h.next);
	free(l.prev);
	free(l.next);
	free(l.pages);
	return rc;
}
