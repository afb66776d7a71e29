/* SPDX-License-Identifier: MIT */
/*
 * engine.h - one KV page pool: two tiers of frames, user histories, leases,
 * LRU eviction, offload and onload.
 *
 * The engine is what kvpoold serves; it knows nothing of sockets or rings and
 * is linked straight into the unit tests and `kvbench engine`. One engine is
 * one pool of one tenant (a tenant's frames live in allocations of its own).
 * It is not thread-safe: the caller serialises calls on one engine (except
 * engine_fence_done / engine_fence_wait, see there).
 *
 * Semantics (DESIGN.md, "The operations"):
 *
 *  - A user history holds tokens [start, start+len). Page j of it holds
 *    tokens [start + j*P, start + (j+1)*P), P = layout.page_tokens; every
 *    page has a frame in the device tier, the host tier, or both.
 *  - prepare(user, start_pos, n_new) checks continuity (start_pos must be
 *    start+len, unless nothing is cached), onloads host-only pages, allocates
 *    pages for the n_new tokens (evicting unpinned users in LRU order when the
 *    device tier is full), pins the history and returns a lease. On any error
 *    nothing is changed.
 *  - Onload is asynchronous: the prepare enqueues the host -> device copy
 *    and returns; the lease's fence says when the pages are usable
 *    (engine_fence_done). Until then the caller must not hand the page table
 *    out: its pages are still being written. Every prepare of the user while
 *    that copy is in flight returns the same fence (same pages). The engine
 *    itself never lets a frame under a copy be freed, reused or read: it
 *    waits for the fence first (the release that unpins the user, a commit
 *    that drops a host copy, offload, read_tokens, destroy). On the shm
 *    backend copies land at once and the fence is always 0.
 *  - commit(lease, n) makes the first n new tokens part of the history and
 *    frees the pages no committed token uses. A lease commits at most once.
 *  - release(lease) unpins; an uncommitted reservation is rolled back. When a
 *    history is unpinned and longer than max_tokens_per_user, whole pages are
 *    trimmed from its head and start advances.
 *  - One write reservation per user at a time: a prepare with n_new > 0 while
 *    another lease of the user has not committed fails with -EBUSY. Read-only
 *    leases (n_new == 0) may be held by many at once.
 *
 * Eviction: users not pinned by a lease sit on two LRU lists: those holding
 * device frames (device LRU) and those holding only host frames (host LRU,
 * in the order they got there). When a prepare needs device frames, the
 * device LRU's oldest user is demoted: its pages are copied to the host tier
 * (room is made by dropping the host LRU's oldest users) or, when the host
 * tier cannot take them, dropped. If the frames cannot be found because the
 * rest is pinned, the prepare fails with -ENOMEM and evicts nothing.
 */
#ifndef KVPOOL_ENGINE_H
#define KVPOOL_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "errbuf.h"
#include "kvpool.h"

struct engine;

struct engine_config {
	struct kvp_layout layout;
	uint32_t device_frames;       /* pages the device tier holds (> 0) */
	uint32_t host_frames;         /* pages the host tier holds (may be 0) */
	uint64_t max_tokens_per_user; /* 0: unlimited; else >= page_tokens */
	const struct backend_ops *backend; /* NULL: the shm backend */
	void *backend_ctx;
	/* A shard of a set (shard.h): the tiers' memory and frame pools are
	 * the set's, frames are cached per shard, lease ids carry `shard`, and
	 * a prepare this shard cannot serve alone fails with -EAGAIN (the set
	 * retries it in global mode). NULL: an engine with tiers of its own. */
	struct shard_set *set;
	uint32_t shard;
	/* The disk tier under the host tier (daemon/disk/disk_tier.h), NULL:
	 * none; this pool's key there (disk_tenant_key of the tenant's name,
	 * the pool's index). */
	struct disk_tier *disk;
	uint64_t disk_tenant;
	uint32_t disk_pool;
	/* The remote tier (daemon/remote/remote_tier.h), NULL: none; its keys
	 * use disk_tenant. */
	struct remote_tier *remote;
	/* 1 << enum kvp_chunk_type of the chunk types NOT kept there (neither
	 * written nor asked for at registration); 0: every type is. */
	uint32_t remote_chunk_skip;
	/* A tensor-parallel pool's ranks (0 or 1: none): its backend is
	 * backend_stripe, layout the whole model's, each frame every rank's
	 * page (backend.h). The disk and remote tiers key its records with
	 * tp (disk_layout_id_tp); group leases (engine_lease_join). */
	uint32_t tp;
};

