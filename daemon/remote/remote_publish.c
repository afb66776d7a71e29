/* SPDX-License-Identifier: MIT */
/*
 * remote_publish.c - the store gets what this daemon computed ahead of
 * eviction, so another node can use a prompt or a document this one keeps
 * hot (remote_engine.h).
 *
 * A prefix page becomes immutable when it is published (a full page
 * committed), a root chunk when it is sealed: each goes on its list then
 * (share.pub_pcs, share.pub_chunks), oldest first, and leaves it when it is
 * queued here, evicted (eviction queues it itself), killed, or when it came
 * from the store (in_store). The reclaimer thread calls remote_publish()
 * every RECLAIM_PUBLISH_MS while something is listed (shard.c), under the
 * lock of the shard holding the shared world, a bounded batch at a time:
 * the copy into the write-behind queue is a memcpy per page (on a GPU one
 * device -> host copy through host frames first), so a batch holds the
 * lock for a few milliseconds at most, and no request waits on the store.
 *
 * Only room the daemon has to spare is used: the batch stops where the
 * write-behind queue is full (the rest waits for the next tick, nothing is
 * dropped), and on a GPU where no host frame is free for the copy (no host
 * history is pushed out for it; eviction writes what is left).
 */
#include <errno.h>

#include "engine.h"
#include "remote_engine.h"
#include "remote_tier.h"
#include "share_disk.h"
#include "tier_services.h"

/* Room for pages: the queue's, and on a GPU free host frames to bounce. */
static bool room_for(struct engine *eng, uint32_t pages)
{
	uint64_t pb = engine_layout(eng)->page_bytes;

	if (remote_tier_free_bytes(tier_remote(eng)) < (pages + 1) * pb)
		return false;
	return engine_tier(eng, KVP_TIER_DEVICE)->host_visible ||
	       tier_host_reserve(eng, pages) >= pages;
}

uint32_t remote_publish(struct engine *eng, uint32_t max_pages, bool *more)
{
	struct pc_entry *pe;
	struct chunk *c;
	uint32_t done = 0;

	*more = false;
	if (!tier_remote(eng) || !tier_share_frames(eng))
		return 0;
	while (done < max_pages && (pe = tier_pub_pc_first(eng))) {
		if (!room_for(eng, 1))
			break;
		tier_pub_pc_take(pe);
		done += share_pc_down(eng, pe, false, true);
	}
	while (done < max_pages && (c = tier_pub_chunk_first(eng))) {
		/* A piece of what it lacks (its records once no page is
		 * left: a call for none); it stays first until complete. */
		uint32_t want = tier_chunk_npages(c) - tier_chunk_pub_next(c), got;

		if (want > max_pages - done)
			want = max_pages - done;
		if (!room_for(eng, want))
			break;
		got = share_chunk_down(eng, c, false, want ? want : 1);
		done += got;
		if (tier_chunk_in_store(c) || (!got && want)) {
			tier_pub_chunk_take(c); /* done, or failing: eviction writes it */
			continue;
		}
		break; /* the batch ended inside it, or its records wait for room */
	}
	*more = tier_pub_pending(eng);
	return done;
}
