/* SPDX-License-Identifier: MIT */
/*
 * disk_tier.h - the third tier: user histories the host tier evicts, kept
 * in a disk file (disk_store.h) as self-describing records (disk_record.h),
 * and read back when a prepare needs them.
 *
 * One disk tier per daemon, shared by every tenant and pool, with one
 * thread of its own: the disk thread. No disk I/O runs on a ring worker:
 *
 *  demote  (engine, locked)  disk_tier_put() copies a whole host-only
 *                            history into staging memory (a memcpy) and
 *                            queues it; the engine drops it as before.
 *                            No staging room: -ENOSPC, the pages are
 *                            dropped as they were before the disk tier.
 *  write   (disk thread)     takes slots (dropping the disk tier's oldest
 *                            histories past disk_size or the tenant's
 *                            quota), encodes, seals and writes the pages
 *                            in batched runs; a failed write (ENOSPC)
 *                            drops the history with a rate-limited log.
 *  fetch   (engine, locked)  disk_tier_get(): -ENOENT when the user is not
 *                            on disk; -EINPROGRESS while its pages are
 *                            being read into staging (the request was
 *                            queued; the worker holds the ring entry and
 *                            retries it); 0 when they are there: the
 *                            engine copies them into host frames and calls
 *                            disk_tier_take(), which frees the disk copy.
 *
 * The same entries hold prefix-cache pages and chunks (disk_key.kind, the
 * engine's share_disk.c): the tier stores and returns their pages without
 * looking inside.
 *
 * Warm restart: disk_tier_open() scans the file; for each (tenant, pool,
 * user) the newest snapshot's pages 0..k-1 that check (disk_record.h) come
 * back as a history of min(len, k * page_tokens) tokens, served by the
 * next prepare of the user (a prefix page or chunk: all its pages, or
 * nothing). Records that fail their checksum, are torn, or
 * belong to another layout are skipped with one warning per kind.
 *
 * Thread-safe: every call takes the tier's mutex for a short while.
 */
#ifndef KVPOOL_DISK_TIER_H
#define KVPOOL_DISK_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "disk_codec.h"
#include "errbuf.h"
#include "kvpool.h"

struct disk_tier;
struct disk_entry;

struct disk_tier_config {
	const char *dir;          /* where kvpool.disk lives */
	uint64_t size;            /* bytes of slots (disk_size) */
	struct disk_codec codec;  /* elem_bytes filled by disk_tier_open */
	struct kvp_layout layout;
	uint32_t tp;              /* a tensor-parallel daemon's (0, 1: none):
				   * part of the records' layout id */
	uint64_t staging_bytes;   /* 0: 64 MiB (or the file, if smaller) */
	/* Where warnings go (kvpoold: its log); NULL: stderr. */
	void (*log)(int prio, const char *msg);
};

int disk_tier_open(struct disk_tier **out, const struct disk_tier_config *c,
		   struct errbuf *e);
/* Stop the thread after the queued writes; close the file. */
void disk_tier_close(struct disk_tier *dt);

/* Most slots the tenant's histories may hold (0: no limit but disk_size). */
void disk_tier_set_quota(struct disk_tier *dt, uint64_t tenant, uint64_t slots);

/*
 * A key on disk: a user history (kind 0, user), or, with kind
 * DISK_KIND_PREFIX / DISK_KIND_CHUNK (disk_record.h), a prefix page or a
 * chunk named by hash (user 0). Every page of an entry is one record; the
 * tier never looks inside them (share_disk.c does).
 */
struct disk_key {
	uint64_t tenant;  /* disk_tenant_key(name) */
	uint32_t pool;
	uint64_t user;
	uint8_t kind;     /* 0: a user history; else enum disk_kind */
	uint8_t hash[32]; /* kind != 0: block hash or chunk name id */
};
/* With kind != 0, user is not part of the key but an alias kept with it
 * (a chunk's entry id, 8 bytes of it): disk_tier_find_alias. */

/* Queue the history for writing: pages[i] is page i (page_bytes each). */
int disk_tier_put(struct disk_tier *dt, const struct disk_key *k, uint64_t start,
		  uint64_t len, uint32_t npages, void *const *pages);

struct disk_hist {
	struct disk_entry *entry; /* for disk_tier_page / take */
	uint64_t start, len;
	uint32_t npages;
};
/*
 * The user's history on disk: -ENOENT none; -EINPROGRESS being read (a read
 * is queued by this call when none is); 0: in staging, *out filled.
 */
int disk_tier_get(struct disk_tier *dt, const struct disk_key *k,
		  struct disk_hist *out);
