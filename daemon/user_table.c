/* SPDX-License-Identifier: MIT */
/*
 * user_table.c - user id -> history hash table (see user_table.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "engine_internal.h"
#include "mix64.h"

#define INITIAL_BUCKETS 1024

/* The low bits of the mix pick the bucket (the shards take the high ones). */
static inline uint64_t hash_user(uint64_t x)
{
	return mix64(x);
}

int user_table_init(struct user_table *t)
{
	t->buckets = calloc(INITIAL_BUCKETS, sizeof(*t->buckets));
	if (!t->buckets)
		return -ENOMEM;
	t->mask = INITIAL_BUCKETS - 1;
	t->count = 0;
	return 0;
}

void user_table_fini(struct user_table *t)
{
	free(t->buckets);
	t->buckets = NULL;
}

struct history *user_table_find(const struct user_table *t, uint64_t user)
{
	struct history *h = t->buckets[hash_user(user) & t->mask];

	while (h && h->user != user)
		h = h->hnext;
	return h;
}

int user_table_reserve(struct user_table *t)
{
	uint64_t nb = (t->mask + 1) * 2;
	struct history **b;

	if (t->count < t->mask + 1)
		return 0;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return -ENOMEM;
	for (uint64_t i = 0; i <= t->mask; i++) {
		struct history *h = t->buckets[i], *next;

		for (; h; h = next) {
			uint64_t j = hash_user(h->user) & (nb - 1);

			next = h->hnext;
			h->hnext = b[j];
			b[j] = h;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->mask = nb - 1;
	return 0;
}

void user_table_insert(struct user_table *t, struct history *h)
{
	struct history **b = &t->buckets[hash_user(h->user) & t->mask];

	h->hnext = *b;
	*b = h;
	t->count++;
}

void user_table_remove(struct user_table *t, struct history *h)
{
	struct history **p = &t->buckets[hash_user(h->user) & t->mask];

	while (*p != h)
		p = &(*p)->hnext;
	*p = h->hnext;
	t->count--;
}

int user_table_foreach(struct user_table *t,
		       int (*fn)(struct history *h, void *arg), void *arg)
{
	for (uint64_t i = 0; i <= t->mask; i++) {
		struct history *h = t->buckets[i], *next;
		int ret;

		for (; h; h = next) {
			next = h->hnext; /* fn may free h */
			ret = fn(h, arg);
			if (ret)
				return ret;
		}
	}
	return 0;
}
