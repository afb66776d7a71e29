/* SPDX-License-Identifier: MIT */
/*
 * engine_internal.h - the engine's data structures, shared by engine.c
 * (histories, the operations, the one onload path), lease.c (the one lease
 * table), evict.c (LRU, demotion, offload), engine_query.c, engine_check.c
 * and shard.c, and by sharing (share*.c, which the core reaches only
 * through engine_share.h).
 *
 * Invariants (engine_check() verifies every one of them):
 *  - every page of a history has a frame in at least one tier; a frame in
 *    use belongs to exactly one page of one history;
 *  - h->nres[t] counts h's pages with a frame in tier t;
 *  - h->pins == 0 and h holds frames <=> h is on exactly one LRU list:
 *    lru[DEVICE] when nres[DEVICE] > 0, else lru[HOST];
 *    pinned histories are on no list, so eviction never sees them;
 *  - lru[t].frames == sum of nres[t] over the histories on lru[t];
 *  - a history with len == 0, no pages and no pins does not exist;
 *  - pages [0, ceil(len / P)) hold committed tokens; pages after them are
 *    reserved by the one write lease (h->write_lease) and have only a
 *    device frame;
 *  - h->onload_fence != 0 only while h is pinned (the last release waits
 *    for it).
 *
 * The onload fence. A prepare that onloads enqueues the host -> device copy
 * and returns (backend.h); h->onload_fence is the fence of that copy until
 * someone sees it landed. While it is in flight the copy reads h's host
 * frames and writes h's device frames, so none of them may be freed, reused
 * or read: history_settle() waits for the fence and is called first by
 * everything that frees a frame of h (page_free_frame: commit, trimming,
 * demotion, eviction, drop, destroy), copies out of h (copy_to_host) or
 * reads h (engine_read_tokens), and by the release that unpins h, so an
 * unpinned history never has a copy in flight and eviction never waits.
 * Frames h does not hold are never under a copy: they came back from a
 * history that settled first. Every prepare of h while the copy is in
 * flight (the same frames) returns the fence in its lease.
 */
#ifndef KVPOOL_ENGINE_INTERNAL_H
#define KVPOOL_ENGINE_INTERNAL_H

#include "copy.h"
#include "list.h"
#include "engine.h"
#include "frames.h"
#include "tier.h"
#include "user_table.h"

enum lru_id {
	LRU_NONE = -1,
	LRU_DEVICE = KVP_TIER_DEVICE, /* unpinned, holding device frames */
	LRU_HOST = KVP_TIER_HOST,     /* unpinned, holding host frames only */
};

struct page_ref {
	uint32_t frame[KVP_TIERS]; /* FRAME_NONE where the tier has no copy */
};

struct history {
	struct engine *owner;    /* the shard's engine whose user table has it */
	uint64_t user;
	uint64_t start;          /* position of the first cached token */
	uint64_t len;            /* committed tokens */
	struct page_ref *pages;
	uint32_t npages;         /* committed + reserved pages */
	uint32_t cap;
	uint32_t nres[KVP_TIERS];
	uint32_t pins;           /* leases and sequences (share.h) holding it */
	int lru;                 /* enum lru_id */
	uint64_t write_lease;    /* lease with an uncommitted reservation, or 0 */
	bool demoting;           /* pinned by the reclaimer's copy (evict.c) */
	uint32_t wgen;           /* bumped by every write reservation: a
				  * demotion copying outside the lock sees
				  * whether its partial last page changed */
	uint64_t onload_fence;   /* onload copy maybe in flight, or 0 (above) */
	uint64_t onload_first;   /* its first flush's fence (ns_h2d: history_landed) */
	uint64_t tick;           /* engine tick when it last went on an LRU */
	/* Brought back from the remote tier (remote_user.c): while wgen,
	 * start and len are still these, the store has it as it is, and
	 * eviction does not write it again. */
	bool in_store;
	uint32_t store_wgen;
	uint64_t store_start, store_len;
	struct hnode hnode;      /* user_table */
	struct list_head lru_link; /* on lru[h->lru], or self-linked */
};

struct lru_list {
	struct list_head list;   /* least recently used first */
	uint64_t frames;         /* frames of the list's tier its histories hold */
};

#define LEASE_MAX (1u << 24)
#define LEASE_SHARD_SHIFT 24 /* bits 24..30 of a lease id: its shard */