/*
 * Reading back straight into the caller's memory (a host frame per page:
 * no staging, no copy). dst[i] takes page i: page_bytes, DISK_ALIGN
 * aligned, registered with disk_tier_register_host() for fixed-buffer I/O
 * (unregistered works too). Only where disk_tier_into_ok() (page_bytes a
 * multiple of DISK_ALIGN).
 *
 * get_into: -ENOENT none; -EBUSY / -ESTALE another caller holds it, or it
 * has not n pages (disk_tier_info was a moment ago): use disk_tier_get;
 * else the caller HOLDS it (out->entry) and returns 0 (ready) or
 * -EINPROGRESS (being read: poll it). While held, dst must stay valid and
 * nobody else gets it. disk_tier_poll: -EINPROGRESS, 0 ready (out
 * refreshed: npages may have shrunk where a page came back damaged), or
 * -ENOENT: dropped meanwhile, its I/O is over, dst is the caller's again
 * and the handle is dead. Once ready, disk_tier_page(i) is dst[i] where it
 * was read there, else a staging page to copy (it was not written yet, or
 * the header blocks were short). Then disk_tier_take(), or
 * disk_tier_unhold() to leave it on disk (it waits for the I/O).
 */
bool disk_tier_into_ok(const struct disk_tier *dt);
int disk_tier_register_host(struct disk_tier *dt, void *base, uint64_t bytes);
void disk_tier_unregister_host(struct disk_tier *dt, void *base);
int disk_tier_get_into(struct disk_tier *dt, const struct disk_key *k,
		       uint32_t n, void *const *dst, struct disk_hist *out);
int disk_tier_poll(struct disk_tier *dt, const struct disk_hist *hh,
		   struct disk_hist *out);
/* Block until the held history's I/O is over (then poll again). */
void disk_tier_wait_held(struct disk_tier *dt, const struct disk_hist *hh);
void disk_tier_unhold(struct disk_tier *dt, const struct disk_hist *hh);

/* Block until the read disk_tier_get queued is over (then get again). */
void disk_tier_wait(struct disk_tier *dt, const struct disk_key *k);
/* Page i of a history get returned (valid until take). */
const void *disk_tier_page(struct disk_tier *dt, const struct disk_hist *hh,
			   uint32_t i);
/* The history is back in memory: free its staging and disk slots. */
void disk_tier_take(struct disk_tier *dt, const struct disk_hist *hh);
/* Forget the user's disk copy (kvctl evict --tier disk); pages freed or
 * -ENOENT. */
int disk_tier_drop(struct disk_tier *dt, const struct disk_key *k);
/* Drop everything of (tenant, pool) on disk, prefix pages and chunks too;
 * returns histories dropped. */
uint32_t disk_tier_drop_all(struct disk_tier *dt, uint64_t tenant, uint32_t pool);
/* Users of (tenant, pool) on disk with id >= cursor, at most max into ids
 * (unsorted); returns how many there are in all (may be > max). */
uint64_t disk_tier_list(struct disk_tier *dt, uint64_t tenant, uint32_t pool,
			uint64_t cursor, uint64_t *ids, uint64_t max);
/* Entries of kind of (tenant, pool) whose alias has (user & mask) == value. */
struct disk_alias {
	uint64_t tenant;
	uint32_t pool;
	uint8_t kind;
	uint64_t mask, value;
};
/* The hash of one such entry; false: none. Both walk the whole index: for
 * misses and deletions only. */
bool disk_tier_find_alias(struct disk_tier *dt, const struct disk_alias *a,
			  uint8_t hash[32]);
/* Drop them all; returns how many. */
uint32_t disk_tier_drop_alias(struct disk_tier *dt, const struct disk_alias *a);
/* Whether (and how much of) the user is on disk; false: not. */
bool disk_tier_info(struct disk_tier *dt, const struct disk_key *k,
		    uint64_t *start, uint64_t *len, uint32_t *npages);

struct disk_tier_stats {
	uint64_t slots, slots_used;     /* the whole file */
	uint64_t users, pages;          /* of the tenant */
	uint64_t prefix_pages, chunks, chunk_pages; /* of those pages */
	uint64_t demoted_pages, dropped_pages, read_pages;
	uint64_t bytes_raw, bytes_stored; /* written: ratio raw / stored */
	uint64_t write_ns, read_ns;     /* in the disk thread */
	uint64_t codec_ns;
	uint64_t bad_records;           /* skipped by the scan: damaged */
	uint64_t other_records;         /* skipped by the scan: intact, of
					 * another layout */
	uint64_t into_pages;            /* read straight into callers' frames */
	uint64_t hblk_free;             /* header blocks free (tests) */
	bool direct;
};
/* The whole file's slots, and the tenant's share of the rest (all its
 * pools). */
void disk_tier_stats(struct disk_tier *dt, uint64_t tenant,
		     struct disk_tier_stats *out);

/* A count that moves whenever a pass of the thread ends: a retry of a get
 * that said -EINPROGRESS finds what the last one found until it moves
 * (short of staging freed by a take meanwhile). No lock. */
uint64_t disk_tier_progress(struct disk_tier *dt);

/* Tests: wait until the thread has nothing queued. */
void disk_tier_flush(struct disk_tier *dt);
/* Tests: the store under the tier (disk_store_inject). */
struct disk_store *disk_tier_store(struct disk_tier *dt);

#endif /* KVPOOL_DISK_TIER_H */
