/* SPDX-License-Identifier: MIT */
/*
 * remote_engine.h - where the engine meets the remote tier (remote_tier.h):
 * the functions behind remote_tier_ops (tier.h), which kvpoold.c registers;
 * the engine calls them only through that table (share_disk.c, the disk
 * tier's chunk and prefix-page glue, calls some directly). For prefix pages
 * (chunks: share_disk.h's share_remote_*) two hooks, each called from one
 * marked place.
 *
 *  remote_prefix_put      a prefix page leaves the device tier
 *                         (share_disk.c's share_demote_pc, from
 *                         pc_evict_head under the engine's lock, from the
 *                         reclaimer or a prepare making room): its bytes,
 *                         CPU-readable already (a device tier the CPU
 *                         cannot read went through a host frame once for
 *                         the disk and the remote tier: share_bounce.c),
 *                         go to the write-behind queue (a memcpy; the
 *                         network is the remote thread's).
 *  remote_prefix_more     a prefix lookup (share_prefix.c) whose local
 *                         chain, and the disk tier's after it, stop short:
 *                         the remote tier is asked for the missing run in
 *                         one batched round; what comes back is onloaded
 *                         into device frames (eviction makes room, the
 *                         local chain held meanwhile; on cuda through host
 *                         frames and one backend copy: share_bounce.c) and
 *                         published, then the lookup answers with it.
 */
#ifndef KVPOOL_REMOTE_ENGINE_H
#define KVPOOL_REMOTE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "tier.h"

struct chunk;
struct engine;
struct errbuf;
struct history;
struct kvp_chunk_id;
struct remote_key;
struct share_fetch;

/* The store's key of a page of eng's tenant and layout (remote_value.h). */
void remote_key_of(const struct engine *eng, uint8_t kind, const uint8_t hash[32],
		   uint32_t page, struct remote_key *k);

/* 0, or -ENOSPC: the write-behind queue is full (dropped, counted). */
int remote_prefix_put(struct engine *eng, const uint8_t hash[32], const void *page);

/*
 * The remote tier's part of a prefix lookup: *hit pages of tokens' chain
 * (full pages in all) are cached locally, their frames in frames[]; ask the
 * remote tier for the run after them and, once it is back, onload it and
 * match again (*hit and frames[] updated). 0: done; -EINPROGRESS (defer
 * only): asked, nothing changed, run the lookup again later. Called where
 * a local lookup (and the disk tier's, when there is one) stopped short.
 */
int remote_prefix_more(struct engine *eng, const uint32_t *tokens, uint32_t full,
		       uint32_t *frames, uint32_t *hit, bool defer);

/*
 * Sealed root chunks (remote_chunk.c) in the remote tier. A chunk is its
 * pages under its name id (kvp1:c:<layout>:<tenant>:<name id>:<page>) and
 * its record (struct chunk_rec, the value at page ":r") under its name id
 * and under its root entry's id, so an acquire by either finds it: one
 * round for the record, one for the pages it names (remote_tier_fetch_rec).
 * Each is a no-op without a remote tier.
 */
/* Whether chunks of type are kept in the remote tier (there is one, and
 * remote_chunk_types has the type; 0, a type not known yet: yes). */
bool remote_chunk_type_kept(const struct engine *eng, uint32_t type);
/* Queue pages[0, m) as c's pages pub_next.. (pub_next advances) and, once
 * every page is, its records (in_store set). Returns pages queued: fewer
 * when the queue is full (counted), 0 for a type not kept there. */
uint32_t remote_chunk_put(struct engine *eng, struct chunk *c,
			  const void *const *pages, uint32_t m, const void *rec,
			  uint64_t rec_len);
/* The chunk id (of type, 0: not known) from the store into f (pages, then
 * the record), nid its name id: 0, -ENOENT, -EINPROGRESS (without wait: the
 * ring worker holds the entry and retries). */
int remote_chunk_fetch(struct engine *eng, const struct kvp_chunk_id *id,
		       uint32_t type, bool wait, struct share_fetch *f, uint8_t nid[32]);
const void *remote_chunk_fetch_page(const struct share_fetch *f, uint32_t i);
void remote_chunk_fetch_end(struct engine *eng, const struct share_fetch *f,
			    bool taken);
/*
 * Ahead of eviction (remote_publish.c): queue for the store up to
 * max_pages pages of the prefix pages and sealed root chunks it lacks,
 * oldest first, while the write-behind queue (and on a GPU the host tier's
 * free frames) has room. Engine lock held. Returns pages queued; *more:
 * something is left for the next call.
 */
uint32_t remote_publish(struct engine *eng, uint32_t max_pages, bool *more);
/* A deletion: DELs of what this node knows of the chunk id in the store. */
void remote_chunk_drop(struct engine *eng, const struct kvp_chunk_id *id);

/*
 * User histories (remote_user.c; each a no-op unless remote_user_histories
 * = yes):
 *
 *  engine_remote_user_out     h, unpinned, is about to be dropped by
 *                             eviction (evict.c, beside the disk tier's
 *                             engine_disk_demote): its pages, then its
 *                             record, go to the write-behind queue (a
 *                             memcpy). A page only in a GPU's memory: the
 *                             history is skipped.
 *  engine_remote_user_onload  a prepare (or a sequence's KVP_SRC_USER) of a
 *                             user with no history in memory and none on
 *                             disk: the store is asked for its record and
 *                             pages (two rounds on the remote thread); a
 *                             history that comes back whole goes into host
 *                             frames, as one from disk. 0 (back, or a
 *                             miss: none, torn, bad); -EINPROGRESS with
 *                             ENGINE_PREPARE_DEFER while asked
 *                             (without, it waits); -ENOMEM, -EAGAIN as
 *                             engine_disk_onload.
 *  engine_remote_user_del     an explicit eviction threw the user's copies
 *                             away: a DEL of its record is queued, so no
 *                             later prepare brings it back.
 */
void engine_remote_user_out(struct engine *eng, struct history *h);
int engine_remote_user_onload(struct engine *eng, uint64_t user, unsigned flags,
			      struct errbuf *e);
void engine_remote_user_del(struct engine *eng, uint64_t user);
/* A clean stop (remote_user_histories): every unpinned history of the
 * engine written to the store (the host tier first for pages only on a
 * GPU; waiting for queue room when it runs out), so that another node
 * serves its users next. Histories queued. */
int engine_remote_user_flush_all(struct engine *eng);
/* At engine_destroy: what the engine holds of the remote tier goes. */
void engine_remote_user_detach(struct engine *eng);

/* The remote tier's operations (tier.h), for engine_tier_register. */
extern const struct tier_ops remote_tier_ops;

#endif /* KVPOOL_REMOTE_ENGINE_H */