/* The one lease table (lease.c): what a lease holds, by kind. */
enum lease_kind {
	LEASE_FREE = 0,          /* slot on the free list */
	LEASE_HISTORY,           /* a prepare: pins h */
	LEASE_SEQ_WRITE,         /* sharing (engine_share.h): a sequence's write */
	LEASE_CHUNK_FILL,        /* a chunk entry's fill */
	LEASE_CHUNK_READ,        /* a chunk entry held for reading */
	LEASE_COMPOSE,           /* a composition's entries held */
	LEASE_GROUP_ENDED,       /* a group lease released before its group
				  * committed, kept until every rank that held
				  * it has heard (lease_group.c); holds nothing */
};

/*
 * A tensor-parallel pool's history lease, chunk fill lease or sequence
 * write lease (engine_config.tp > 1): rank 0 prepared (registered) it, ranks 1..tp-1
 * join it, every rank commits (seals) it (lease_group.c). A rank is a member from its prepare or join until it
 * leaves (release, death, a commit with release once the group committed,
 * or hearing that the group ended).
 */
struct lease_group {
	uint32_t owner[ENGINE_TP_MAX]; /* each member rank's client */
	uint32_t members;        /* bit r: rank r holds the lease */
	uint32_t joined;         /* bit r: rank r prepared or joined, ever */
	uint32_t committed;      /* bit r: rank r committed */
	uint32_t leave;          /* bit r: rank r leaves once the group commits */
	uint32_t n;              /* tokens the first rank committed */
	uint32_t ended_rank;     /* LEASE_GROUP_ENDED: whose release or death */
	bool ended_died;         /* ... died (else released it) */
	uint32_t of;             /* LEASE_HISTORY, _CHUNK_FILL or _SEQ_WRITE: the
				  * kind it is (or was, once ended) */
};

struct seq;
struct chunk;

struct lease {
	uint32_t kind;           /* enum lease_kind */
	uint32_t gen;            /* bumped on every reuse: stale ids miss */
	uint32_t next_free;
	uint32_t owner;
	bool committed;          /* HISTORY, SEQ_WRITE: committed; FILL: sealed */
	/* tp > 1: a HISTORY, CHUNK_FILL or SEQ_WRITE lease's group (and a
	 * LEASE_GROUP_ENDED record's); NULL otherwise */
	struct lease_group *grp;
	union {
		struct {                 /* LEASE_HISTORY */
			struct history *h;
			uint64_t len0;   /* committed len when prepared */
			uint32_t n_new;
		};
		struct seq *seq;         /* LEASE_SEQ_WRITE */
		struct chunk *chunk;     /* LEASE_CHUNK_FILL, LEASE_CHUNK_READ */
		struct {                 /* LEASE_COMPOSE */
			struct chunk **chunks;
			uint32_t n;
		} comp;
	};
};

struct engine {
	struct kvp_layout layout;
	uint32_t tp;             /* ranks of a tensor-parallel pool; 1: none */
	struct lease_group *grp_spare; /* tp > 1: the next prepare's group,
					* allocated before anything changes */
	uint32_t P;              /* page_tokens */
	uint64_t max_tokens;     /* 0: unlimited */
	const struct backend_ops *be;
	void *be_ctx;
	struct tier_mem mem[KVP_TIERS];
	struct frames frames[KVP_TIERS];
	struct user_table users;
	struct lru_list lru[KVP_TIERS];
	struct lease *leases;
	uint32_t leases_cap;
	uint32_t lease_free;     /* head of the free slot list, or UINT32_MAX */
	uint32_t leases_live;    /* every kind */
	uint32_t history_leases; /* LEASE_HISTORY: each pins its history */
	uint32_t *view;          /* page table handed out by prepare */
	uint32_t view_cap;
	struct copy_batch copy;
	struct kvp_stats st;
	uint64_t tick;           /* LRU clock: oldest first across every list */
	uint64_t seq_pins;       /* history pins this engine's sequences hold */
	uint64_t pinned_by_seqs; /* pins on this engine's histories held by
				  * sequences (of shard 0: maybe another engine) */
	uint32_t demote_pins;    /* histories a demotion is copying (evict.c) */
	uint32_t demote_frames;  /* host frames it copies into, not attached yet */
	struct share *share;     /* prefix cache, chunks, sequences (share.h) */
	struct shard_set *set;   /* NULL: an engine alone (shard.h) */
	uint32_t shard;          /* index in set */
	struct disk_tier *disk;  /* NULL: no disk tier (engine_config) */
	uint64_t disk_tenant;
	uint32_t disk_pool;
	struct remote_tier *remote; /* NULL: no remote tier (engine_config) */
	uint32_t remote_chunk_skip; /* engine_config's */
	/* The tiers below the host tier, as registered (tier.h); NULL: none.
	 * tier_priv: each one's own state of this engine (engine_tier_priv). */
	const struct tier_ops *tier[ENGINE_TIERS_BELOW];
	void *tier_priv[ENGINE_TIERS_BELOW];
};

