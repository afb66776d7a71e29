/* SPDX-License-Identifier: MIT */
/*
 * user_table.c - user id -> history hash table (see user_table.h).
 *
 * The hash is mix64(user) (hashtab_hash_u64): its low bits pick the
 * bucket, the shards take the high ones (mix64.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "engine_internal.h"

#define INITIAL_BUCKETS 1024

int user_table_init(struct user_table *t)
{
	return hashtab_init(&t->ht, INITIAL_BUCKETS);
}

void user_table_fini(struct user_table *t)
{
	hashtab_fini(&t->ht);
}

struct history *user_table_find(const struct user_table *t, uint64_t user)
{
	struct hnode *n = hashtab_find_u64(&t->ht, user);

	return n ? hashtab_entry(n, struct history, hnode) : NULL;
}

int user_table_reserve(struct user_table *t)
{
	return hashtab_reserve(&t->ht, 1);
}

void user_table_insert(struct user_table *t, struct history *h)
{
	hashtab_insert(&t->ht, &h->hnode, hashtab_hash_u64(h->user));
}

void user_table_remove(struct user_table *t, struct history *h)
{
	hashtab_remove(&t->ht, &h->hnode);
}

int user_table_foreach(struct user_table *t,
		       int (*fn)(struct history *h, void *arg), void *arg)
{
	struct history *h;

	hashtab_for_each_safe(&t->ht, h, hnode) { /* fn may free h */
		int ret = fn(h, arg);

		if (ret)
			return ret;
	}
	return 0;
}
