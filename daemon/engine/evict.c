/* SPDX-License-Identifier: MIT */
/*
 * evict.c - where frames come back from: the LRU lists, demotion to the host
 * tier, dropping, offload and the evict operations.
 *
 * The one eviction path is demote_or_drop(): pressure from a prepare, an
 * operator's `evict --tier device` and evict_all all go through it. The host
 * tier is a victim cache: a demoted history goes to the tail of the host
 * LRU, and room for it is made by dropping the host LRU's head. Offload is
 * different on purpose: it adds copies of data the device tier still holds,
 * so it only uses free host frames and never drops anyone to make room.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "bug.h"
#include "clock.h"
#include "engine_internal.h"
#include "engine_share.h"
#include "shard.h"

/* ------------------------------------------------------------ the LRU clock */

uint64_t engine_tick(struct engine *eng)
{
	uint64_t now;

	if (!eng->set)
		return ++eng->tick;
	now = mono_ns();
	eng->tick = now > eng->tick ? now : eng->tick + 1;
	return eng->tick;
}

/* ------------------------------------------------------------ room */

uint64_t engine_device_avail(struct engine *eng, const struct history *h,
			     uint32_t need)
{
	struct shard_set *set = eng->set;
	uint64_t n = 0;

	if (set && set->global) {
		for (uint32_t i = 0; i < set->n; i++) {
			const struct engine *o = set->v[i].eng;

			n += o->frames[KVP_TIER_DEVICE].nfree +
			     o->lru[LRU_DEVICE].frames + share_evictable(o);
		}
		n += set->pool[KVP_TIER_DEVICE]->nfree; /* stable: all locks held */
	} else {
		n = frames_reserve(&eng->frames[KVP_TIER_DEVICE], need) +
		    eng->lru[LRU_DEVICE].frames + share_evictable(eng);
	}
	if (h && h->lru == LRU_DEVICE)
		n -= h->nres[KVP_TIER_DEVICE];
	return n;
}

/* ------------------------------------------------------------ LRU lists */

void lru_remove(struct engine *eng, struct history *h)
{
	struct lru_list *l;

	if (h->lru == LRU_NONE)
		return;
	l = &eng->lru[h->lru];
	list_del(&h->lru_link);
	l->frames -= h->nres[h->lru];
	h->lru = LRU_NONE;
}

void lru_insert(struct engine *eng, struct history *h)
{
	int id = h->nres[KVP_TIER_DEVICE] ? LRU_DEVICE : LRU_HOST;
	struct lru_list *l = &eng->lru[id];

	h->lru = id;
	h->tick = engine_tick(eng);
	list_add_tail(&h->lru_link, &l->list);
	l->frames += h->nres[id];
}

/* ------------------------------------------------------------ drop / demote */

uint32_t history_drop(struct engine *eng, struct history *h)
{
	uint32_t pages = h->npages;

	lru_remove(eng, h);
	user_table_remove(&eng->users, h);
	history_free(eng, h);
	eng->st.evicted_users++;
	eng->st.evicted_pages += pages;
	return pages;
}

/* Pages of h below limit that have a device frame and no host copy. */
static uint32_t host_copies_missing(const struct history *h, uint32_t limit)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < limit; i++)
		n += h->pages[i].frame[KVP_TIER_DEVICE] != FRAME_NONE &&
		     h->pages[i].frame[KVP_TIER_HOST] == FRAME_NONE;
	return n;
}

/*
 * Free `need` host frames by dropping the host LRU's oldest histories, h
 * excluded. Drops nothing and returns false when even that is not enough.
 */
bool host_make_room(struct engine *eng, uint32_t need,
		    const struct history *h)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	uint64_t droppable = eng->lru[LRU_HOST].frames;

	/* The host LRU is the shard's own; the reclaimer keeps the pool's
	 * free frames up for every shard (shard.h). */
	frames_reserve(host, need);
	if (h && h->lru == LRU_HOST)
		droppable -= h->nres[KVP_TIER_HOST];
	if (host->nfree + droppable < need)
		return false;
	while (host->nfree < need) {
		struct history *victim = lru_head(&eng->lru[LRU_HOST]);

		if (victim == h)
			victim = list_next_entry(victim, lru_link);
		tier_store(eng, victim); /* the tiers below */
		history_drop(eng, victim);
	}
	return true;
}

