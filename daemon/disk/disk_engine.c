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
#include <time.h>

#include "disk_engine.h"
#include "disk_record.h"
#include "disk_tier.h"
#include "frames.h"
#include "share_disk.h"
#include "tier_services.h"

static struct disk_key key_of(const struct engine *eng, uint64_t user)
{
	return (struct disk_key){ .tenant = tier_disk_tenant(eng),
				  .pool = tier_disk_pool(eng), .user = user };
}

int engine_disk_demote(struct engine *eng, struct history *h)
{
	uint32_t n = tier_history_pages(eng, h);
	struct disk_key k;
	void **pages;
	int ret = -EOPNOTSUPP;

	/* Unpinned: no onload in flight, no reserved pages past len. */
	if (!tier_disk(eng) || !n || tier_history_pins(h))
		return -EINVAL;
	pages = malloc(n * sizeof(*pages));
	if (!pages)
		return -ENOMEM; /* dropped, as without a disk tier */
	for (uint32_t i = 0; i < n; i++)
		if (!(pages[i] = tier_history_page_cpu(eng, h, i)))
			goto out; /* device-only on a GPU: dropped as before */
	k = key_of(eng, tier_history_user(h));
	/* -ENOSPC: no staging room: dropped as before, counted there. */
	ret = disk_tier_put(tier_disk(eng), &k, tier_history_start(h),
			    tier_history_len(h), n, pages);
out:
	free(pages);
	return ret;
}

/*
 * A history being read from disk straight into host frames taken for it
 * (disk_tier_get_into): frames in no history yet, so no eviction touches
 * them, kept here while the disk thread reads and the prepare is retried.
 */
struct disk_load {
	struct disk_load *next;
	uint64_t user;
	uint64_t since_ns;       /* READY and unclaimed long after: given up */
	struct disk_hist hh;     /* held */
	uint32_t n;
	uint32_t frames[];       /* [n] host frames, page i's */
};

/* The disk tier's state of one engine (tier.h's engine_tier_priv), made by
 * engine_disk_attach; NULL: no disk tier (or no memory for it then). */
struct disk_engine {
	bool into;               /* disk reads go straight into host frames */
	struct disk_load *loads; /* those reads, in flight */
	struct share_disk_wait prefix_wait; /* share_disk.c's, of this engine */
};

static struct disk_engine *de_of(struct engine *eng)
{
	return *engine_tier_priv(eng, ENGINE_TIER_DISK);
}

struct share_disk_wait *share_disk_wait_of(struct engine *eng)
{
	struct disk_engine *de = de_of(eng);

	return de ? &de->prefix_wait : NULL;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Pages that hold `tokens` tokens. */
static uint64_t pages_of(const struct engine *eng, uint64_t tokens)
{
	uint32_t P = tier_page_tokens(eng);

	return (tokens + P - 1) / P;
}

static char *host_frame(struct engine *eng, uint32_t f)
{
	return (char *)engine_tier(eng, KVP_TIER_HOST)->base +
	       (uint64_t)f * engine_layout(eng)->page_bytes;
}

/* Unlink ld, give its frames from `from` on back, free it. */
static void load_end(struct engine *eng, struct disk_load *ld, uint32_t from)
{
	struct disk_load **p = &de_of(eng)->loads;

	while (*p && *p != ld)
		p = &(*p)->next;
	if (*p)
		*p = ld->next;
	for (uint32_t i = from; i < ld->n; i++)
		frames_free(tier_host_frames(eng), ld->frames[i]);
	free(ld);
}

static struct disk_load *load_find(struct engine *eng, uint64_t user)
{
	struct disk_engine *de = de_of(eng);
	struct disk_load *ld = de ? de->loads : NULL;