struct share;

/*
 * The LRU clock. Alone, a counter; in a shard set, CLOCK_MONOTONIC ns kept
 * strictly increasing per engine, so that eviction in global mode can
 * compare the heads of different shards' lists (shard.h) without a shared
 * counter every release would write.
 */
uint64_t engine_tick(struct engine *eng);

/*
 * tier.c: the tiers below, without naming them (tier.h says who calls
 * which, and when). tier_setup at engine_create: the registered tables,
 * or -EINVAL for a configured tier without one. Each wrapper asks the tiers
 * in order (disk, then remote) and answers as for a pool without them when
 * none has the operation.
 */
int tier_setup(struct engine *eng, const struct engine_config *cfg,
	       struct errbuf *e);
void tier_attach(struct engine *eng);
void tier_detach(struct engine *eng);
/* Each tier in turn until one fails or the user's history is back. */
int tier_fetch(struct engine *eng, uint64_t user, unsigned flags,
	       struct errbuf *e);
/* One tier's fetch alone (0 without it). */
int tier_fetch_one(struct engine *eng, enum engine_tier t, uint64_t user,
		   unsigned flags, struct errbuf *e);
void tier_store(struct engine *eng, struct history *h);
/* Tier t's forget: without the disk tier, -EINVAL (a selection this pool
 * cannot have); without the remote tier, 0. */
int tier_forget(struct engine *eng, enum engine_tier t, uint64_t user,
		uint32_t sel, struct errbuf *e);
int tier_forget_all(struct engine *eng, enum engine_tier t, uint32_t sel);
bool tier_info(struct engine *eng, uint64_t user, struct engine_user_info *out);
void tier_stats(const struct engine *eng, struct kvp_stats *out);
void tier_list(struct engine *eng, uint64_t cursor, uint64_t *ids, uint64_t *n,
	       uint64_t cap);
uint64_t tier_list_count(struct engine *eng, uint64_t cursor);
/* Tier t's pass of a prefix lookup (0 without one). */
int tier_prefix_more(struct engine *eng, enum engine_tier t,
		     const uint32_t *tokens, uint32_t full, uint32_t *frames,
		     uint32_t *hit, uint32_t *idle, bool wait);
bool tier_prefix_waiting(struct engine *eng);
void tier_demote_prefix(struct engine *eng, struct pc_entry *pe);
void tier_demote_chunk(struct engine *eng, struct chunk *c);
/* The first tier's answer that is not -ENOENT; -ENOENT without any. */
int tier_chunk_restore(struct engine *eng, const struct kvp_chunk_id *id,
		       uint32_t type, bool wait, struct errbuf *e);
int tier_chunk_drop(struct engine *eng, const struct kvp_chunk_id *id);
uint32_t tier_chunk_clear(struct engine *eng, uint32_t type);
uint32_t tier_publish(struct engine *eng, uint32_t max_pages, bool *more);
bool tier_chunk_kept(const struct engine *eng, uint32_t type);

/* Device frame f handed out by eng or, in a shard set, by any shard (a
 * sequence borrows other shards' history pages): for the checks. */
bool engine_device_frame_in_use(const struct engine *eng, uint32_t f);

/* The user's history wherever it lives: eng's own table, or in a shard
 * set (global mode: every lock held) the owning shard's; NULL if none. */
struct history *engine_find_history(struct engine *eng, uint64_t user);

/* Pages that hold `tokens` tokens (tokens < 2^63, so no overflow). */
static inline uint64_t pages_for(const struct engine *eng, uint64_t tokens)
{
	return (tokens + eng->P - 1) / eng->P;
}

/* lease.c: the one lease table. */
/* The lease id's slot, NULL when it is not held (stale gen, another
 * shard's, released, never made): the one stale-lease check. */
struct lease *lease_lookup(struct engine *eng, uint64_t id);
uint64_t lease_id(const struct engine *eng, const struct lease *l);
/* Make sure a free slot exists: the only step of making a lease that can
 * fail (-ENOSPC, -ENOMEM). */