/* Copy h's device pages that lack a host copy to the host tier. The caller
 * made sure enough host frames are free. Returns pages copied. */
static uint32_t copy_to_host(struct engine *eng, struct history *h, uint32_t limit)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	uint32_t n = 0;

	/*
	 * Synchronous, unlike onload: the device frames a demotion copies out
	 * of go back on the free list right after this returns, and the next
	 * prepare may hand them out, so the copy must have landed by then.
	 * (An offload of a pinned history with pages to copy waits for its
	 * onload first; pages the onload wrote have host copies, so in fact
	 * none of those is copied here.)
	 */
	copy_begin(&eng->copy, eng->be, eng->be_ctx, COPY_D2H, COPY_SYNC,
		   &eng->mem[KVP_TIER_HOST], &eng->mem[KVP_TIER_DEVICE],
		   eng->layout.page_bytes);
	for (uint32_t i = 0; i < limit; i++) {
		struct page_ref *p = &h->pages[i];

		if (p->frame[KVP_TIER_DEVICE] == FRAME_NONE ||
		    p->frame[KVP_TIER_HOST] != FRAME_NONE)
			continue;
		if (!n)
			history_settle(eng, h);
		page_set_frame(eng, h, i, KVP_TIER_HOST, frames_alloc(host));
		copy_page(&eng->copy, p->frame[KVP_TIER_HOST],
			  p->frame[KVP_TIER_DEVICE]);
		n++;
	}
	copy_end(&eng->copy, NULL);
	eng->st.bytes_d2h += eng->copy.bytes;
	eng->st.ns_d2h += eng->copy.sync_ns;
	return n;
}

/*
 * Demote unpinned h: every page gets a host copy (room made on the host LRU),
 * then its device frames go. When the host tier cannot take it, h is
 * dropped. Returns the device frames freed.
 */
uint32_t demote_or_drop(struct engine *eng, struct history *h)
{
	uint32_t freed = h->nres[KVP_TIER_DEVICE];

	if (!host_make_room(eng, host_copies_missing(h, h->npages), h)) {
		tier_store(eng, h); /* the tiers below */
		history_drop(eng, h);
		return freed;
	}
	copy_to_host(eng, h, h->npages);
	lru_remove(eng, h);
	pages_free_frames(eng, h, 0, h->npages, KVP_TIER_DEVICE);
	lru_insert(eng, h); /* now host-only: the host LRU's newest */
	eng->st.demoted_users++;
	eng->st.demoted_pages += freed;
	return freed;
}

/* The oldest evictable thing of eng's device tier: a history (*h) or, when
 * *h is NULL, the sharing world's oldest; UINT64_MAX: nothing. */
static uint64_t device_oldest(const struct engine *eng, struct history **h)
{
	uint64_t st = share_oldest_tick(eng);

	*h = lru_head(&eng->lru[LRU_DEVICE]);
	if (*h && (*h)->tick <= st)
		return (*h)->tick;
	*h = NULL;
	return st;
}

/* Free eng's oldest device pages (see device_oldest); frames freed. */
static uint32_t device_evict_one(struct engine *eng)
{
	struct history *h;

	if (device_oldest(eng, &h) == UINT64_MAX)
		return 0;
	return h ? demote_or_drop(eng, h) : share_evict_oldest(eng);
}

/*
 * Oldest first across the device LRU of histories and the shared world's
 * lists (unheld chunks, idle prefix pages) -- of every shard in global mode,
 * their frames flushed to the pool and pulled into eng's cache. The caller
 * counted them all in engine_device_avail(), so they cannot run dry before
 * need is met.
 */
