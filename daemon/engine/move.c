/* SPDX-License-Identifier: MIT */
/*
 * move.c - a history from one pool to another (engine_move.h).
 *
 * Everything that can fail comes before anything of src changes: the
 * checks, dst's room, dst's history and page table, the copies. Only then
 * does dst take the history and src let it go, so a failure at any step
 * leaves src as it was and gives dst's new frames back.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"
#include "engine_internal.h"
#include "engine_move.h"
#include "shard.h"
#include "user_table.h"

static int move_checks(struct engine *src, struct engine *dst, uint64_t user,
		       struct history **hp, struct errbuf *e)
{
	struct history *h = user_table_find(&src->users, user), *d;

	if (!h || !h->npages)
		return errbuf_set(e, -ENOENT, "user %" PRIu64 " has no history "
				  "in this pool's device or host tier", user);
	if (h->demoting)
		return errbuf_set(e, -EAGAIN, "user %" PRIu64 " is being demoted "
				  "to the host tier; try again in a moment", user);
	if (h->pins || h->write_lease)
		return errbuf_set(e, -EBUSY, "user %" PRIu64 " is held by %" PRIu32
				  " lease(s) or sequence(s) (a prepare not committed, "
				  "or not released): commit or release first", user,
				  h->pins ? h->pins : 1);
	d = user_table_find(&dst->users, user);
	/* A history without pages lives only while a lease pins it (a
	 * prepare that found nothing): that lease is in the way. */
	if (d && !d->npages)
		return errbuf_set(e, -EBUSY, "user %" PRIu64 " is held by a lease "
				  "in the destination pool; release it first", user);
	if (d)
		return errbuf_set(e, -EEXIST, "user %" PRIu64 " has a history in "
				  "the destination pool already; evict it there "
				  "first", user);
	if (memcmp(&src->layout, &dst->layout, sizeof(src->layout)))
		return errbuf_set(e, -EINVAL, "the two pools serve different "
				  "layouts");
	*hp = h;
	return 0;
}

/* dst's free frames for h's pages in each tier, evicting there as a
 * prepare would; -ENOSPC when even that is not enough. */
static int move_room(struct engine *dst, const struct history *h,
		     uint64_t user, struct errbuf *e)
{
	uint32_t nd = h->nres[KVP_TIER_DEVICE], nh = h->nres[KVP_TIER_HOST];

	if (nd && engine_device_avail(dst, NULL, nd) < nd)
		return errbuf_set(e, -ENOSPC, "user %" PRIu64 ": the destination "
				  "pool's device tier cannot take %" PRIu32 " pages "
				  "(the rest is held by leases); release some or "
				  "raise device_mem", user, nd);
	if (nd)
		evict_for_device(dst, nd);
	if (nh && !host_make_room(dst, nh, NULL))
		return errbuf_set(e, -ENOSPC, "user %" PRIu64 ": the destination "
				  "pool's host tier cannot take %" PRIu32 " pages; "
				  "evict host pages there or raise host_mem", user, nh);
	return 0;
}

/* A history for user in dst with h's shape and no frame yet. */
static struct history *move_history_new(struct engine *dst, const struct history *h)
{
	struct history *n;

	if (user_table_reserve(&dst->users))
		return NULL;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->pages = malloc((size_t)h->npages * sizeof(*n->pages));
	if (!n->pages) {
		free(n);
		return NULL;
	}
	n->owner = dst;
	n->user = h->user;
	n->start = h->start;
	n->len = h->len;
	n->npages = h->npages;
	n->cap = h->npages;
	n->lru = LRU_NONE;
	INIT_LIST_HEAD(&n->lru_link);
	for (uint32_t i = 0; i < n->npages; i++)
		for (int t = 0; t < KVP_TIERS; t++)
			n->pages[i].frame[t] = FRAME_NONE;
	return n;
}

/* Give n's frames in dst, and n, back (a copy failed). */
static void move_undo(struct engine *dst, struct history *n)
{
	history_free(dst, n);
}

/* Frames in dst for every page of h that has one in tier t, and the copy
 * (copy.h, COPY_PEER: landed on return). */
static int move_tier(struct engine *src, struct engine *dst,
		     const struct history *h, struct history *n, enum kvp_tier t,
		     struct copy_batch *b, struct errbuf *e)
{
	copy_begin_peer(b, dst->be, dst->be_ctx, src->be_ctx, engine_tier(dst, t),
			engine_tier(src, t), dst->layout.page_bytes);
	for (uint32_t i = 0; i < h->npages; i++) {
		uint32_t f = h->pages[i].frame[t];

		if (f == FRAME_NONE)
			continue;
		page_set_frame(dst, n, i, t, frames_alloc(&dst->frames[t]));
		copy_page(b, n->pages[i].frame[t], f);
	}
	return copy_end(b, e);
}

int engine_history_move(struct engine *src, struct engine *dst, uint64_t user,
			struct engine_move_out *out, struct errbuf *e)
{
	struct history *h = NULL, *n;
	struct copy_batch *b;
	int ret;

	if (src == dst)
		return errbuf_set(e, -EINVAL, "user %" PRIu64 ": source and "
				  "destination are the same pool", user);
	ret = move_checks(src, dst, user, &h, e);
	if (!ret)
		ret = move_room(dst, h, user, e);
	if (ret)
		return ret;
	b = malloc(sizeof(*b)); /* a batch of runs: too big for a stack */
	n = b ? move_history_new(dst, h) : NULL;
	if (!n) {
		free(b);
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory "
				  "for its history in the destination pool", user);
	}
	history_settle(src, h); /* no onload still landing in what we read */
	*out = (struct engine_move_out){ .start = h->start, .len = h->len };
	ret = move_tier(src, dst, h, n, KVP_TIER_DEVICE, b, e);
	out->bytes = b->bytes;
	if (!ret) {
		ret = move_tier(src, dst, h, n, KVP_TIER_HOST, b, e);
		out->bytes += b->bytes;
	}
	free(b);
	if (ret) {
		move_undo(dst, n);
		return ret;
	}
	out->pages = n->npages;
	out->pages_device = n->nres[KVP_TIER_DEVICE];
	out->pages_host = n->nres[KVP_TIER_HOST];
	/* dst has it: in its table, most recently used there. */
	user_table_insert(&dst->users, n);
	lru_insert(dst, n);
	/* src lets it go: its frames, and a disk copy that would come back. */
	lru_remove(src, h);
	user_table_remove(&src->users, h);
	history_free(src, h);
	if (src->disk)
		tier_forget(src, ENGINE_TIER_DISK, user, KVP_SEL_DISK, NULL);
	return 0;
}
