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
 *                   entry and runs it again (ENGINE_PREPARE_DEFER's
 *                   pattern); a caller that may block passes wait.
 *
 * The remote tier (daemon/remote/) fills a struct share_fetch of its own
 * source for a chunk the disk tier lacks , laid out as the
 * disk tier's (pages, then the record), so one rebuild serves both
 * (remote_chunk_fetch, remote_engine.h); share_fetch_page/take/leave switch on `src`. Prefix pages from the store
 * come back a whole run at a time instead (remote_prefix_more).
 * Nothing here does I/O on the caller's thread: the disk tier's and the
 * remote tier's threads read, the caller only copies from their buffers
 * (a memcpy, and on a GPU one host -> device copy through host frames).
 *
 * This is the disk tier's header, never the engine's: struct engine, struct
 * pc_entry and struct chunk are opaque here, and share_disk.c reaches them
 * through tier_services.h only (its top comment says who owns what).
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
struct remote_fetch;

#define CHUNK_REC_MAGIC 0x314e434bu /* "KCN1" */

/* The last record of a chunk below the device tier (after its pages on
 * disk; the record value in the store): what its name held. */
struct chunk_rec {
	uint32_t magic;
	uint32_t type;
	uint32_t ntokens;
	uint32_t content_len;
	uint32_t meta_len;       /* canonical JSON text, no NUL; 0: none */
	uint32_t npages;         /* data pages before this record */
	uint64_t created_ns;
	uint8_t entry_id[32];
	uint8_t name_id[32];
	/* then tokens (uint32 LE), content, meta */
};

enum share_fetch_src { SHARE_FETCH_DISK = 1, SHARE_FETCH_REMOTE = 2 };

struct share_fetch {
	enum share_fetch_src src;
	uint32_t npages;
	struct disk_hist hh;     /* SHARE_FETCH_DISK */
	struct remote_fetch *rf; /* SHARE_FETCH_REMOTE: [0] the record, then pages */
};

/* The key of a prefix page / a chunk name of eng's tenant and pool. */
struct disk_key share_disk_key(const struct engine *eng, uint8_t kind,
			       const uint8_t hash[32]);
int share_tier_fetch(struct engine *eng, const struct disk_key *k, bool wait,
		     struct share_fetch *f);
const void *share_fetch_page(struct engine *eng, const struct share_fetch *f,
			     uint32_t i);
/* The pages are in memory now: the lower tier forgets its copy (the
 * store keeps its own: others share it). */
void share_fetch_take(struct engine *eng, const struct share_fetch *f);
/* Not taken (no room, another's record): it stays below; what the store
 * sent is freed. */
void share_fetch_leave(struct engine *eng, const struct share_fetch *f);

/*
 * A prefix page's / a sealed root chunk's bytes down to the disk tier (disk)
 * and to the remote tier (unless in_store already), where there are such
 * and they take them; on a GPU one device -> host copy feeds both.
 * share_pc_down returns whether the page is queued for the store now
 * (in_store set). share_chunk_down queues at most remote_max of the pages
 * the store lacks (from pub_next on; 0: none) and, once the last is, the
 * records (in_store set); it returns the pages it queued: remote_publish()
 * sends a long chunk a piece per hold of the lock.
 * Eviction (share_prefix.c, share_chunk.c) sends to both what it is about
 * to drop (share_demote_*); remote_publish() to the store alone ahead of it.
 */
bool share_pc_down(struct engine *eng, struct pc_entry *pe, bool disk, bool remote);
uint32_t share_chunk_down(struct engine *eng, struct chunk *c, bool disk,
			  uint32_t remote_max);
static inline void share_demote_pc(struct engine *eng, struct pc_entry *pe)
{
	share_pc_down(eng, pe, true, true);
}
static inline void share_demote_chunk(struct engine *eng, struct chunk *c)
{
	share_chunk_down(eng, c, true, UINT32_MAX);
}


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
 * Whether a prefix walk now would find what the last one that returned
 * -EINPROGRESS found: the disk thread has not finished a pass since, and
 * it was less than a millisecond ago. Then the caller answers -EINPROGRESS
 * at once: a held ring entry is retried every few microseconds, and the
 * walk hashes every page of its prompt. Any prefix walk of the engine
 * waits so, for a millisecond at most.
 */
bool share_disk_prefix_wait(struct engine *eng);

/* What share_disk_prefix_wait compares with: the last prefix walk that
 * answered -EINPROGRESS, the disk tier's progress then, and when. The disk
 * tier's own, one per engine in its state of the engine (disk_engine.c's
 * struct disk_engine): the engine keeps none. */
struct share_disk_wait {
	bool waiting;
	uint64_t progress;
	uint64_t since_ns;
};
/* eng's (defined in disk_engine.c, beside the rest of that state); NULL
 * without a disk tier, or when attach had no memory for the state: then
 * every retry walks again. */
struct share_disk_wait *share_disk_wait_of(struct engine *eng);

/*
 * The chunk id (a name, or its root entry) on a tier below: back as a
 * READY root entry (with its
 * name, tokens, content and metadata). 0, -ENOENT (not there),
 * -EINPROGRESS (being read; only without wait), -ENOMEM naming the limit
 * when the device tier or the chunk limits cannot take it now.
 */
int share_disk_chunk_restore(struct engine *eng, const struct kvp_chunk_id *id,
			     uint32_t type, bool wait, struct errbuf *e);

/* A deletion reaches the disk tier too (else a later acquire would bring
 * the chunk back): the chunk id (name or root entry) dropped there: 1, or 0
 * when it is not there. */
int share_disk_chunk_drop(struct engine *eng, const struct kvp_chunk_id *id);
/* share_chunk_clear's: every chunk of type (0: all) there; how many. */
uint32_t share_disk_chunk_clear(struct engine *eng, uint32_t type);

/* tier.h's demote_prefix, demote_chunk and prefix_waiting (the last records
 * the typed wait, ENGINE_WAIT_DISK), for disk_tier_ops (disk_engine.c). */
void share_disk_demote_pc(struct engine *eng, struct pc_entry *pe);
void share_disk_demote_chunk(struct engine *eng, struct chunk *c);
bool share_disk_prefix_waiting(struct engine *eng);

#endif /* KVPOOL_SHARE_DISK_H */