void evict_for_device(struct engine *eng, uint32_t need)
{
	struct frames *dev = &eng->frames[KVP_TIER_DEVICE];
	struct shard_set *set = eng->set;

	if (!set || !set->global) {
		struct history *h;

		while (frames_reserve(dev, need) < need) {
			KVP_BUG_ON(device_oldest(eng, &h) == UINT64_MAX,
				   "engine_device_avail counted evictable pages that are not there");
			device_evict_one(eng);
		}
		return;
	}
	for (uint32_t i = 0; i < set->n; i++)
		if (set->v[i].eng != eng)
			frames_flush(&set->v[i].eng->frames[KVP_TIER_DEVICE]);
	while (frames_reserve(dev, need) < need) {
		struct engine *victim = NULL;
		uint64_t best = UINT64_MAX;
		struct history *h;

		for (uint32_t i = 0; i < set->n; i++) {
			uint64_t t = device_oldest(set->v[i].eng, &h);

			if (t < best) {
				best = t;
				victim = set->v[i].eng;
			}
		}
		KVP_BUG_ON(!victim, "engine_device_avail counted evictable pages no shard has");
		device_evict_one(victim);
		if (victim != eng)
			frames_flush(&victim->frames[KVP_TIER_DEVICE]);
	}
}

/* ------------------------------------------------------------ reclaim */

/* Pin h and take host frames for its pages without a host copy, at most
 * room of them; false when the host tier cannot take them (h untouched). */
static bool demote_plan_one(struct engine *eng, struct engine_demotion *d,
			    struct history *h, uint32_t room)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	uint32_t need = host_copies_missing(h, h->npages), k = d->nh;

	if (need > room)
		need = room;
	if (!host_make_room(eng, need, h))
		return false;
	history_pin(eng, h); /* was unpinned: no onload in flight, no writer */
	h->demoting = true;
	eng->demote_pins++;
	d->v[k].h = h;
	d->v[k].wgen = h->wgen;
	d->v[k].partial = h->len % eng->P ? (uint32_t)(h->len / eng->P) :
					    UINT32_MAX;
	d->v[k].first = d->n;
	for (uint32_t i = 0; i < h->npages && d->n - d->v[k].first < need; i++) {
		const struct page_ref *p = &h->pages[i];

		if (p->frame[KVP_TIER_DEVICE] == FRAME_NONE ||
		    p->frame[KVP_TIER_HOST] != FRAME_NONE)
			continue;
		d->page[d->n] = i;
		d->dev[d->n] = p->frame[KVP_TIER_DEVICE];
		d->host[d->n] = frames_alloc(host);
		d->n++;
	}
	d->v[k].n = d->n - d->v[k].first;
	eng->demote_frames += d->v[k].n;
	d->nh++;
	return true;
}

uint32_t engine_demote_plan(struct engine *eng, struct engine_demotion *d,
			    uint32_t max)
{
	uint32_t freed = 0;
	struct history *h;

	d->nh = d->n = 0;
	d->failed = false;
	if (max > DEMOTE_MAX_PAGES)
		max = DEMOTE_MAX_PAGES;
	while (d->n < max && d->nh < DEMOTE_MAX_USERS &&
	       device_oldest(eng, &h) != UINT64_MAX) {
		if (!h)
			freed += share_evict_oldest(eng); /* no copy needed */
		else if (!host_copies_missing(h, h->npages) ||
			 !demote_plan_one(eng, d, h, max - d->n))
			freed += demote_or_drop(eng, h); /* at once, as always */
	}
	return freed;
}

