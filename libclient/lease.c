/* SPDX-License-Identifier: MIT */
/*
 * lease.c - the client's lease table: every lease this client holds now,
 * with a private copy of its page table. It is what makes a lease a handle
 * the library can check.
 *
 * WHY. kvp_append() writes straight into the mapped device tier with no
 * round trip, so the daemon cannot refuse a write; only the library can.
 * struct kvp_lease is the caller's memory and its page table used to point
 * into the arena, which the next call overwrites. So a lease that was
 * released, committed, ended by the daemon, or granted to another client
 * still "worked": its bytes went into frames another user owned by then
 * (issue 11: a stale lease overwrote committed tokens of another user, and
 * two sync prepares shared one arena region, so the first lease wrote
 * through the second's page table). The rule now:
 *
 *   - a lease the library decoded (prepare, reap, seq_alloc/create/extend,
 *     chunk_register/acquire, compose) gets a record here, keyed by its id,
 *     holding len, n_new and a private copy of its frames; struct
 *     kvp_lease's indices then points at that copy, which stays valid
 *     until the lease is released (kvp_release, or the release reaped);
 *   - the data ops take only the id from the caller's struct: the id must
 *     be in the table and OPEN, the tokens inside the record's n_new, and
 *     the frames come from the record (each checked against the tier before
 *     it is used). Anything else is -ESTALE naming the lease;
 *   - a commit or release is mirrored here the moment it is sent: the lease
 *     stops taking writes before the daemon can give its slots back.
 *
 * STATES. OPEN: writable. COMMITTING: a commit (maybe with release) is
 * queued; back to OPEN if it fails, CLOSED (or gone, with release) when it
 * succeeds. CLOSED: committed; its uncommitted slots were given back, so it
 * takes no writes and no second commit, but its page table stays readable
 * until the release. RELEASING: a release is queued; gone when reaped (back
 * to the state it had, OPEN or CLOSED, if the daemon refused the release).
 * Endings the daemon makes on its own are mirrored by the call that causes
 * them: a seal ends the chunk's fill lease; kvp_seq_extend() ends the
 * sequence's previous (committed) write lease; a dead client has no leases.
 *
 * The table is open addressing with linear probing and backward-shift
 * deletion (no tombstones), sized to a power of two at most half full.
 * A client is single-threaded (client_internal.h), so nothing here locks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

#define LEASE_TABLE_MIN 64u
/* Records of up to LEASE_SMALL_WORDS frames are recycled through a free
 * list of at most LEASE_CACHE_MAX (a batch's worth): a prepare per user
 * step must not cost a malloc and a free (kvbench throughput, callgrind). */
#define LEASE_SMALL_WORDS 32u
#define LEASE_CACHE_MAX 512u

static uint64_t lease_hash(uint64_t id)
{
	/* splitmix64's finaliser: ids are (generation, slot) pairs, so their
	 * low bits alone would cluster. */
	id ^= id >> 30;
	id *= 0xbf58476d1ce4e5b9ull;
	id ^= id >> 27;
	id *= 0x94d049bb133111ebull;
	return id ^ (id >> 31);
}

/* The bucket holding id, or the empty bucket where it would go. */
static uint32_t lease_bucket(const struct kvp_client *c, uint64_t id)
{
	uint32_t b = (uint32_t)lease_hash(id) & c->lease_mask;

	while (c->lease_tab[b] && c->lease_tab[b]->id != id)
		b = (b + 1) & c->lease_mask;
	return b;
}

static int lease_table_grow(struct kvp_client *c)
{
	uint32_t old_cap = c->lease_tab ? c->lease_mask + 1 : 0;
	uint32_t cap = old_cap ? old_cap * 2 : LEASE_TABLE_MIN;
	struct kvpc_lease **old = c->lease_tab;

	if (cap < old_cap) /* 2^31 leases: the daemon's limit is far lower */
		return -ENOMEM;
	c->lease_tab = calloc(cap, sizeof(*c->lease_tab));
	if (!c->lease_tab) {
		c->lease_tab = old;
		return -ENOMEM;
	}
	c->lease_mask = cap - 1;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old[i])
			c->lease_tab[lease_bucket(c, old[i]->id)] = old[i];
	free(old);
	return 0;
}

struct kvpc_lease *kvpc_lease_find(const struct kvp_client *c, uint64_t id)
{
	if (!c->lease_tab || !id)
		return NULL;
	return c->lease_tab[lease_bucket(c, id)];
}

static struct kvpc_lease *record_get(struct kvp_client *c, size_t words)
{
	struct kvpc_lease *r;

	if (words <= LEASE_SMALL_WORDS && c->lease_cache) {
		r = c->lease_cache;
		c->lease_cache = r->free_next;
		c->lease_cached--;
		return r;
	}
	if (words < LEASE_SMALL_WORDS)
		words = LEASE_SMALL_WORDS;
	r = malloc(sizeof(*r) + words * sizeof(r->frames[0]));
	if (r)
		r->cap = (uint32_t)(words <= UINT32_MAX ? words : UINT32_MAX);
	return r;
}

static void record_put(struct kvp_client *c, struct kvpc_lease *r)
{
	if (r->cap == LEASE_SMALL_WORDS && c->lease_cached < LEASE_CACHE_MAX) {
		r->free_next = c->lease_cache;
		c->lease_cache = r;
		c->lease_cached++;
		return;
	}
	free(r);
}