/* Create a pool; -EINVAL / -ENOMEM with a message in e. */
int engine_create(struct engine **out, const struct engine_config *cfg,
		  struct errbuf *e);
void engine_destroy(struct engine *eng);

const struct kvp_layout *engine_layout(const struct engine *eng);
/* engine_config.tp: 1 for a pool that is not tensor-parallel. */
uint32_t engine_tp(const struct engine *eng);
/* The tier's memory as the backend mapped it (for clients: fd and size). */
const struct tier_mem *engine_tier(const struct engine *eng, enum kvp_tier t);

struct engine_user_info {
	uint64_t start;        /* first cached token position */
	uint64_t len;          /* committed tokens cached */
	uint32_t pages;        /* pages holding committed tokens */
	uint32_t pages_device; /* of those, with a device frame */
	uint32_t pages_host;   /* of those, with a host frame */
	uint32_t leases;       /* leases held on the user */
	uint32_t pages_disk;   /* pages of its copy on the disk tier (0: none) */
	uint64_t tokens_disk;  /* committed tokens of that copy */
	bool exists;           /* false: nothing cached, no lease */
};

/* Never fails: an unknown user has exists == false and zeros elsewhere. */
void engine_info(struct engine *eng, uint64_t user,
		 struct engine_user_info *out);

/*
 * What a prepare returns. The pointers stay valid until the next call on the
 * engine; copy what you keep.
 */
struct engine_lease {
	uint64_t id;             /* handle for commit / release */
	uint64_t start;          /* history start */
	uint64_t len;            /* committed tokens before this lease */
	uint32_t n_new;          /* tokens reserved for writing */
	uint32_t npages;         /* page table entries, new pages included */
	const uint32_t *frames;  /* device frame of each page, in order */
	uint32_t last_page_len;  /* tokens in the last page once n_new are written */
	uint64_t hit_tokens;     /* == len: cached tokens the caller reuses */
	uint32_t onloaded_pages; /* host -> device copies this prepare made */
	uint64_t fence;          /* 0: the pages are ready; else the onload
				  * still landing in them (engine_fence_done) */
};

/*
 * Prepare user's history for n_new tokens from start_pos (see the top of this
 * file). owner tags the lease for engine_release_owner() (a client id).
 * Errors (nothing changed):
 *   -EINVAL  gap or overlap, the message starting with seed 002's sentence
 *            ("The input sequence has missing tokens from A to B (both
 *            inclusive)." / "... has overlapping tokens from A to B (both
 *            inclusive)."; the overlap is the input's intersection with the
 *            cached [start, start+len)), an input starting before a trimmed
 *            head ("The input sequence starts at token S, before the first
 *            cached token T (tokens before it were trimmed)."), or a history
 *            position past 2^63
 *   -EBUSY   another lease of the user holds an uncommitted reservation
 *   -ENOMEM  the device tier cannot hold the pages with everything else pinned
 *   -E2BIG   more pages than the whole device tier
 *   -ENOSPC  no lease slot left (2^24 leases outstanding)
 *   -EAGAIN  (a shard only) the shard's free and evictable frames are short:
 *            retry with every shard locked (shard.h), nothing changed
 */
int engine_prepare(struct engine *eng, uint64_t user, uint64_t start_pos,
		   uint32_t n_new, uint32_t owner, struct engine_lease *out,
		   struct errbuf *e);

/*
 * engine_prepare with flags. ENGINE_PREPARE_WAIT_RECLAIM: a shard whose
 * reclaimer is running and not dry (shard.h) returns -EINPROGRESS, having
 * woken it and changed nothing, instead of evicting for the frames itself:
 * the caller retries a little later, and other users' requests pass in the
 * meantime. ENGINE_PREPARE_COUNT: count a stall (first try only).
 */
