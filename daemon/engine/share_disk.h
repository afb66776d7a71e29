/* SPDX-License-Identifier: MIT */
/*
 * share_disk.h - the shared world's pages below the device tier: prefix
 * pages and sealed chunks that eviction would drop go to the disk tier
 * (disk_tier.h) instead, and come back when a lookup, a registration or an
 * acquire misses in memory (share_disk.c).
 *
 * THE MISS HOOK. Everything below the device tier is reached through one
 * function, share_tier_fetch(): the prefix walk and the chunk paths call it
 * with the key of what they miss (a prefix page by its tenant-salted block
 * hash, a chunk by its name id) and get
 *
 *     0             the pages are in host memory now, in *f: copy them in
 *                   with share_fetch_page(), then share_fetch_take(); or,
 *                   when they do not fit now, take nothing: they stay
 *                   where they were (the disk tier gives the staging back
 *                   after a second);
 *     -ENOENT       no tier below has it: a miss, as without the tiers;
 *     -EINPROGRESS  a tier is bringing it back (a read was queued): the
 *                   caller returns -EINPROGRESS, the ring worker holds the
 *                   entry and runs it again (ENGINE_PREPARE_DISK_DEFER's
 *                   pattern); a caller that may block passes wait.
 *
 * A tier added below the disk (the remote tier, issue 17) chains in
 * share_tier_fetch(): when the disk says -ENOENT it asks the next tier,
 * which fills a struct share_fetch of its own source (one more `src`
 * value; share_fetch_page/take/leave switch on it). Callers do not change.
 * Nothing here does I/O on the caller's thread: the disk tier's thread
 * reads, the caller only copies from staging (a memcpy, and on a GPU one
 * host -> device copy through a host frame).
 */
#ifndef KVPOOL_SHARE_DISK_H
#define KVPOOL_SHARE_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include "disk_record.h"
#include "disk_tier.h"

struct engine;
struct pc_entry;
struct chunk;

enum share_fetch_src { SHARE_FETCH_DISK = 1 };

struct share_fetch {
	enum share_fetch_src src;
	uint32_t npages;
	struct disk_hist hh;     /* SHARE_FETCH_DISK */
};

/* The key of a prefix page / a chunk name of eng's tenant and pool. */
struct disk_key share_disk_key(const struct engine *eng, uint8_t kind,
			       const uint8_t hash[32]);
int share_tier_fetch(struct engine *eng, const struct disk_key *k, bool wait,
		     struct share_fetch *f);
const void *share_fetch_page(struct engine *eng, const struct share_fetch *f,
			     uint32_t i);
/* The pages are in memory now: the lower tier forgets its copy. */
void share_fetch_take(struct engine *eng, const struct share_fetch *f);

/* Eviction hooks (share_prefix.c, share_chunk.c): put what is about to be
 * dropped on the disk tier, if there is one and it takes it. */
void share_disk_demote_pc(struct engine *eng, const struct pc_entry *pe);
void share_disk_demote_chunk(struct engine *eng, const struct chunk *c);

/*
 * Pages frames[0, *hit) of tokens matched in memory; continue the chain
 * from the tiers below up to full pages, publishing what comes back as
 * idle prefix pages (*hit and *idle grow). 0, or -EINPROGRESS (without
 * wait) when a page is still being read: the pages before it are back,
 * the caller retries.
 */
int share_disk_prefix_more(struct engine *eng, const uint32_t *tokens,
			   uint32_t full, uint32_t *frames, uint32_t *hit,
			   uint32_t *idle, bool wait);

/*
 * The chunk id (a name, or its root entry) on a tier below: back as a
 * READY root entry (with its
 * name, tokens, content and metadata). 0, -ENOENT (not there),
 * -EINPROGRESS (being read; only without wait), -ENOMEM naming the limit
 * when the device tier or the chunk limits cannot take it now.
 */
int share_disk_chunk_restore(struct engine *eng, const struct kvp_chunk_id *id,
			     bool wait, struct errbuf *e);

/* A deletion reaches the disk tier too (else a later acquire would bring
 * the chunk back): the chunk id (name or root entry) dropped there: 1, or 0
 * when it is not there. */
int share_disk_chunk_drop(struct engine *eng, const struct kvp_chunk_id *id);
/* share_chunk_clear's: every chunk of type (0: all) there; how many. */
uint32_t share_disk_chunk_clear(struct engine *eng, uint32_t type);

#endif /* KVPOOL_SHARE_DISK_H */
