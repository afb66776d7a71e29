/* SPDX-License-Identifier: MIT */
/*
 * disk_engine.c - where the engine meets the disk tier (disk_tier.h): the
 * three hooks, each called from one clearly marked place in the engine.
 *
 *  engine_disk_demote  a history is about to be dropped by eviction
 *                      (evict.c: the host LRU making room, the reclaimer,
 *                      a demotion the host tier cannot take): its pages
 *                      go to the disk tier's staging first, read from its
 *                      host frames (or device frames on the shm backend).
 *  engine_disk_onload  a prepare of a user with nothing in memory: the
 *                      history on disk comes back into host frames, and
 *                      the prepare onloads it to the device as any host
 *                      history (with its fence). While the disk thread
 *                      reads, a ring prepare gets -EINPROGRESS and its
 *                      worker holds the entry and retries, serving other
 *                      users meanwhile; a caller that cannot retry waits.
 *  engine_disk_info    info / users of a history only on disk.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "disk_engine.h"
#include "disk_tier.h"
#include "engine_internal.h"
#include "engine_share.h"
#include "shard.h"

static struct disk_key key_of(const struct engine *eng, uint64_t user)
{
	return (struct disk_key){ .tenant = eng->disk_tenant,
				  .pool = eng->disk_pool, .user = user };
}

/* Where page i of h can be read by the CPU: its host frame, else its
 * device frame where the device tier is host memory (shm); NULL: nowhere. */
static void *page_bytes_of(struct engine *eng, struct history *h, uint32_t i)
{
	const struct page_ref *p = &h->pages[i];
	uint64_t pb = eng->layout.page_bytes;

	if (p->frame[KVP_TIER_HOST] != FRAME_NONE)
		return (char *)eng->mem[KVP_TIER_HOST].base +
		       (uint64_t)p->frame[KVP_TIER_HOST] * pb;
	if (p->frame[KVP_TIER_DEVICE] != FRAME_NONE &&
	    eng->mem[KVP_TIER_DEVICE].host_visible)
		return (char *)eng->mem[KVP_TIER_DEVICE].base +
		       (uint64_t)p->frame[KVP_TIER_DEVICE] * pb;
	return NULL;
}

int engine_disk_demote(struct engine *eng, struct history *h)
{
	uint32_t n = (uint32_t)pages_for(eng, h->len);
	struct disk_key k;
	void **pages;
	int ret = -EOPNOTSUPP;

	/* Unpinned: no onload in flight, no reserved pages past len. */
	if (!eng->disk || !n || h->pins)
		return -EINVAL;
	pages = malloc(n * sizeof(*pages));
	if (!pages)
		return -ENOMEM; /* dropped, as without a disk tier */
	for (uint32_t i = 0; i < n; i++)
		if (!(pages[i] = page_bytes_of(eng, h, i)))
			goto out; /* device-only on a GPU: dropped as before */
	k = key_of(eng, h->user);
	/* -ENOSPC: no staging room: dropped as before, counted there. */
	ret = disk_tier_put(eng->disk, &k, h->start, h->len, n, pages);
out:
	free(pages);
	return ret;
}

/*
 * Host room for n pages: the host LRU's oldest go (to disk), and when that
 * is not enough, the host copies of unpinned histories on the device LRU,
 * oldest first: they are copies of pages the device holds.
 */
static bool host_room_for_disk(struct engine *eng, uint32_t n)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	struct history *h;

	if (host_make_room(eng, n, NULL))
		return true;
	list_for_each_entry(h, &eng->lru[LRU_DEVICE].list, lru_link) {
		if (frames_reserve(host, n) >= n)
			break;
		if (h->nres[KVP_TIER_HOST] && h->nres[KVP_TIER_DEVICE] == h->npages)
			pages_free_frames(eng, h, 0, h->npages, KVP_TIER_HOST);
	}
	if (host_make_room(eng, n, NULL))
		return true;
	if (!eng->set || !eng->set->global)
		return false;
	/* Every lock held: the other shards' host LRUs give frames back to
	 * the pool, where ours takes them. */
	for (uint32_t i = 0; i < eng->set->n && frames_reserve(host, n) < n; i++) {
		struct engine *o = eng->set->v[i].eng;

		if (o == eng)
			continue;
		while (lru_head(&o->lru[LRU_HOST]) && o->frames[KVP_TIER_HOST].nfree < n) {
			engine_disk_demote(o, lru_head(&o->lru[LRU_HOST]));
			history_drop(o, lru_head(&o->lru[LRU_HOST]));
		}
		frames_flush(&o->frames[KVP_TIER_HOST]);
	}
	return host_make_room(eng, n, NULL);
}