#define ENGINE_PREPARE_WAIT_RECLAIM 1u
#define ENGINE_PREPARE_COUNT 2u
/* ENGINE_PREPARE_DEFER: a history being read back from a tier below (the
 * disk or the remote tier) returns -EINPROGRESS with its typed wait (tier.h)
 * instead of waiting for the read: the caller retries later. */
#define ENGINE_PREPARE_DEFER 4u
int engine_prepare_flags(struct engine *eng, uint64_t user, uint64_t start_pos,
			 uint32_t n_new, uint32_t owner, unsigned flags,
			 struct engine_lease *out, struct errbuf *e);

/* Slots of the lease's new tokens [first, first+n) in write order. */
int engine_lease_slots(struct engine *eng, uint64_t lease, uint32_t first,
		       uint32_t n, struct kvp_slot *out, struct errbuf *e);

/* -ENOENT unknown/released lease, -EALREADY committed twice, -EINVAL n > n_new. */
int engine_commit(struct engine *eng, uint64_t lease, uint32_t n,
		  struct errbuf *e);
/* -ENOENT unknown or already released lease. */
int engine_release(struct engine *eng, uint64_t lease, struct errbuf *e);
/*
 * Group leases: a tensor-parallel pool (engine_config.tp > 1, at most
 * ENGINE_TP_MAX ranks). Rank 0's client prepares (engine_prepare: the
 * caller refuses ranks > 0); rank r's joins that lease, getting the same
 * page table (engine_lease_join: as a prepare's, no new lease id); every
 * rank commits it (engine_commit_rank): each commit before the last is
 * recorded and answers ENGINE_COMMIT_PENDING, the last one takes effect as
 * engine_commit would (same n from every rank, at most the lease's n_new).
 * A release by a member rank (engine_release_rank) or its client's death
 * (engine_release_owner) before the group committed releases the lease for
 * every rank, as a dead client's release does (nothing changes); the
 * others' later commits and joins answer -ESTALE saying whose release or
 * death ended it, and each leaves it by its release (which answers 0).
 * Once the group committed, each member's release only ends its own hold;
 * the lease (its pin) goes with the last; a rank that committed and then
 * releases before the others committed leaves when the group commits (it
 * does not end the group). *left says whether the caller's
 * rank no longer holds the lease after the call (its count of leases).
 *
 * join:    -EMSGSIZE a page table of more than max_pages entries;
 *          -EINVAL not a tensor-parallel pool, rank 0 or >= tp, a sharing
 *          lease; -ESTALE no such lease (stale id) or ended; -EALREADY this
 *          rank joined already; -EPERM the lease's owner is no rank 0.
 * commit:  -ENOENT unknown lease; -ESTALE ended; -EPERM the caller is not
 *          that rank's member; -EALREADY that rank committed; -EINVAL n
 *          past n_new or unlike another rank's n.
 * release: -ENOENT unknown lease; -EPERM not that rank's member.
 */
#define ENGINE_TP_MAX 8u
#define ENGINE_COMMIT_PENDING 1
int engine_lease_join(struct engine *eng, uint64_t lease, uint32_t rank,
		      uint32_t owner, uint64_t max_pages, struct engine_lease *out,
		      struct errbuf *e);
int engine_commit_rank(struct engine *eng, uint64_t lease, uint32_t rank,
		       uint32_t owner, uint32_t n, bool release, bool *left,
		       struct errbuf *e);
int engine_release_rank(struct engine *eng, uint64_t lease, uint32_t rank,
			uint32_t owner, bool *left, struct errbuf *e);