static int u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * The round's host frames in ascending order, pages in plan order (each
 * history's pages together): a history's copies land in as few runs of the
 * host tier as its free frames allow, and when the host LRU drops it later
 * they come back as runs for the next round. Copies whose destinations
 * follow each other then move as one copy even where the device frames
 * are scattered (a history's pages are written a few tokens at a time): the
 * backend gathers them first (backend.h). Which host frame holds which page
 * is the demotion's own choice: nothing else has seen them yet.
 */
static void demote_pair_runs(struct engine_demotion *d)
{
	qsort(d->host, d->n, sizeof(*d->host), u32_cmp);
}

/* No lock held: reads only what plan recorded and the tiers' fixed memory;
 * the device frames stay h's (pinned) and the host frames are ours. */
int engine_demote_copy(struct engine *eng, struct engine_demotion *d,
		       struct copy_batch *cb)
{
	uint32_t k = 0, fails = 0;

	demote_pair_runs(d);
	d->npiece = 0;
	d->landed_ns = 0;
	while (k < d->nh) {
		uint32_t p = d->npiece++, pages = 0;

		d->piece[p].h0 = k;
		d->piece[p].start_ns = mono_ns();
		copy_begin(cb, eng->be, eng->be_ctx, COPY_D2H, COPY_PIPE,
			   &eng->mem[KVP_TIER_HOST], &eng->mem[KVP_TIER_DEVICE],
			   eng->layout.page_bytes);
		for (; k < d->nh && pages < DEMOTE_PIECE_PAGES; k++) {
			for (uint32_t j = d->v[k].first; j < d->v[k].first + d->v[k].n; j++)
				copy_page(cb, d->host[j], d->dev[j]);
			pages += d->v[k].n;
		}
		d->piece[p].h1 = k;
		/* A failed copy is a device fault the backend reports; the
		 * device copies stay, and finish keeps none of the host ones. */
		d->piece[p].failed = copy_end(cb, NULL) != 0;
		d->piece[p].ticket = cb->fence;
		d->piece[p].bytes = cb->bytes;
		fails += d->piece[p].failed;
	}
	return fails ? -EIO : 0;
}

void engine_demote_wait(struct engine *eng, struct engine_demotion *d, uint32_t p)
{
	uint64_t now, from = d->piece[p].start_ns;

	if (eng->be->copy_wait(eng->be_ctx, d->piece[p].ticket))
		d->piece[p].failed = true;
	now = mono_ns();
	/* The link works on one piece at a time, in order: this one's time
	 * starts when it was enqueued or the one before landed, the later. */
	if (d->landed_ns > from)
		from = d->landed_ns;
	d->piece[p].ns = now > from ? now - from : 0;
	d->landed_ns = now;
}

/* Attach h's copies where its pages did not change; free the device copies
 * when our pin is its only one; unpin. Device frames freed. */
static uint32_t demote_finish_one(struct engine *eng, struct engine_demotion *d,
				  uint32_t k)
{
	struct history *h = d->v[k].h;
	bool wrote = h->wgen != d->v[k].wgen;
	uint32_t freed = 0;

	for (uint32_t j = d->v[k].first; j < d->v[k].first + d->v[k].n; j++) {
		uint32_t i = d->page[j];

		/* A writer came meanwhile: the page it appends to may have
		 * changed under the copy; full pages cannot. */
		if (d->failed || (wrote && i == d->v[k].partial) || i >= h->npages ||
		    h->pages[i].frame[KVP_TIER_HOST] != FRAME_NONE ||
		    h->pages[i].frame[KVP_TIER_DEVICE] != d->dev[j])
			frames_free(&eng->frames[KVP_TIER_HOST], d->host[j]);
		else
			page_set_frame(eng, h, i, KVP_TIER_HOST, d->host[j]);
	}
	eng->demote_frames -= d->v[k].n;
	eng->demote_pins--;
	h->demoting = false;
	if (h->pins == 1) {
		for (uint32_t i = 0; i < h->npages; i++)
			if (h->pages[i].frame[KVP_TIER_DEVICE] != FRAME_NONE &&
			    h->pages[i].frame[KVP_TIER_HOST] != FRAME_NONE) {
				page_free_frame(eng, h, i, KVP_TIER_DEVICE);
				freed++;
			}
		eng->st.demoted_users += freed && !h->nres[KVP_TIER_DEVICE];
		eng->st.demoted_pages += freed;
	}
	history_unpin(eng, h);
	return freed;
}

uint32_t engine_demote_finish(struct engine *eng, struct engine_demotion *d,
			      uint32_t p)
{
	uint32_t freed = 0;

	d->failed = d->piece[p].failed;
	for (uint32_t k = d->piece[p].h0; k < d->piece[p].h1; k++)
		freed += demote_finish_one(eng, d, k);
	eng->st.bytes_d2h += d->piece[p].bytes;
	eng->st.ns_d2h += d->piece[p].ns;
	eng->st.reclaimed_pages += freed;
	frames_flush(&eng->frames[KVP_TIER_DEVICE]);
	if (p + 1 == d->npiece)
		d->nh = d->n = d->npiece = 0;
	return freed;
}

uint64_t engine_oldest_tick(const struct engine *eng, enum kvp_tier t)
{
	struct history *h;

	if (t == KVP_TIER_HOST)
		return lru_head(&eng->lru[LRU_HOST]) ?
		       lru_head(&eng->lru[LRU_HOST])->tick : UINT64_MAX;
	return device_oldest(eng, &h);
}

uint32_t engine_reclaim_host(struct engine *eng, uint32_t max)
{
	uint32_t freed = 0;

	while (freed < max && lru_head(&eng->lru[LRU_HOST])) {
		/* disk and remote tier hooks */
		tier_store(eng, lru_head(&eng->lru[LRU_HOST]));
		freed += history_drop(eng, lru_head(&eng->lru[LRU_HOST]));
	}
	eng->st.reclaimed_pages += freed;
	frames_flush(&eng->frames[KVP_TIER_HOST]);
	return freed;
}

/* ------------------------------------------------------------ offload */

/*
 * Pages of h that may be copied: all when no write is pending; otherwise
 * only the full pages below the one the writer is filling, whose bytes can
 * no longer change.
 */
static uint32_t offload_limit(const struct engine *eng, const struct history *h)
{
	return h->write_lease ? (uint32_t)(h->len / eng->P) : h->npages;
}

static int history_offload(struct engine *eng, struct history *h,
			   struct errbuf *e)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	uint32_t limit = offload_limit(eng, h);
	uint32_t need = host_copies_missing(h, limit), n;

	/* With every shard locked, the frames idle in the others' caches are
	 * reachable too (shard.h: an offload short of them is retried so). */
	if (eng->set && eng->set->global && host->nfree < need)
		for (uint32_t i = 0; i < eng->set->n; i++)
			if (eng->set->v[i].eng != eng)
				frames_flush(&eng->set->v[i].eng->frames[KVP_TIER_HOST]);
	if (need > frames_reserve(host, need))
		return errbuf_set(e, -ENOSPC, "user %" PRIu64 ": the host tier has "
				  "%" PRIu32 " free pages, offload needs %" PRIu32
				  "; evict host pages (kvctl evict --tier host) or "
				  "raise host_mem", h->user, host->nfree, need);
	n = copy_to_host(eng, h, limit);
	eng->st.offloaded_pages += n;
	return (int)n;
}