/* The history hh from disk, in host frames, on the host LRU. */
static int history_from_disk(struct engine *eng, uint64_t user,
			     const struct disk_hist *hh, struct errbuf *e)
{
	struct frames *host = &eng->frames[KVP_TIER_HOST];
	uint32_t n = (uint32_t)pages_for(eng, hh->len);
	uint64_t pb = eng->layout.page_bytes;
	struct history *h;

	if (n > hh->npages)
		n = hh->npages;
	if (user_table_reserve(&eng->users) || !(h = calloc(1, sizeof(*h))))
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory for "
				  "its history coming back from disk", user);
	h->pages = calloc(n ? n : 1, sizeof(*h->pages));
	if (!h->pages) {
		free(h);
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory for "
				  "its history coming back from disk", user);
	}
	if (!host_room_for_disk(eng, n)) {
		free(h->pages);
		free(h);
		/* A shard's host LRU is its own: retried with every lock
		 * held, where the other shards make room too. */
		if (eng->set && !eng->set->global)
			return errbuf_set(e, -EAGAIN, "user %" PRIu64 ": shard %"
					  PRIu32 " has no host room for its %" PRIu32
					  " pages on disk; retried with every shard",
					  user, eng->shard, n);
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": its %" PRIu32
				  " pages on the disk tier need host frames and the "
				  "host tier has %" PRIu32 " free and nothing to evict "
				  "(pinned); release leases or raise host_mem", user, n,
				  host->nfree);
	}
	h->owner = eng;
	h->user = user;
	h->lru = LRU_NONE;
	INIT_LIST_HEAD(&h->lru_link);
	h->cap = n ? n : 1;
	h->start = hh->start;
	h->len = hh->len < (uint64_t)n * eng->P ? hh->len : (uint64_t)n * eng->P;
	h->npages = n;
	for (uint32_t i = 0; i < n; i++) {
		h->pages[i].frame[KVP_TIER_DEVICE] = FRAME_NONE;
		h->pages[i].frame[KVP_TIER_HOST] = FRAME_NONE;
		page_set_frame(eng, h, i, KVP_TIER_HOST, frames_alloc(host));
		memcpy((char *)eng->mem[KVP_TIER_HOST].base +
		       (uint64_t)h->pages[i].frame[KVP_TIER_HOST] * pb,
		       disk_tier_page(eng->disk, hh, i), pb);
	}
	user_table_insert(&eng->users, h);
	lru_insert(eng, h); /* host-only: the host LRU's newest */
	return 0;
}

int engine_disk_onload(struct engine *eng, uint64_t user, unsigned flags,
		       struct errbuf *e)
{
	struct disk_key k = key_of(eng, user);
	struct disk_hist hh;
	int ret;

	if (!eng->disk)
		return 0;
	while ((ret = disk_tier_get(eng->disk, &k, &hh)) == -EINPROGRESS) {
		if (flags & ENGINE_PREPARE_DISK_DEFER)
			return errbuf_set(e, -EINPROGRESS, "user %" PRIu64 ": reading "
					  "its history back from the disk tier", user);
		disk_tier_wait(eng->disk, &k);
	}
	if (ret == -ENOENT)
		return 0; /* not on disk: a new history */
	ret = history_from_disk(eng, user, &hh, e);
	if (!ret)
		disk_tier_take(eng->disk, &hh);
	return ret;
}

bool engine_disk_info(struct engine *eng, uint64_t user,
		      struct engine_user_info *out)
{
	struct disk_key k = key_of(eng, user);
	uint64_t start, len;
	uint32_t np;

	if (!eng->disk || !disk_tier_info(eng->disk, &k, &start, &len, &np))
		return false;
	out->pages_disk = np;
	out->tokens_disk = len;
	/* The rest only for a history only on disk: engine_info() overwrites
	 * it for one in memory. */
	out->exists = true;
	out->start = start;
	out->len = len;
	out->pages = (uint32_t)pages_for(eng, len);
	return true;
}

void engine_disk_stats(const struct engine *eng, struct kvp_stats *out)
{
	struct disk_tier_stats ds;

	if (!eng->disk || eng->shard || eng->disk_pool)
		return;
	disk_tier_stats(eng->disk, eng->disk_tenant, &ds);
	out->disk_users = ds.users;
	out->disk_pages = ds.pages - ds.prefix_pages - ds.chunk_pages; /* histories */
	out->disk_demoted_pages = ds.demoted_pages;
	out->disk_read_pages = ds.read_pages;
	out->disk_dropped_pages = ds.dropped_pages;
	out->disk_stored_bytes = ds.bytes_stored;
	out->disk_prefix_pages = ds.prefix_pages;
	out->disk_chunks = ds.chunks;
	out->disk_chunk_pages = ds.chunk_pages;
}

/* Push h (unpinned) down to disk: pages no CPU can read (device-only on a
 * GPU) go to the host tier first, as a demotion. */
