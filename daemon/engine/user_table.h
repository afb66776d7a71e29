/* SPDX-License-Identifier: MIT */
/*
 * user_table.h - user id -> history, on lib/hashtab.h keyed by the uint64
 * user id.
 *
 * Intrusive: the history carries its own hnode, so insert never allocates;
 * the bucket array grows (doubling, load factor 1) only in reserve.
 */
#ifndef KVPOOL_USER_TABLE_H
#define KVPOOL_USER_TABLE_H

#include <stdint.h>

#include "hashtab.h"

struct history;

struct user_table {
	struct hashtab ht;
};

int user_table_init(struct user_table *t);
void user_table_fini(struct user_table *t);
struct history *user_table_find(const struct user_table *t, uint64_t user);
/* Make room for one more entry: the only step that can fail (-ENOMEM). */
int user_table_reserve(struct user_table *t);
/* Insert a history whose user is not in the table; call reserve first. */
void user_table_insert(struct user_table *t, struct history *h);
void user_table_remove(struct user_table *t, struct history *h);
static inline uint64_t user_table_count(const struct user_table *t)
{
	return t->ht.count;
}

/*
 * Visit every history; fn may remove (and free) the one it is given.
 * Returns early with fn's value when fn returns non-zero.
 */
int user_table_foreach(struct user_table *t,
		       int (*fn)(struct history *h, void *arg), void *arg);

#endif /* KVPOOL_USER_TABLE_H */