/* A record with room for words 32-bit words after it, in the table. */
static struct kvpc_lease *lease_insert(struct kvp_client *c, uint64_t id,
				       size_t words)
{
	struct kvpc_lease *r;
	uint32_t b, cap;

	if ((c->lease_count + 1) * 2 > (c->lease_tab ? c->lease_mask + 1 : 0) &&
	    lease_table_grow(c))
		return NULL;
	r = record_get(c, words);
	if (!r)
		return NULL;
	cap = r->cap;
	*r = (struct kvpc_lease){ .id = id, .state = KVPC_LEASE_OPEN, .cap = cap };
	b = lease_bucket(c, id);
	if (c->lease_tab[b]) {
		/* The daemon handed out an id we still hold: it released that
		 * lease without telling us (it cannot, short of a bug). Trust the
		 * new grant; the old record's frames are no longer ours. */
		record_put(c, c->lease_tab[b]);
		c->lease_count--;
	}
	c->lease_tab[b] = r;
	c->lease_count++;
	return r;
}

int kvpc_lease_add(struct kvp_client *c, struct kvp_lease *l, uint8_t kind,
		   uint64_t seq)
{
	struct kvpc_lease *r;

	/* A sequence made with n_new 0 has no write lease: id 0, nothing held. */
	if (!l->id)
		return 0;
	r = lease_insert(c, l->id, l->npages);
	if (!r)
		return kvpc_err(c, -ENOMEM,
				"out of memory for the page table of lease %#" PRIx64
				" (%" PRIu32 " pages); the daemon holds it until "
				"kvp_close()", l->id, l->npages);
	r->seq = seq;
	r->len = l->len;
	r->n_new = l->n_new;
	r->npages = l->npages;
	r->kind = kind;
	/* The only read of this page table from the arena; from here on the
	 * data ops use the copy, whatever the arena holds next. */
	if (l->npages)
		memcpy(r->frames, l->indices, (size_t)l->npages * sizeof(r->frames[0]));
	l->indices = r->frames;
	return 0;
}

int kvpc_lease_add_blob(struct kvp_client *c, uint64_t id, const void *src,
			uint32_t bytes, const unsigned char **copy)
{
	struct kvpc_lease *r = lease_insert(c, id, ((size_t)bytes + 3) / 4);

	if (!r)
		return -ENOMEM;
	/* No page table to write through: n_new 0, npages 0. */
	r->kind = KVPC_LEASE_COMPOSE;
	memcpy(r->frames, src, bytes);
	*copy = (const unsigned char *)r->frames;
	return 0;
}

void kvpc_lease_drop(struct kvp_client *c, uint64_t id)
{
	uint32_t b, next;

	if (!c->lease_tab || !id)
		return;
	b = lease_bucket(c, id);
	if (!c->lease_tab[b])
		return;
	record_put(c, c->lease_tab[b]);
	c->lease_tab[b] = NULL;
	c->lease_count--;
	/* Backward shift: pull later entries of the probe run into the hole
	 * unless their home bucket lies cyclically in (hole, here]. */
	for (next = (b + 1) & c->lease_mask; c->lease_tab[next];
	     next = (next + 1) & c->lease_mask) {
		uint32_t home = (uint32_t)lease_hash(c->lease_tab[next]->id) &
				c->lease_mask;

		if (((next - home) & c->lease_mask) >= ((next - b) & c->lease_mask)) {
			c->lease_tab[b] = c->lease_tab[next];
			c->lease_tab[next] = NULL;
			b = next;
		}
	}
}

void kvpc_lease_drop_seq(struct kvp_client *c, uint64_t seq, uint64_t keep)
{
	uint32_t i = 0;

	if (!c->lease_tab)
		return;
	/* Rare (extend, free) and the table is small: a scan. A drop may
	 * shift a later entry into bucket i, so i advances only past keepers. */
	while (i <= c->lease_mask) {
		struct kvpc_lease *r = c->lease_tab[i];

		if (r && r->kind == KVPC_LEASE_SEQ && r->seq == seq && r->id != keep)
			kvpc_lease_drop(c, r->id);
		else
			i++;
	}
}

void kvpc_lease_table_free(struct kvp_client *c)
{
	while (c->lease_cache) {
		struct kvpc_lease *r = c->lease_cache;

		c->lease_cache = r->free_next;
		free(r);
	}
	c->lease_cached = 0;
	if (!c->lease_tab)
		return;
	for (uint32_t i = 0; i <= c->lease_mask; i++)
		free(c->lease_tab[i]);
	free(c->lease_tab);
	c->lease_tab = NULL;
	c->lease_count = 0;
}

static int lease_stale(struct kvp_client *c, const char *what, uint64_t id,
		       const struct kvpc_lease *r)
{
	if (!r)
		return kvpc_err(c, -ESTALE,
				"%s: lease %#" PRIx64 " is not held by this client "
				"(released, ended by kvpoold, or granted to another "
				"client); prepare a new lease", what, id);
	switch (r->state) {
	case KVPC_LEASE_CLOSED:
		return kvpc_err(c, -ESTALE,
				"%s: lease %#" PRIx64 " has committed %" PRIu32 " of its %"
				PRIu32 " new tokens; the rest of its slots were given "
				"back, so it takes no more writes or commits: prepare "
				"again from the new end of the history", what, id,
				r->committed, r->n_new);
	case KVPC_LEASE_COMMITTING:
		return kvpc_err(c, -ESTALE,
				"%s: lease %#" PRIx64 " has a commit queued; it takes no "
				"more writes (reap the commit, then prepare again)",
				what, id);
	default: /* RELEASING */
		return kvpc_err(c, -ESTALE,
				"%s: lease %#" PRIx64 " has a release queued; it is no "
				"longer held for writes", what, id);
	}
}

int kvpc_lease_open(struct kvp_client *c, uint64_t id, const char *what,
		    struct kvpc_lease **out)
{
	struct kvpc_lease *r = kvpc_lease_find(c, id);

	if (!r || r->state != KVPC_LEASE_OPEN)
		return lease_stale(c, what, id, r);
	*out = r;
	return 0;
}