/*
 * Chunk fills are group leases too (tp > 1): rank 0 registers (the caller
 * refuses registrations and links by ranks > 0), ranks 1..tp-1 join its
 * fill lease (engine_lease_join: the entry's page table), each writes its
 * slice and seals. A seal before the last answers ENGINE_COMMIT_PENDING
 * and the rank leaves the group (its part is done); the last one makes
 * the entry READY and ends the lease. A member's release or death before
 * that abandons the entry for every rank (it dies unpublished, as a tp = 1
 * fill released unsealed); the others' seals answer -ESTALE saying so.
 * n: the tokens committed (all of the entry's), or UINT32_MAX for a seal.
 * engine_commit_rank and engine_release_rank take chunk fill leases too;
 * engine_lease_grouped says whether an id is a group lease (or the record
 * of an ended one) of this engine.
 *
 * Sequence write leases are group leases too (tp > 1): rank 0 allocates,
 * creates and extends (the caller refuses those calls from ranks > 0),
 * ranks 1..tp-1 join the write lease (the sequence's page table), and it
 * commits as a history lease does: ENGINE_COMMIT_PENDING until the last
 * rank's commit, which grows the sequence. A release or death before that
 * drops the new tokens for all (the sequence keeps what it had).
 */
int engine_chunk_seal_rank(struct engine *eng, uint64_t lease, uint32_t rank,
			   uint32_t owner, uint32_t n, struct errbuf *e);
bool engine_lease_grouped(struct engine *eng, uint64_t lease);

/* Release every lease of owner (a dead client); returns how many. */
uint32_t engine_release_owner(struct engine *eng, uint32_t owner);

/*
 * Copy the user's committed device pages to the host tier; both copies stay
 * valid. Returns pages copied, -ENOENT for an unknown user, -ENOSPC when the
 * host tier cannot take them (nothing changed).
 */
int engine_offload(struct engine *eng, uint64_t user, struct errbuf *e);
/* Offload every user; returns pages copied or -ENOSPC once the host is full. */
int engine_offload_all(struct engine *eng, struct errbuf *e);

/*
 * Drop the user's pages from the selected tiers. KVP_SEL_DEVICE alone demotes
 * (pages without a host copy are copied there when it has room, else the user
 * is dropped); a user left with no frames is dropped. Returns pages freed,
 * -ENOENT unknown user, -EBUSY when a lease holds the user.
 */
int engine_evict(struct engine *eng, uint64_t user, uint32_t sel,
		 struct errbuf *e);
/* The same for every unpinned user; returns users affected; *skipped gets
 * how many were passed over because a lease holds them. */
int engine_evict_all(struct engine *eng, uint32_t sel, uint32_t *skipped);

void engine_stats(const struct engine *eng, struct kvp_stats *out);

/* max_tokens_per_user at run time (kvpoold's SIGHUP reload): histories
 * past it are trimmed at their next commit. 0 or >= page_tokens. */
void engine_set_max_tokens(struct engine *eng, uint64_t max_tokens);

/*
 * Free at least max host frames (or all it can), dropping the oldest
 * host-only histories, and give this shard's cached host frames back to
 * the set's pool. For the reclaimer (shard.h; the device tier goes through
 * engine_demote_*); returns frames freed.
 */
uint32_t engine_reclaim_host(struct engine *eng, uint32_t max);
/*
 * The reclaimer's demotion, its copy outside the shard's lock:
 *   plan   (locked)   the device tier's oldest: a chunk or prefix page is
 *                     freed at once; a history is pinned, host frames are
 *                     taken for up to max of its pages without a host copy;
 *   copy   (unlocked) device -> host, through the caller's copy batch; the
 *                     pinned history's frames cannot go meanwhile, and a
 *                     writer may only append (its partial page is checked);
 *   finish (locked)   the copies are attached where the page did not
 *                     change; if nobody else pinned the history meanwhile
 *                     its device frames with a host copy are freed; unpin.
 * One round takes the oldest histories until max pages are planned. copy
 * enqueues them in pieces of whole histories, DEMOTE_PIECE_PAGES or more
 * each (backend.h, copy_start: the link stays busy from one piece to the
 * next), and returns; then per piece, in order: wait (unlocked) until it
 * landed, finish (locked) its histories, so the first frames come back
 * after one piece's copy, not the round's. plan returns frames freed at
 * once; d->nh > 0 when a copy is planned.
 */
