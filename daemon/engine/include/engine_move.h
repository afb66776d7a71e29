/* SPDX-License-Identifier: MIT */
/*
 * engine_move.h - a user's history moved from one pool to another, and a
 * chunk copied to another (issue 31: one kvpoold, a pool per GPU).
 *
 * src and dst are two engines of one tenant in two pools (two GPUs; on shm
 * two sets of memfds): the same layout, each its own tiers. The caller holds
 * both engines' locks (the server takes the two shards owning the user in
 * ascending pool order, so two moves cannot deadlock), which orders the move
 * with every other operation on the user in either pool.
 *
 * The committed history is moved whole, in one step: every page with a
 * frame in src's device tier gets a fresh device frame in dst, every page
 * with a host frame a fresh host frame there, and the bytes are copied
 * (device to device: the backend's copy_peer, a peer copy between GPUs; on
 * host-visible tiers, shm's memfds and every host tier, memcpy). Then dst
 * has the history (same start, same length, the same tokens) and src has
 * none: its frames are free, and its disk tier copy, if any, is forgotten
 * so a later prepare in src cannot bring an old one back.
 */
#ifndef KVPOOL_ENGINE_MOVE_H
#define KVPOOL_ENGINE_MOVE_H

#include <stdint.h>

#include "engine.h"

struct engine_move_out {
	uint64_t start, len;       /* the history moved */
	uint32_t pages;            /* its pages */
	uint32_t pages_device;     /* pages copied device -> device */
	uint32_t pages_host;       /* pages copied host -> host */
	uint64_t bytes;            /* bytes copied, both tiers */
};

/*
 * Move user's history from src to dst (see the top of this file). To make
 * room, dst evicts as a prepare would (its LRU, demotion to its host tier).
 * Returns 0 with *out filled; on an error src is unchanged (dst may have
 * evicted for room before it found the host tier short):
 *   -ENOENT      src has no history of user in memory
 *   -EBUSY       a lease or a sequence holds it in src (prepared and not
 *                committed, or not released): commit or release first
 *   -EAGAIN      the reclaimer is demoting it in src just now: try again
 *   -EEXIST      dst has a history of user
 *   -ENOSPC      dst cannot hold its pages with everything else there pinned
 *   -EOPNOTSUPP  the backend cannot copy between the two pools' tiers
 *   -EIO, -ENOMEM
 */
int engine_history_move(struct engine *src, struct engine *dst, uint64_t user,
			struct engine_move_out *out, struct errbuf *e);

/* What engine_chunk_copy copied. */
struct engine_chunk_copy_out {
	struct kvp_chunk_id id;    /* the entry asked for (a name: its root) */
	uint32_t entries;          /* entries registered in dst */
	uint32_t pages;            /* their pages */
	uint64_t bytes;            /* bytes copied */
};

/*
 * Copy chunk entry id (or, for a name, its root entry) from src into dst,
 * with every entry it hangs under that dst lacks, root first
 * (share_chunk_copy.c): registered under the same ids, pages copied,
 * sealed. Both engines are shard 0 of their pools, every shard of both
 * locked (global mode). src keeps its entries. Entries dst has already
 * are not copied (0 entries: nothing to do). owner: the caller's client
 * id, the fill leases' owner for the time of the copy. Errors (entries
 * copied before the failing one stay, each whole):
 *   -ENOENT  src does not hold it, or a linked entry's name has no ready
 *            root entry in src to copy with it
 *   -EAGAIN  an entry of the chain is being filled (in src or dst)
 *   -EINVAL  the same pool, other layouts, or dst refused a registration
 *   -ENOMEM, -E2BIG, -ENOSPC as a registration in dst; -EIO a failed copy
 */
int engine_chunk_copy(struct engine *src, struct engine *dst,
		      const struct kvp_chunk_id *id, uint32_t owner, uint64_t now_ns,
		      struct engine_chunk_copy_out *out, struct errbuf *e);

#endif /* KVPOOL_ENGINE_MOVE_H */
