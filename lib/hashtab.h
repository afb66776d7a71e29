/* SPDX-License-Identifier: MIT */
/*
 * hashtab.h - the one hash table: chained ("open hashing"), intrusive,
 * keyed by a uint64 or by a byte key.
 *
 * An element embeds a struct hnode; the table stores the key's 64-bit hash
 * in it and picks the bucket from its low bits (so a rehash never hashes a
 * key again). Two ways to key it:
 *  - uint64: hashtab_hash_u64(key) is a bijection (mix64.h), so equal
 *    hashes are equal keys and hashtab_find_u64() needs no key compare;
 *  - bytes: the caller hashes the key (hashtab_hash_bytes(), or
 *    hashtab_hash_digest() for a key that is a cryptographic digest
 *    already) and compares keys itself: hashtab_find() with a callback,
 *    or hashtab_for_each_possible() and a memcmp.
 *
 * Reserve before insert: hashtab_reserve(t, n) is the only call that can
 * fail (-ENOMEM, growing the bucket array); the n inserts after it cannot.
 * The engine plans an operation with every fallible step first and then
 * commits it, so it reserves and then inserts. A table made with
 * hashtab_init_fixed() never grows (its size bounds its load: the caller
 * knows how many entries it can ever hold) and needs no reserve.
 *
 * Order: an insert goes first in its chain, and a rehash moves each chain
 * front to back; iteration is bucket by bucket. Deterministic for a given
 * sequence of operations (the model tests compare engines step by step).
 */
#ifndef KVPOOL_LIB_HASHTAB_H
#define KVPOOL_LIB_HASHTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "list.h" /* container_of */
#include "mix64.h"

struct hnode {
	struct hnode *next;  /* chain */
	uint64_t hash;
};

struct hashtab {
	struct hnode **buckets;
	uint64_t mask;       /* buckets - 1, a power of two minus one */
	uint64_t count;
	bool fixed;          /* never grows */
};

/* A table of `buckets` buckets (rounded up to a power of two, at least 1)
 * that grows to keep count <= buckets. -ENOMEM. */
int hashtab_init(struct hashtab *t, uint64_t buckets);
/* A table of `buckets` buckets (rounded up) that never grows. -ENOMEM. */
int hashtab_init_fixed(struct hashtab *t, uint64_t buckets);
/* Free the buckets (the elements are the caller's). */
void hashtab_fini(struct hashtab *t);
/* Room for n more elements: the next n inserts cannot fail. -ENOMEM, with
 * the table unchanged. */
int hashtab_reserve(struct hashtab *t, uint64_t n);
/* Insert n with hash; a growing table must have room (hashtab_reserve). */
void hashtab_insert(struct hashtab *t, struct hnode *n, uint64_t hash);
/* Remove n, which is in t. */
void hashtab_remove(struct hashtab *t, struct hnode *n);
/* First element with hash for which eq(node, key), or NULL. */
struct hnode *hashtab_find(const struct hashtab *t, uint64_t hash,
			   bool (*eq)(const struct hnode *n, const void *key),
			   const void *key);

static inline uint64_t hashtab_hash_u64(uint64_t key)
{
	return mix64(key);
}

/* A byte key that is a uniform digest already (SHA-256): its first 8
 * bytes, little-endian on the hosts kvpool runs on. */
static inline uint64_t hashtab_hash_digest(const void *key)
{
	uint64_t h;

	memcpy(&h, key, sizeof(h));
	return h;
}

/* Any byte key: FNV-1a, then mixed so the low bits are uniform. */
uint64_t hashtab_hash_bytes(const void *key, size_t len);

/* First chain node of hash's bucket (not necessarily with that hash). */
static inline struct hnode *hashtab_chain(const struct hashtab *t,
					  uint64_t hash)
{
	return t->buckets[hash & t->mask];
}

/* The element with uint64 key (hashed with hashtab_hash_u64), or NULL. */
static inline struct hnode *hashtab_find_u64(const struct hashtab *t,
					     uint64_t key)
{
	uint64_t h = hashtab_hash_u64(key);
	struct hnode *n = hashtab_chain(t, h);

	while (n && n->hash != h)
		n = n->next;
	return n;
}

/* Buckets, and the first node of bucket b: for a walk that must start a
 * bucket over after a removal that may take other elements with it. */
static inline uint64_t hashtab_nbuckets(const struct hashtab *t)
{
	return t->buckets ? t->mask + 1 : 0;
}

static inline struct hnode *hashtab_bucket(const struct hashtab *t,
					   uint64_t b)
{
	return t->buckets[b];
}

#define hashtab_entry(ptr, type, member) container_of(ptr, type, member)

/* Every element whose hash is h (the caller compares keys). */
#define hashtab_for_each_possible(t, pos, member, h)                          \
	for (struct hnode *__hn = hashtab_chain(t, h); __hn; __hn = __hn->next) \
		if (__hn->hash == (h) &&                                      \
		    ((pos = hashtab_entry(__hn, __typeof__(*(pos)), member)), 1))

/*
 * Every element, bucket by bucket; the body may remove (and free) pos,
 * and only pos. Two nested loops: `break` leaves only the inner one, so
 * a body that stops early returns or jumps out.
 */
#define hashtab_for_each_safe(t, pos, member)                                \
	for (uint64_t __b = 0; (t)->buckets && __b <= (t)->mask; __b++)     \
		for (struct hnode *__hn = (t)->buckets[__b], *__hx;         \
		     __hn && ((__hx = __hn->next), 1) &&                    \
		     ((pos = hashtab_entry(__hn, __typeof__(*(pos)), member)), 1); \
		     __hn = __hx)

#endif /* KVPOOL_LIB_HASHTAB_H */