#define DEMOTE_MAX_PAGES 256u
#define DEMOTE_MAX_USERS 64u
#define DEMOTE_PIECE_PAGES 32u
struct engine_demotion {
	uint32_t nh;                  /* histories pinned, in LRU order */
	struct {
		struct history *h;
		uint32_t wgen;        /* h->wgen when planned */
		uint32_t partial;     /* its partly filled page, or UINT32_MAX */
		uint32_t first, n;    /* its pages in the arrays below */
	} v[DEMOTE_MAX_USERS];
	bool failed;                  /* the copy failed: attach nothing */
	uint32_t npiece;              /* copy: pieces enqueued */
	struct {
		uint32_t h0, h1;      /* its histories: v[h0 .. h1) */
		bool failed;
		uint64_t ticket;      /* backend copy_start's */
		uint64_t bytes, ns;   /* ns: from its start to seen landed */
		uint64_t start_ns;    /* when enqueued */
	} piece[DEMOTE_MAX_USERS];
	uint64_t landed_ns;           /* when the last piece was seen landed */
	uint32_t n;                   /* pages to copy, all histories */
	uint32_t page[DEMOTE_MAX_PAGES];  /* page index in its history */
	uint32_t dev[DEMOTE_MAX_PAGES];   /* its device frame when planned */
	uint32_t host[DEMOTE_MAX_PAGES];  /* the host frame taken for it */
};
struct copy_batch;
uint32_t engine_demote_plan(struct engine *eng, struct engine_demotion *d,
			    uint32_t max);
int engine_demote_copy(struct engine *eng, struct engine_demotion *d,
		       struct copy_batch *cb);
/* Unlocked: until piece p has landed (its time counted from when the link
 * could start on it: enqueued and the piece before it landed). */
void engine_demote_wait(struct engine *eng, struct engine_demotion *d, uint32_t p);
/* Locked: finish piece p's histories; device frames freed. After the last
 * piece the demotion is over (d->nh = 0). */
uint32_t engine_demote_finish(struct engine *eng, struct engine_demotion *d,
			      uint32_t p);

/* The tick of tier t's oldest evictable page, UINT64_MAX when none. */
uint64_t engine_oldest_tick(const struct engine *eng, enum kvp_tier t);

/* Page table entries a prepare of n_new tokens for user would return (so a
 * caller can size the result buffer before preparing). */
uint64_t engine_prepare_pages(struct engine *eng, uint64_t user, uint32_t n_new);

/* The owner a lease was prepared for, or -ENOENT (as a negative int64). */
int64_t engine_lease_owner(struct engine *eng, uint64_t lease);
/* The user a lease holds in *user, or -ENOENT. */
int engine_lease_user(struct engine *eng, uint64_t lease, uint64_t *user);

/*
 * Nonzero once the onload a lease's fence names has landed (fence 0: at
 * once); engine_fence_wait() blocks until it has. Both touch only the
 * backend, never the engine's state, so unlike every other call here they
 * may be made without the caller's lock on the engine (the daemon polls
 * fences that way). A fence stays valid after its lease is gone.
 */
int engine_fence_done(struct engine *eng, uint64_t fence);
void engine_fence_wait(struct engine *eng, uint64_t fence);

/*
 * List users with id >= cursor in ascending id order, at most max rows.
 * *next is the cursor of the next page (0 when this page is the last).
 * Returns rows written or -ENOMEM. O(users log users): an admin operation.
 */
int engine_list_users(struct engine *eng, uint64_t cursor,
		      struct kvp_user_info *rows, uint32_t max, uint64_t *next);

/*
 * Walk every structure and check that frames, lists and counters agree
 * (free + used == total per tier, every used frame owned by exactly one page,
 * LRU lists hold exactly the unpinned resident users). Returns 0 or -EFAULT
 * with what disagreed in e. O(users + frames): for tests and debug builds.
 */
int engine_check(struct engine *eng, struct errbuf *e);

/* For tests: read committed tokens [pos, pos+n) of a user into out
 * ([n][layers][2][heads][dim]) from whichever tier holds them. */
int engine_read_tokens(struct engine *eng, uint64_t user, uint64_t pos,
		       uint32_t n, void *out, struct errbuf *e);

#endif /* KVPOOL_ENGINE_H */