int engine_offload(struct engine *eng, uint64_t user, struct errbuf *e)
{
	struct history *h = user_table_find(&eng->users, user);

	if (!h || !h->npages)
		return errbuf_set(e, -ENOENT, "user %" PRIu64 ": nothing cached",
				  user);
	return history_offload(eng, h, e);
}

struct offload_all_ctx {
	struct engine *eng;
	struct errbuf *e;
	uint64_t pages;
};

static int offload_all_cb(struct history *h, void *arg)
{
	struct offload_all_ctx *c = arg;
	int ret = history_offload(c->eng, h, c->e);

	if (ret < 0)
		return ret;
	c->pages += (uint64_t)ret;
	return 0;
}

int engine_offload_all(struct engine *eng, struct errbuf *e)
{
	struct offload_all_ctx c = { eng, e, 0 };
	int ret = user_table_foreach(&eng->users, offload_all_cb, &c);

	if (ret < 0)
		return errbuf_set(e, ret, "the host tier filled after %" PRIu64
				  " pages were offloaded; evict host pages or raise "
				  "host_mem", c.pages);
	return c.pages > INT32_MAX ? INT32_MAX : (int)c.pages;
}

/* ------------------------------------------------------------ evict */

static uint32_t history_evict(struct engine *eng, struct history *h,
			      uint32_t sel)
{
	uint32_t freed;

	if ((sel & KVP_SEL_ALL) == KVP_SEL_ALL)
		return history_drop(eng, h);
	if (sel & KVP_SEL_DEVICE)
		return h->nres[KVP_TIER_DEVICE] ? demote_or_drop(eng, h) : 0;
	/* Host only: a history whose only copy is there is lost entirely. */
	freed = h->nres[KVP_TIER_HOST];
	if (h->nres[KVP_TIER_DEVICE] < h->npages)
		return history_drop(eng, h);
	pages_free_frames(eng, h, 0, h->npages, KVP_TIER_HOST);
	return freed;
}

