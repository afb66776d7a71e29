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

#include "remote_engine.h"
#include "remote_tier.h"
#include "share_disk.h"
#include "share_internal.h"

/* Room for pages: the queue's, and on a GPU free host frames to bounce. */
static bool room_for(struct engine *eng, uint32_t pages)
{
	uint64_t pb = eng->layout.page_bytes;

	if (remote_tier_free_bytes(eng->remote) < (pages + 1) * pb)
		return false;
	return eng->mem[KVP_TIER_DEVICE].host_visible ||
	       frames_reserve(&eng->frames[KVP_TIER_HOST], pages) >= pages;
}

uint32_t remote_publish(struct engine *eng, uint32_t max_pages, bool *more)
{
	struct share *s = eng->share;
	struct pc_entry *pe;
	struct chunk *c;
	uint32_t done = 0;

	*more = false;
	if (!eng->remote || !s)
		return 0;
	while (done < max_pages &&
	       (pe = list_first_entry_or_null(&s->pub_pcs, struct pc_entry, pub))) {
		if (!room_for(eng, 1))
			break;
		list_del(&pe->pub);
		done += share_pc_down(eng, pe, false, true);
	}
	while (done < max_pages &&
	       (c = list_first_entry_or_null(&s->pub_chunks, struct chunk, pub))) {
		/* A piece of what it lacks (its records once no page is
		 * left: a call for none); it stays first until complete. */
		uint32_t want = c->npages - c->pub_next, got;

		if (want > max_pages - done)
			want = max_pages - done;
		if (!room_for(eng, want))
			break;
		got = share_chunk_down(eng, c, false, want ? want : 1);
		done += got;
		if (c->in_store || (!got && want)) {
			list_del(&c->pub); /* done, or failing: eviction writes it */
			continue;
		}
		break; /* the batch ended inside it, or its records wait for room */
	}
	*more = !list_empty(&s->pub_pcs) || !list_empty(&s->pub_chunks);
	return done;
}
