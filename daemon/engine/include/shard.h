/* SPDX-License-Identifier: MIT */
/*
 * shard.h - one tenant's pool split into shards that own users.
 *
 * Layout. A shard_set is what a (tenant, pool) used to be: one device tier
 * and one host tier of frames. It holds N shards (kvpool.conf `shards`,
 * default: the worker count); each shard is a whole engine (engine.h) with
 * its own mutex, user table, leases, LRU lists, statistics and a cache of
 * each tier's frames (frames.h). The tiers' memory and their frame pools
 * are the set's, shared by every shard:
 *
 *   shard_set ── mem[tier], pool[tier] (mutex: a batch of frames at a time)
 *      ├── shard 0: lock, engine (users whose hash is 0, prefix cache,
 *      │            chunks, sequences, compositions)
 *      ├── shard 1: lock, engine (users whose hash is 1)
 *      └── ...
 *
 * Ownership and order. User u belongs to shard shard_of_user(u), always;
 * a lease id carries its shard in bits 24..30 (share leases, bit 31, are
 * shard 0's). Every operation on one user takes that shard's lock only,
 * so two clients' operations on the same user are ordered by that lock
 * (and each client's in ring order by the one worker serving it), while
 * operations on users of different shards never touch a common lock except
 * the frame pool's, once per batch of frames (frames.h).
 *
 * Cross-shard operations lock every shard in ascending index order (the
 * only order any thread takes two shard locks in, so no deadlock) and set
 * `global` while they hold them:
 *  - the sharing operations (prefix cache, chunks, sequences, compose):
 *    their state lives in shard 0, and a sequence may pin and onload the
 *    histories of users in any shard (a history knows its owner engine);
 *  - a prepare that its own shard cannot serve (shard_prepare: free frames
 *    in the pool and its cache plus its own evictable pages are short):
 *    retried under every lock, evicting the oldest pages of any shard;
 *  - a dead client's leases, stats, listings, evict/offload of everything
 *    and the consistency check walk the shards one after another.
 * In global mode eviction compares LRU ticks across shards (ticks are
 * CLOCK_MONOTONIC nanoseconds, strictly increasing within a shard).
 *
 * Reclaim (kswapd's design). A reclaimer thread per set keeps the device
 * pool's free frames between a low and a high watermark: woken when a
 * shard sees the pool under `low`, it demotes the globally oldest unpinned
 * histories until `high` are free: under the owning shard's lock it pins
 * the victim and takes host frames, then copies device -> host with no
 * lock held (requests of that shard, the victim's user included, go on:
 * a writer may append, and the partial page it touched is not kept), then
 * under the lock again frees the device copies if nobody pinned the
 * history meanwhile (engine.h, engine_demote_*). It drops the oldest
 * host-only histories the same way for the host tier. A prepare then
 * allocates from free frames; one that waits for the reclaimer counts a
 * stall (kvp_stats.reclaim_stalls, reclaim_onload_stalls for those with an
 * onload), one that must evict itself counts kvp_stats.reclaim_direct.
 *
 * Staying ahead (issue 32; Linux's watermark_boost_factor works alike). A
 * stall means the reserve between the low watermark and an empty pool was
 * too small for the burst that emptied it. Each stall raises both device
 * watermarks by a boost (the frames the waiting prepare needs, a quarter
 * of the low watermark at least), up to three times the low watermark
 * (so at most a quarter of the tier, plus the gap to high); a reclaimer
 * pass that finds no stall for RECLAIM_BOOST_DECAY_NS halves it. The
 * reserve for prepares without an onload (engine.c) stays the plain low
 * watermark. Off by default (kvpool.conf `reclaim_boost`): measured, it
 * removes most stalls but raises the p99 of plain prepares more often
 * than not (bench/results/scaling-2026-11-29-issuer).
 *
 * A host tier shared by several pools (issue 31). With `devices = all` a
 * tenant has a set per GPU; host memory is the host's, not a GPU's, so
 * the sets of one tenant share one host tier: the first set allocates it
 * (pinned and portable: every GPU's copies reach it) and owns its frame
 * pool, the others are made with shard_set_config.host_of pointing at it
 * and cache frames of that pool like shards of their own. A frame belongs
 * to the one shard (of one set) that handed it out, as before, so two
 * pools never touch one frame. The sets sharing the tier are listed in
 * the owner's host_sharers; a reclaimer woken for the host tier (any of
 * them: the watermarks are the shared pool's) drops the oldest host-only
 * histories of every sharing set, walking them under the list's lock
 * (lock order: host_sharers.lock, then one shard lock at a time). The
 * owner outlives its sharers (tenant.c destroys the last pool first).
 * A pool's own direct eviction (no reclaimer: reclaim = no, or tiers of
 * fewer than RECLAIM_MIN_FRAMES in auto) drops only its own histories.
 *
 *   set of pool 0 ── mem[host], own_pool[host], sharers {0, 1, ...}
 *   set of pool 1 ── pool[host] -> pool 0's, mem[host] = pool 0's (a copy
 *                    of the descriptor, not freed), host_of = pool 0's set
 */