	while (ld && ld->user != user)
		ld = ld->next;
	return ld;
}

/* Loads whose prepare never came back (its client went) for 2 s after
 * they were ready: the history stays on disk, the frames come back. */
static void loads_sweep(struct engine *eng)
{
	uint64_t old = now_ns() - 2000000000ull;
	struct disk_engine *de = de_of(eng);
	struct disk_load *ld, *next;
	struct disk_hist hh;

	for (ld = de ? de->loads : NULL; ld; ld = next) {
		int ret;

		next = ld->next;
		if (ld->since_ns > old)
			continue;
		ret = disk_tier_poll(tier_disk(eng), &ld->hh, &hh);
		if (ret == -EINPROGRESS)
			continue;
		if (!ret)
			disk_tier_unhold(tier_disk(eng), &ld->hh);
		load_end(eng, ld, 0);
	}
}

/*
 * Start reading user's history on disk straight into host frames: *out
 * set, or NULL where that cannot be (no registered-able host tier, not on
 * disk, held or resized meanwhile): then disk_tier_get's staging serves.
 */
static int load_start(struct engine *eng, uint64_t user, struct disk_load **out,
		      struct errbuf *e)
{
	struct disk_key k = key_of(eng, user);
	struct disk_engine *de = de_of(eng);
	struct disk_load *ld;
	uint64_t start, len;
	uint32_t n;
	void **dst;
	int ret;

	*out = NULL;
	if (!de || !de->into || !disk_tier_info(tier_disk(eng), &k, &start, &len, &n) || !n)
		return 0;
	ret = tier_host_room(eng, user, n, "disk", e);
	if (ret)
		return ret;
	ld = calloc(1, sizeof(*ld) + n * sizeof(ld->frames[0]));
	dst = malloc(n * sizeof(*dst));
	if (!ld || !dst) {
		free(ld);
		free(dst);
		return 0; /* the staging way needs less */
	}
	ld->user = user;
	ld->n = n;
	for (uint32_t i = 0; i < n; i++) {
		ld->frames[i] = frames_alloc(tier_host_frames(eng));
		dst[i] = host_frame(eng, ld->frames[i]);
	}
	ld->next = de->loads;
	de->loads = ld;
	ret = disk_tier_get_into(tier_disk(eng), &k, n, dst, &ld->hh);
	free(dst);
	if (ret && ret != -EINPROGRESS) {
		load_end(eng, ld, 0);
		return 0;
	}
	ld->since_ns = now_ns();
	*out = ld;
	return 0;
}

/*
 * The history hh from disk, in host frames, on the host LRU. With ld its
 * frames are taken already and hold the pages read straight into them;
 * pages that came from staging instead are copied, as without ld.
 */
static int history_from_disk(struct engine *eng, uint64_t user,
			     const struct disk_hist *hh, struct disk_load *ld,
			     struct errbuf *e)
{
	uint32_t n = (uint32_t)pages_of(eng, hh->len);
	const void **src;
	int ret;

	if (n > hh->npages)
		n = hh->npages;
	src = malloc((n ? n : 1) * sizeof(*src));
	if (!src)
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory for "
				  "its history coming back from disk", user);
	for (uint32_t i = 0; i < n; i++)
		src[i] = disk_tier_page(tier_disk(eng), hh, i);
	ret = tier_history_from_pages(eng, user, hh->start, hh->len, n, src,
				      ld ? ld->frames : NULL, "disk", e);
	free(src);
	return ret;
}

int engine_disk_onload(struct engine *eng, uint64_t user, unsigned flags,
		       struct errbuf *e)
{
	struct disk_key k = key_of(eng, user);
	struct disk_load *ld;
	struct disk_hist hh;
	uint32_t used;
	int ret;

	if (!tier_disk(eng))
		return 0;
	loads_sweep(eng);
	ld = load_find(eng, user);
	if (!ld && (ret = load_start(eng, user, &ld, e)))
		return ret;
	while ((ret = ld ? disk_tier_poll(tier_disk(eng), &ld->hh, &hh) :
			   disk_tier_get(tier_disk(eng), &k, &hh)) == -EINPROGRESS) {
		if (flags & ENGINE_PREPARE_DEFER)
			return errbuf_set(e, engine_wait_set(ENGINE_WAIT_DISK),
					  "user %" PRIu64 ": reading "
					  "its history back from the disk tier", user);
		if (ld)
			disk_tier_wait_held(tier_disk(eng), &ld->hh);
		else
			disk_tier_wait(tier_disk(eng), &k);
	}
	if (ret == -ENOENT) { /* not on disk (any more): a new history */
		if (ld)
			load_end(eng, ld, 0);
		return 0;
	}
	used = (uint32_t)pages_of(eng, hh.len);
	if (used > hh.npages)
		used = hh.npages;
	ret = history_from_disk(eng, user, &hh, ld, e);
	if (!ret)
		disk_tier_take(tier_disk(eng), &hh);
	else if (ld)
		disk_tier_unhold(tier_disk(eng), &hh);
	/* The history owns the frames it uses; the rest go back. */
	if (ld)
		load_end(eng, ld, ret ? 0 : used);
	return ret;
}

