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
 * The record (struct kvpc_lease) and who may touch it when are described
 * in client_internal.h, THE LEASE RECORD: it also holds the cuda backend's
 * notes of the lease's appends still on the GPU, so one record per lease
 * is all libclient keeps. The table is lib/hashtab keyed by id (a
 * bijective hash: no key compare), made at the first lease. A client is
 * single-threaded (client_internal.h), so nothing here locks.
 *
 * lease.c calls nothing above it (error.c only): the data ops check a
 * lease through kvpc_lease_open() and get its slots from
 * kvpc_lease_slots(), which the cuda backend calls for an append already
 * checked.
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

struct kvpc_lease *kvpc_lease_find(const struct kvp_client *c, uint64_t id)
{
	struct hnode *n;

	if (!c->leases.buckets || !id)
		return NULL;
	n = hashtab_find_u64(&c->leases, id);
	return n ? hashtab_entry(n, struct kvpc_lease, node) : NULL;
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

/* Out of the table and back to the cache (or freed). */
static void record_drop(struct kvp_client *c, struct kvpc_lease *r)
{
	hashtab_remove(&c->leases, &r->node);
	record_put(c, r);
}

/* A record with room for words 32-bit words after it, in the table. */
static struct kvpc_lease *lease_insert(struct kvp_client *c, uint64_t id,
				       size_t words)
{
	struct kvpc_lease *r, *old;
	uint32_t cap;

	if (!c->leases.buckets && hashtab_init(&c->leases, LEASE_TABLE_MIN))
		return NULL;
	if (hashtab_reserve(&c->leases, 1))
		return NULL;
	r = record_get(c, words);
	if (!r)
		return NULL;
	cap = r->cap;
	*r = (struct kvpc_lease){ .id = id, .state = KVPC_LEASE_OPEN, .cap = cap };
	if ((old = kvpc_lease_find(c, id))) {
		/* The daemon handed out an id we still hold: it released that
		 * lease without telling us (it cannot, short of a bug). Trust the
		 * new grant; the old record's frames are no longer ours. */
		record_drop(c, old);
	}
	hashtab_insert(&c->leases, &r->node, hashtab_hash_u64(id));
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
	struct kvpc_lease *r = kvpc_lease_find(c, id);

	if (r)
		record_drop(c, r);
}

void kvpc_lease_drop_seq(struct kvp_client *c, uint64_t seq, uint64_t keep)
{
	struct kvpc_lease *r;

	/* Rare (extend, free) and the table is small: a scan. */
	hashtab_for_each_safe(&c->leases, r, node)
		if (r->kind == KVPC_LEASE_SEQ && r->seq == seq && r->id != keep)
			record_drop(c, r);
}

void kvpc_lease_table_free(struct kvp_client *c)
{
	struct kvpc_lease *r;

	while (c->lease_cache) {
		r = c->lease_cache;
		c->lease_cache = r->free_next;
		free(r);
	}
	c->lease_cached = 0;
	hashtab_for_each_safe(&c->leases, r, node) {
		hashtab_remove(&c->leases, &r->node);
		free(r);
	}
	hashtab_fini(&c->leases);
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

int kvpc_lease_slots(struct kvp_client *c, const struct kvpc_lease *r,
		     uint32_t first, uint32_t n, struct kvp_slot *out)
{
	const uint32_t P = c->layout.page_tokens;
	const uint32_t frames = c->tier_frames[KVP_TIER_DEVICE];
	const uint64_t q0 = r->len + first;
	uint64_t page = UINT64_MAX;
	uint32_t frame = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t q = q0 + i;

		if (q / P != page) {
			/* The private copy: no other party writes it, but the
			 * daemon wrote it, so its frames are checked. */
			int32_t f = q / P < r->npages ? r->frames[q / P] : -1;

			if (f < 0 || (uint32_t)f >= frames)
				return kvpc_err(c, -EINVAL,
						"append: lease %#" PRIx64 " page %" PRIu64
						" names frame %" PRId32 ", outside the %" PRIu32
						" frames of the device tier", r->id, q / P, f,
						frames);
			page = q / P;
			frame = (uint32_t)f;
		}
		out[i].frame = frame;
		out[i].slot = (uint32_t)(q % P);
	}
	return 0;
}
