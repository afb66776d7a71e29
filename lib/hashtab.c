/* SPDX-License-Identifier: MIT */
/*
 * hashtab.c - the chained hash table (see hashtab.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "hashtab.h"

static uint64_t round_pow2(uint64_t n)
{
	uint64_t nb = 1;

	while (nb < n && nb < (1ull << 62))
		nb <<= 1;
	return nb;
}

static int table_alloc(struct hashtab *t, uint64_t buckets, bool fixed)
{
	uint64_t nb = round_pow2(buckets);

	t->buckets = calloc(nb, sizeof(*t->buckets));
	if (!t->buckets)
		return -ENOMEM;
	t->mask = nb - 1;
	t->count = 0;
	t->fixed = fixed;
	return 0;
}

int hashtab_init(struct hashtab *t, uint64_t buckets)
{
	return table_alloc(t, buckets, false);
}

int hashtab_init_fixed(struct hashtab *t, uint64_t buckets)
{
	return table_alloc(t, buckets, true);
}

void hashtab_fini(struct hashtab *t)
{
	free(t->buckets);
	t->buckets = NULL;
	t->mask = 0;
	t->count = 0;
}

int hashtab_reserve(struct hashtab *t, uint64_t n)
{
	uint64_t nb = t->mask + 1;
	struct hnode **b;

	if (t->fixed || t->count + n <= nb)
		return 0;
	while (t->count + n > nb)
		nb *= 2;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return -ENOMEM;
	/* Each old chain front to back, each node first in its new chain. */
	for (uint64_t i = 0; i <= t->mask; i++) {
		struct hnode *x = t->buckets[i], *next;

		for (; x; x = next) {
			struct hnode **nb_head = &b[x->hash & (nb - 1)];

			next = x->next;
			x->next = *nb_head;
			*nb_head = x;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->mask = nb - 1;
	return 0;
}

void hashtab_insert(struct hashtab *t, struct hnode *n, uint64_t hash)
{
	struct hnode **b = &t->buckets[hash & t->mask];

	n->hash = hash;
	n->next = *b;
	*b = n;
	t->count++;
}

void hashtab_remove(struct hashtab *t, struct hnode *n)
{
	struct hnode **p = &t->buckets[n->hash & t->mask];

	while (*p != n)
		p = &(*p)->next;
	*p = n->next;
	n->next = NULL;
	t->count--;
}

struct hnode *hashtab_find(const struct hashtab *t, uint64_t hash,
			   bool (*eq)(const struct hnode *n, const void *key),
			   const void *key)
{
	for (struct hnode *n = hashtab_chain(t, hash); n; n = n->next)
		if (n->hash == hash && eq(n, key))
			return n;
	return NULL;
}

uint64_t hashtab_hash_bytes(const void *key, size_t len)
{
	const unsigned char *p = key;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return mix64(h);
}