static int check_sel(uint32_t sel, struct errbuf *e)
{
	if (!sel || (sel & ~(uint32_t)KVP_SEL_VALID) ||
	    ((sel & ~(uint32_t)KVP_SEL_ALL) && sel != KVP_SEL_DISK &&
	     sel != KVP_SEL_TO_DISK))
		return errbuf_set(e, -EINVAL, "evict: tier selection %#" PRIx32
				  " is not device, host, all, disk or to-disk", sel);
	return 0;
}

int engine_evict(struct engine *eng, uint64_t user, uint32_t sel,
		 struct errbuf *e)
{
	struct history *h = user_table_find(&eng->users, user);
	int ret = check_sel(sel, e);

	if (ret)
		return ret;
	/* Remote tier hook: the user's copies thrown away (all, or the disk
	 * copy) go from the store too, else a later prepare would bring them
	 * back. Not when the eviction is refused (leased, no disk tier). */
	if ((sel == KVP_SEL_ALL || (sel == KVP_SEL_DISK && eng->disk)) &&
	    !(h && h->pins))
		tier_forget(eng, ENGINE_TIER_REMOTE, user, sel, NULL);
	/* Disk tier hook: its selections, and `all` of a user only there. */
	if ((sel & ~(uint32_t)KVP_SEL_ALL) || (!h && sel == KVP_SEL_ALL && eng->disk))
		return tier_forget(eng, ENGINE_TIER_DISK, user,
				   sel == KVP_SEL_ALL ? KVP_SEL_DISK : sel, e);
	if (!h)
		return errbuf_set(e, -ENOENT, "user %" PRIu64 ": nothing cached",
				  user);
	if (h->pins)
		return errbuf_set(e, -EBUSY, "user %" PRIu64 " is held by %" PRIu32
				  " lease(s); release them first", user, h->pins);
	return (int)history_evict(eng, h, sel);
}

static int count_pinned_cb(struct history *h, void *arg)
{
	*(uint32_t *)arg += h->pins > 0;
	return 0;
}

/*
 * Walk the LRU lists rather than the user table: demoting one history may
 * drop others from the host LRU, which would pull entries out from under a
 * table walk. Pinned histories are on no list, so they are passed over.
 */
int engine_evict_all(struct engine *eng, uint32_t sel, uint32_t *skipped)
{
	struct lru_list *dev = &eng->lru[LRU_DEVICE], *host = &eng->lru[LRU_HOST];
	uint32_t affected = 0, pinned = 0;
	struct history *h, *next;
	int ret = check_sel(sel, NULL);

	if (ret)
		return ret;
	user_table_foreach(&eng->users, count_pinned_cb, &pinned);
	if (sel & ~(uint32_t)KVP_SEL_ALL) { /* disk tier hook */
		if (skipped)
			*skipped = pinned;
		return tier_forget_all(eng, ENGINE_TIER_DISK, sel);
	}
	if (sel & KVP_SEL_DEVICE) {
		/* Each demotion moves the head off this list (or drops it). */
		while ((h = lru_head(dev))) {
			uint64_t user = h->user;

			history_evict(eng, h, sel);
			if (sel == KVP_SEL_ALL) /* remote tier hook, as engine_evict */
				tier_forget(eng, ENGINE_TIER_REMOTE, user, sel,
					    NULL);
			affected++;
		}
	} else {
		/* host-only eviction drops at most h */
		list_for_each_entry_safe(h, next, &dev->list, lru_link)
			affected += history_evict(eng, h, sel) > 0;
	}
	if (sel & KVP_SEL_HOST) {
		while ((h = lru_head(host))) {
			uint64_t user = h->user;

			history_drop(eng, h);
			if (sel == KVP_SEL_ALL) /* remote tier hook, as engine_evict */
				tier_forget(eng, ENGINE_TIER_REMOTE, user, sel,
					    NULL);
			affected++;
		}
	}
	if (sel == KVP_SEL_ALL && eng->disk) /* disk tier hook: its copies too */
		affected += (uint32_t)tier_forget_all(eng, ENGINE_TIER_DISK,
							KVP_SEL_DISK);
	if (skipped)
		*skipped = pinned;
	return (int)affected;
}