static int history_to_disk(struct engine *eng, struct history *h)
{
	uint32_t n = h->npages;
	int ret;

	for (uint32_t i = 0; i < h->npages; i++)
		if (!page_bytes_of(eng, h, i)) {
			demote_or_drop(eng, h);
			if (user_table_find(&eng->users, h->user) != h)
				return -ENOSPC; /* the host could not take it */
			break;
		}
	ret = engine_disk_demote(eng, h);
	if (ret)
		return ret;
	history_drop(eng, h);
	return (int)n;
}

int engine_disk_evict(struct engine *eng, uint64_t user, uint32_t sel,
		      struct errbuf *e)
{
	struct history *h = user_table_find(&eng->users, user);
	struct disk_key k = key_of(eng, user);
	int ret;

	if (!eng->disk) /* a selection this pool cannot have */
		return errbuf_set(e, -EINVAL, "user %" PRIu64 ": evict: tier "
				  "selection %#" PRIx32 " names the disk tier and "
				  "kvpoold has none; start it with --disk_dir and "
				  "--disk_size", user, sel);
	if (sel == KVP_SEL_DISK) {
		ret = disk_tier_drop(eng->disk, &k);
		return ret < 0 ? errbuf_set(e, ret, "user %" PRIu64 ": nothing on "
					    "the disk tier", user) : ret;
	}
	if (!h)
		return disk_tier_info(eng->disk, &k, &(uint64_t){ 0 },
				      &(uint64_t){ 0 }, &(uint32_t){ 0 }) ? 0 :
		       errbuf_set(e, -ENOENT, "user %" PRIu64 ": nothing cached",
				  user);
	if (h->pins)
		return errbuf_set(e, -EBUSY, "user %" PRIu64 " is held by %" PRIu32
				  " lease(s); release them first", user, h->pins);
	ret = history_to_disk(eng, h);
	if (ret < 0)
		return errbuf_set(e, ret, "user %" PRIu64 ": could not be written to "
				  "the disk tier (%s)", user, ret == -ENOSPC ?
				  "no staging room, or the host tier could not take "
				  "its GPU pages; retry, or raise host_mem" :
				  strerror(-ret));
	return ret;
}

int engine_disk_evict_all(struct engine *eng, uint32_t sel)
{
	struct history *h;
	uint32_t n = 0;

	if (!eng->disk)
		return -EINVAL; /* as engine_disk_evict */
	if (sel == KVP_SEL_DISK)
		return (int)disk_tier_drop_all(eng->disk, eng->disk_tenant,
					       eng->disk_pool);
	/* Oldest first; each push takes h off its list (or fails: stop). */
	for (int t = LRU_DEVICE; t <= LRU_HOST; t++)
		while ((h = lru_head(&eng->lru[t]))) {
			if (history_to_disk(eng, h) < 0)
				return (int)n;
			n++;
		}
	return (int)n;
}

int engine_disk_flush_all(struct engine *eng)
{
	struct history *h;
	int n = 0;

	if (!eng->disk)
		return 0;
	for (int t = LRU_DEVICE; t <= LRU_HOST; t++)
		while ((h = lru_head(&eng->lru[t]))) {
			uint64_t user = h->user;
			int ret = history_to_disk(eng, h);

			/* Staging full: let the disk thread drain it, once. */
			if (ret == -ENOSPC && user_table_find(&eng->users, user) == h) {
				disk_tier_flush(eng->disk);
				ret = history_to_disk(eng, h);
			}
			if (ret >= 0)
				n++;
			else if (user_table_find(&eng->users, user) == h)
				history_drop(eng, h); /* lost, as a stop always lost it */
		}
	/* Then idle prefix pages and unheld chunks (share_disk.c writes
	 * them), one at a time with the thread drained after each: its
	 * staging may be smaller than what is there. */
	while (share_evictable(eng)) {
		share_evict_oldest(eng);
		disk_tier_flush(eng->disk);
	}
	return n;
}

uint64_t engine_disk_list_count(struct engine *eng, uint64_t cursor)
{
	if (!eng->disk || eng->shard)
		return 0;
	return disk_tier_list(eng->disk, eng->disk_tenant, eng->disk_pool, cursor,
			      NULL, 0);
}

void engine_disk_list(struct engine *eng, uint64_t cursor, uint64_t *ids,
		      uint64_t *n, uint64_t cap)
{
	uint64_t m;

	if (!eng->disk || eng->shard)
		return;
	m = disk_tier_list(eng->disk, eng->disk_tenant, eng->disk_pool, cursor,
			   ids + *n, cap - *n);
	/* Histories other shards put there since the count: a list is a
	 * snapshot, they show next time. */
	*n += m < cap - *n ? m : cap - *n;
}
