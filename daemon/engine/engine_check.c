/* SPDX-License-Identifier: MIT */
/*
 * engine_check.c - walk the engine and prove its invariants hold
 * (engine_internal.h lists them). For tests and debug builds: O(users+frames).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "engine_internal.h"
#include "engine_share.h"

struct check_ctx {
	struct engine *eng;
	struct errbuf *e;
	uint8_t *owner[KVP_TIERS]; /* frames seen so far */
	uint64_t frames[KVP_TIERS];
	uint64_t lru_frames[KVP_TIERS];
	uint64_t lru_count[KVP_TIERS];
	uint64_t pins;
	uint64_t users;
};

static int check_history(struct history *h, void *arg)
{
	struct check_ctx *c = arg;
	struct engine *eng = c->eng;
	uint32_t nres[KVP_TIERS] = { 0, 0 };
	uint32_t committed = (uint32_t)pages_for(eng, h->len);
	uint64_t u = h->user;

	c->users++;
	c->pins += h->pins;
	if (!h->pins && !h->npages)
		return errbuf_set(c->e, -EFAULT, "user %" PRIu64 ": empty unpinned "
				  "history kept", u);
	if (h->npages < committed || (h->npages > committed && !h->write_lease))
		return errbuf_set(c->e, -EFAULT, "user %" PRIu64 ": %" PRIu32 " pages "
				  "for %" PRIu64 " tokens without a write lease", u,
				  h->npages, h->len);
	if (h->write_lease && !h->pins)
		return errbuf_set(c->e, -EFAULT, "user %" PRIu64 ": write lease "
				  "without a pin", u);
	if (h->onload_fence && !h->pins)
		return errbuf_set(c->e, -EFAULT, "user %" PRIu64 ": onload fence %"
				  PRIu64 " pending on an unpinned history", u,
				  h->onload_fence);
	for (uint32_t i = 0; i < h->npages; i++) {
		const struct page_ref *p = &h->pages[i];
		bool any = false;

		for (int t = 0; t < KVP_TIERS; t++) {
			uint32_t f = p->frame[t];

			if (f == FRAME_NONE)
				continue;
			any = true;
			nres[t]++;
			if (!frames_in_use(&eng->frames[t], f))
				return errbuf_set(c->e, -EFAULT, "user %" PRIu64 " page %"
						  PRIu32 ": %s frame %" PRIu32 " is free",
						  u, i, kvp_tier_name(t), f);
			if (c->owner[t][f])
				return errbuf_set(c->e, -EFAULT, "%s frame %" PRIu32
						  " owned twice (user %" PRIu64 ")",
						  kvp_tier_name(t), f, u);
			c->owner[t][f] = 1;
			c->frames[t]++;
		}
		if (!any)
			return errbuf_set(c->e, -EFAULT, "user %" PRIu64 " page %" PRIu32
					  " has no frame", u, i);
		if (i >= committed && p->frame[KVP_TIER_HOST] != FRAME_NONE)
			return errbuf_set(c->e, -EFAULT, "user %" PRIu64 " reserved "
					  "page %" PRIu32 " has a host copy", u, i);
	}
	for (int t = 0; t < KVP_TIERS; t++)
		if (nres[t] != h->nres[t])
			return errbuf_set(c->e, -EFAULT, "user %" PRIu64 ": nres[%s] %"
					  PRIu32 " but %" PRIu32 " pages hold one", u,
					  kvp_tier_name(t), h->nres[t], nres[t]);
	if (h->pins && h->lru != LRU_NONE)
		return errbuf_set(c->e, -EFAULT, "user %" PRIu64 ": pinned but on an "
				  "LRU list", u);
	if (!h->pins) {
		int want = h->nres[KVP_TIER_DEVICE] ? LRU_DEVICE : LRU_HOST;

		if (h->lru != want)
			return errbuf_set(c->e, -EFAULT, "user %" PRIu64 ": on LRU %d, "
					  "should be on %d", u, h->lru, want);
	}
	return 0;
}

static int check_lists(struct check_ctx *c)
{
	for (int t = 0; t < KVP_TIERS; t++) {
		const struct lru_list *l = &c->eng->lru[t];
		const struct list_head *prev = &l->list;
		const struct history *h;

		list_for_each_entry(h, &l->list, lru_link) {
			if (h->lru_link.prev != prev || h->lru != t)
				return errbuf_set(c->e, -EFAULT, "LRU %d broken at user %"
						  PRIu64, t, h->user);
			c->lru_frames[t] += h->nres[t];
			if (++c->lru_count[t] > c->users)
				return errbuf_set(c->e, -EFAULT, "LRU %d has a cycle", t);
			prev = &h->lru_link;
		}
		if (l->list.prev != prev)
			return errbuf_set(c->e, -EFAULT, "LRU %d tail is wrong", t);
		if (c->lru_frames[t] != l->frames)
			return errbuf_set(c->e, -EFAULT, "LRU %d counts %" PRIu64
					  " frames, its histories hold %" PRIu64, t,
					  l->frames, c->lru_frames[t]);
	}
	return 0;
}

int engine_check(struct engine *eng, struct errbuf *e)
{
	struct check_ctx c = { .eng = eng, .e = e };
	int ret = 0;

	for (int t = 0; t < KVP_TIERS; t++) {
		c.owner[t] = calloc(eng->frames[t].total + 1, 1);
		if (!c.owner[t]) {
			ret = errbuf_set(e, -ENOMEM, "engine_check: out of memory");
			goto out;
		}
	}
	ret = user_table_foreach(&eng->users, check_history, &c);
	if (ret)
		goto out;
	if (c.users != user_table_count(&eng->users)) {
		ret = errbuf_set(e, -EFAULT, "user table counts %" PRIu64 ", holds %"
				 PRIu64, user_table_count(&eng->users), c.users);
		goto out;
	}
	ret = check_lists(&c);
	if (ret)
		goto out;
	ret = share_check(eng, c.owner[KVP_TIER_DEVICE], &c.frames[KVP_TIER_DEVICE], e);
	if (ret)
		goto out;
	for (int t = 0; t < KVP_TIERS; t++) {
		const struct frames *f = &eng->frames[t];

		uint64_t held = c.frames[t] +
				(t == KVP_TIER_HOST ? eng->demote_frames : 0);

		if (f->nfree > f->total || frames_used(f) != held) {
			ret = errbuf_set(e, -EFAULT, "%s tier: %" PRIu32 " used + %"
					 PRIu32 " free of %" PRIu32 ", but pages hold %"
					 PRIu64, kvp_tier_name(t), frames_used(f),
					 f->nfree, f->total, held);
			goto out;
		}
	}
	if (c.pins != eng->history_leases + eng->pinned_by_seqs + eng->demote_pins)
		ret = errbuf_set(e, -EFAULT, "%" PRIu32 " history leases live and %"
				 PRIu64 " sequence pins but histories count %" PRIu64
				 " pins", eng->history_leases, eng->pinned_by_seqs,
				 c.pins);
out:
	for (int t = 0; t < KVP_TIERS; t++)
		free(c.owner[t]);
	return ret;
}