void engine_disk_attach(struct engine *eng)
{
	const struct tier_mem *m = engine_tier(eng, KVP_TIER_HOST);
	struct disk_engine *de;

	if (!tier_disk(eng))
		return;
	/* Without memory for its state the staging way serves, and a prefix
	 * walk waiting for the disk walks again at every retry. */
	de = calloc(1, sizeof(*de));
	if (!de)
		return;
	*engine_tier_priv(eng, ENGINE_TIER_DISK) = de;
	/* Reads straight into host frames need frames the CPU (and the
	 * kernel) can address, on the blocks O_DIRECT moves. Without them
	 * the staging way serves. */
	if (!m->host_visible || !m->base || !m->bytes ||
	    !disk_tier_into_ok(tier_disk(eng)) || ((uintptr_t)m->base % DISK_ALIGN))
		return;
	de->into = true;
	/* Fixed buffers: no page pinning per read. Refused (RLIMIT_MEMLOCK),
	 * the same reads pin their pages themselves. */
	disk_tier_register_host(tier_disk(eng), m->base, m->bytes);
}

void engine_disk_detach(struct engine *eng)
{
	struct disk_engine *de = de_of(eng);

	if (!de)
		return;
	while (de->loads) {
		/* No read into the frames may outlive them. */
		disk_tier_unhold(tier_disk(eng), &de->loads->hh);
		load_end(eng, de->loads, 0);
	}
	if (de->into)
		disk_tier_unregister_host(tier_disk(eng),
					  engine_tier(eng, KVP_TIER_HOST)->base);
	free(de);
	*engine_tier_priv(eng, ENGINE_TIER_DISK) = NULL;
}

bool engine_disk_info(struct engine *eng, uint64_t user,
		      struct engine_user_info *out)
{
	struct disk_key k = key_of(eng, user);
	uint64_t start, len;
	uint32_t np;

	if (!tier_disk(eng) || !disk_tier_info(tier_disk(eng), &k, &start, &len, &np))
		return false;
	out->pages_disk = np;
	out->tokens_disk = len;
	/* The rest only for a history only on disk: engine_info() overwrites
	 * it for one in memory. */
	out->exists = true;
	out->start = start;
	out->len = len;
	out->pages = (uint32_t)pages_of(eng, len);
	return true;
}

void engine_disk_stats(const struct engine *eng, struct kvp_stats *out)
{
	struct disk_tier_stats ds;

	if (!tier_disk(eng) || tier_shard(eng) || tier_disk_pool(eng))
		return;
	disk_tier_stats(tier_disk(eng), tier_disk_tenant(eng), &ds);
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
	uint32_t n = tier_history_npages(h);
	uint64_t user = tier_history_user(h);
	int ret;

	for (uint32_t i = 0; i < n; i++)
		if (!tier_history_page_cpu(eng, h, i)) {
			tier_history_demote(eng, h);
			if (tier_history_find(eng, user) != h)
				return -ENOSPC; /* the host could not take it */
			break;
		}
	ret = engine_disk_demote(eng, h);
	if (ret)
		return ret;
	tier_history_drop(eng, h);
	return (int)n;
}

int engine_disk_evict(struct engine *eng, uint64_t user, uint32_t sel,
		      struct errbuf *e)
{
	struct history *h = tier_history_find(eng, user);
	struct disk_key k = key_of(eng, user);
	int ret;

	if (!tier_disk(eng)) /* a selection this pool cannot have */
		return errbuf_set(e, -EINVAL, "user %" PRIu64 ": %s: kvpoold has "
				  "no disk tier; start it with --disk_dir and "
				  "--disk_size (kvpool.conf(5))", user,
				  sel == KVP_SEL_TO_DISK ? "offload --tier disk" :
				  "evict --tier disk");
	if (sel == KVP_SEL_DISK) {
		ret = disk_tier_drop(tier_disk(eng), &k);
		return ret < 0 ? errbuf_set(e, ret, "user %" PRIu64 ": nothing on "
					    "the disk tier", user) : ret;
	}
	if (!h)
		return disk_tier_info(tier_disk(eng), &k, &(uint64_t){ 0 },
				      &(uint64_t){ 0 }, &(uint32_t){ 0 }) ? 0 :
		       errbuf_set(e, -ENOENT, "user %" PRIu64 ": nothing cached",
				  user);
	if (tier_history_pins(h))
		return errbuf_set(e, -EBUSY, "user %" PRIu64 " is held by %" PRIu32
				  " lease(s); release them first", user,
				  tier_history_pins(h));
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