int lease_reserve(struct engine *eng, struct errbuf *e);
/* After lease_reserve(): cannot fail. The caller fills in what it holds. */
struct lease *lease_new(struct engine *eng, uint32_t kind, uint32_t owner,
			uint64_t *id);
/* The slot is free, its id stale (and its group freed); nothing else. */
void lease_put(struct engine *eng, struct lease *l);
/* lease_group.c: tp > 1: eng->grp_spare allocated (before anything
 * changes), then made new lease l's group, with owner as rank 0 (a
 * sequence write lease's; a prepare and a chunk fill set their own). */
int lease_group_reserve(struct engine *eng, struct errbuf *e);
void lease_group_attach(struct engine *eng, struct lease *l, uint32_t owner);
/* lease_group.c: a member's client is gone (lease_release_owner): whether
 * owner held l. */
bool lease_group_owner_gone(struct engine *eng, struct lease *l, uint32_t owner);
/* The one release path: the kind's end (history_lease_end or
 * share_lease_end), then the slot is free and its id stale. */
void lease_release(struct engine *eng, struct lease *l);
/* Every lease of owner (a client gone); how many. */
uint32_t lease_release_owner(struct engine *eng, uint32_t owner);
/* Every sharing lease (the shared world goes: share_destroy). */
void lease_release_sharing(struct engine *eng);
/* engine.c: a history lease ends (rolls back what it did not commit,
 * unpins its history). */
void history_lease_end(struct engine *eng, struct lease *l);

/* The least recently used history of list l, NULL when it is empty. */
static inline struct history *lru_head(const struct lru_list *l)
{
	return list_first_entry_or_null(&l->list, struct history, lru_link);
}

/* evict.c */
void lru_remove(struct engine *eng, struct history *h);
/* Put an unpinned history on the list its residency says, as most recent. */
void lru_insert(struct engine *eng, struct history *h);
/* Make `need` device frames free in eng's cache (frames.h), evicting in
 * LRU order (across shards in global mode); the caller checked it can
 * with engine_device_avail(). */
void evict_for_device(struct engine *eng, uint32_t need);
/*
 * Device frames eng can have for a caller that needs `need`: its cache,
 * after pulling up to need from the pool, plus what eviction can free (the
 * device LRU, unheld chunks, idle prefix pages), h's own excluded. In
 * global mode every shard's cache, pool and evictable pages count (all
 * are reachable with every lock held). Exact: evict_for_device(need)
 * succeeds when this is >= need.
 */
uint64_t engine_device_avail(struct engine *eng, const struct history *h,
			     uint32_t need);
/* Free `need` host frames by dropping the host LRU's oldest histories (to
 * the disk tier, if any), h (may be NULL) excluded; false, dropping
 * nothing, when even that is not enough. */
bool host_make_room(struct engine *eng, uint32_t need, const struct history *h);
/* Demote h to the host tier when it fits there, else drop it. */
uint32_t demote_or_drop(struct engine *eng, struct history *h);
/* Free every frame of h and h itself. h must be unpinned. */
uint32_t history_drop(struct engine *eng, struct history *h);

/* engine.c, also for sharing (share*.c) */
/* Room for a page table of n pages in eng->view (prepare's result). */
int engine_view_reserve(struct engine *eng, uint32_t n, struct errbuf *e);
/* A sequence keeps h: off the LRU while pinned. */
void history_pin(struct engine *eng, struct history *h);
void history_unpin(struct engine *eng, struct history *h);

/* The one onload path: start copying h's host-only pages of [0, pages)
 * to frames the caller made free; the fence goes to h->onload_fence. */
uint32_t history_onload(struct engine *eng, struct history *h, uint32_t pages);

/* engine.c */
/* Wait for h's onload to land (see the top of this file); then it has none. */
void history_settle(struct engine *eng, struct history *h);
void history_free(struct engine *eng, struct history *h);
void page_set_frame(struct engine *eng, struct history *h, uint32_t i,
		    enum kvp_tier t, uint32_t frame);
void page_free_frame(struct engine *eng, struct history *h, uint32_t i,
		     enum kvp_tier t);
/* Free the tier-t frames of pages [from, to), last page first (see engine.c). */
void pages_free_frames(struct engine *eng, struct history *h, uint32_t from,
		       uint32_t to, enum kvp_tier t);

#endif /* KVPOOL_ENGINE_INTERNAL_H */