#ifndef KVPOOLD_SHARD_H
#define KVPOOLD_SHARD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "copy.h"
#include "engine.h"
#include "frames.h"
#include "kvpool.h"

#define SHARDS_MAX 128u /* seven bits of a lease id */

struct shard {
	pthread_mutex_t lock;
	struct engine *eng;
} __attribute__((aligned(64)));

struct reclaimer {
	pthread_t thread;
	pthread_mutex_t lock;       /* wake, stop */
	pthread_cond_t cond;
	bool started, wake, stop;
	bool dry;                   /* its last device pass found nothing */
	uint64_t dry_ns;            /* CLOCK_MONOTONIC when it found that */
	uint32_t want;              /* device frames waiting prepares need */
	uint32_t low[KVP_TIERS];    /* free frames below which it is woken */
	uint32_t high[KVP_TIERS];   /* it stops once this many are free */
	bool boost_on;              /* shard_set_config.boost */
	uint32_t boost;             /* device frames added to both marks (atomic) */
	uint64_t stall_ns;          /* the last stall (atomic) */
	uint64_t runs;              /* times it was woken (under lock) */
	struct engine_demotion dem; /* the thread's own, with its copy batch */
	struct copy_batch copy;
};

/* The sets sharing one host tier (the owner's, which is v[0]). */
struct host_sharers {
	pthread_mutex_t lock;            /* n, v; held by a host reclaim pass */
	uint32_t n;
	struct shard_set *v[KVP_POOLS_MAX];
};

struct shard_set {
	uint32_t n;
	struct shard *v;                 /* [n] */
	struct frame_pool *pool[KVP_TIERS]; /* own_pool[t], or host_of's host pool */
	struct frame_pool own_pool[KVP_TIERS];
	struct tier_mem mem[KVP_TIERS];  /* mem[host]: host_of's when it is set */
	struct shard_set *host_of;       /* whose host tier this set shares */
	struct host_sharers sharers;     /* the sets sharing this set's host tier */
	const struct backend_ops *be;
	void *be_ctx;
	bool global;                     /* every shard's lock is held */
	struct reclaimer rc;
};

enum reclaim_mode {
	RECLAIM_AUTO,                    /* tiers of RECLAIM_MIN_FRAMES or more */
	RECLAIM_ON,                      /* every tier (tests use it) */
	RECLAIM_OFF,
};

/* Tiers smaller than this get no background reclaim in RECLAIM_AUTO: a few
 * hundred pages are a test's or a toy's, sized to the page and expecting
 * eviction exactly when a prepare needs it. */
#define RECLAIM_MIN_FRAMES 1024u

struct shard_set_config {
	struct engine_config ec;         /* layout, tier sizes, backend */
	uint32_t shards;                 /* >= 1 */
	enum reclaim_mode reclaim;
	bool boost;                      /* watermarks raised by stalls */
	/* Share this set's host tier (same page size and host_frames; NULL:
	 * allocate one). It must outlive the new set. */
	struct shard_set *host_of;
};

int shard_set_create(struct shard_set **out, const struct shard_set_config *cfg,
		     struct errbuf *e);
void shard_set_destroy(struct shard_set *s);

/* The shard that owns user / lease. */
uint32_t shard_of_user(const struct shard_set *s, uint64_t user);
uint32_t shard_of_lease(const struct shard_set *s, uint64_t lease);

/* Lock one shard; its engine. */
struct engine *shard_lock(struct shard_set *s, uint32_t i);
void shard_unlock(struct shard_set *s, uint32_t i);
/* Every shard in index order (global mode); shard 0's engine. */
struct engine *shard_lock_all(struct shard_set *s);
void shard_unlock_all(struct shard_set *s);

/* Frames a shard's cache of tier t keeps at most (frames.h). */
uint32_t shard_cache_cap(const struct shard_set *s, int t);

/* Wake the reclaimer when the device pool is under its low watermark. */
void shard_reclaim_hint(struct shard_set *s);
/* Wake it now to free need device frames beyond its high watermark; false
 * when it is not running or found nothing to evict on a run that ended
 * less than a millisecond ago (then waiting for it would be in vain). */
bool shard_reclaim_kick(struct shard_set *s, uint32_t need);
/* A prepare stalled (its first wait) for need device frames: boost the
 * device watermarks (no-op without shard_set_config.boost). */
void shard_reclaim_stalled(struct shard_set *s, uint32_t need);

/* The whole set, each shard under its lock in turn (global: all held). */
void shard_set_stats(struct shard_set *s, struct kvp_stats *out);
uint32_t shard_set_release_owner(struct shard_set *s, uint32_t owner);
int shard_set_check(struct shard_set *s, struct errbuf *e);
const struct tier_mem *shard_set_tier(const struct shard_set *s, enum kvp_tier t);

#endif /* KVPOOLD_SHARD_H */
