/* SPDX-License-Identifier: MIT */
/*
 * remote_engine.h - where the engine meets the remote tier (remote_tier.h):
 * two hooks, each called from one marked place.
 *
 *  engine_remote_evicted  a prefix page leaves the device tier (evict.c /
 *                         share_prefix.c's pc_evict_head, under the
 *                         engine's lock, from the reclaimer or a prepare
 *                         making room): its bytes go to the write-behind
 *                         queue (a memcpy; the network is the remote
 *                         thread's); a device tier the CPU cannot read
 *                         (cuda's) goes through a host frame first
 *                         (share_bounce.c).
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

struct engine;
struct errbuf;
struct history;

void engine_remote_evicted(struct engine *eng, uint32_t frame, const uint8_t hash[32]);

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
 *                             ENGINE_PREPARE_DISK_DEFER while asked
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
/* At engine_destroy: what the engine holds of the remote tier goes. */
void engine_remote_user_detach(struct engine *eng);

#endif /* KVPOOL_REMOTE_ENGINE_H */