	if (!tier_disk(eng))
		return -EINVAL; /* as engine_disk_evict */
	if (sel == KVP_SEL_DISK)
		return (int)disk_tier_drop_all(tier_disk(eng), tier_disk_tenant(eng),
					       tier_disk_pool(eng));
	/* Oldest first; each push takes h off its list (or fails: stop). */
	for (int t = KVP_TIER_DEVICE; t <= KVP_TIER_HOST; t++)
		while ((h = tier_lru_oldest(eng, t))) {
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

	if (!tier_disk(eng))
		return 0;
	for (int t = KVP_TIER_DEVICE; t <= KVP_TIER_HOST; t++)
		while ((h = tier_lru_oldest(eng, t))) {
			uint64_t user = tier_history_user(h);
			int ret = history_to_disk(eng, h);

			/* Staging full: let the disk thread drain it, once. */
			if (ret == -ENOSPC && tier_history_find(eng, user) == h) {
				disk_tier_flush(tier_disk(eng));
				ret = history_to_disk(eng, h);
			}
			if (ret >= 0)
				n++;
			else if (tier_history_find(eng, user) == h)
				tier_history_drop(eng, h); /* lost, as a stop always lost it */
		}
	/* Then idle prefix pages and unheld chunks (share_disk.c writes
	 * them), one at a time with the thread drained after each: its
	 * staging may be smaller than what is there. */
	while (tier_shared_evictable(eng)) {
		tier_shared_evict_oldest(eng);
		disk_tier_flush(tier_disk(eng));
	}
	return n;
}

uint64_t engine_disk_list_count(struct engine *eng, uint64_t cursor)
{
	if (!tier_disk(eng) || tier_shard(eng))
		return 0;
	return disk_tier_list(tier_disk(eng), tier_disk_tenant(eng),
			      tier_disk_pool(eng), cursor, NULL, 0);
}

void engine_disk_list(struct engine *eng, uint64_t cursor, uint64_t *ids,
		      uint64_t *n, uint64_t cap)
{
	uint64_t m;

	if (!tier_disk(eng) || tier_shard(eng))
		return;
	m = disk_tier_list(tier_disk(eng), tier_disk_tenant(eng),
			   tier_disk_pool(eng), cursor, ids + *n, cap - *n);
	/* Histories other shards put there since the count: a list is a
	 * snapshot, they show next time. */
	*n += m < cap - *n ? m : cap - *n;
}

/* ------------------------------------------------------------ tier.h */

static void disk_store(struct engine *eng, struct history *h)
{
	engine_disk_demote(eng, h); /* why not: the engine drops it anyway */
}

/* The disk tier as the engine sees it (tier.h); kvpoold.c registers it. */
const struct tier_ops disk_tier_ops = {
	.name = "disk",
	.attach = engine_disk_attach,
	.detach = engine_disk_detach,
	.fetch = engine_disk_onload,
	.store = disk_store,
	.forget = engine_disk_evict,
	.forget_all = engine_disk_evict_all,
	.info = engine_disk_info,
	.stats = engine_disk_stats,
	.list = engine_disk_list,
	.list_count = engine_disk_list_count,
	/* The shared world's pages below the device tier (share_disk.c): the
	 * disk tier's, and the remote tier's fed from the same host copy. */
	.prefix_more = share_disk_prefix_more,
	.prefix_waiting = share_disk_prefix_waiting,
	.demote_prefix = share_disk_demote_pc,
	.demote_chunk = share_disk_demote_chunk,
	.chunk_restore = share_disk_chunk_restore,
	.chunk_drop = share_disk_chunk_drop,
	.chunk_clear = share_disk_chunk_clear,
	.flush = engine_disk_flush_all,
};
