/* SPDX-License-Identifier: MIT */
/* Past ~800 lines on purpose: prepare's plan-then-commit steps read top to bottom. */
/*
 * engine.c - the pool's life cycle and the history operations: prepare,
 * commit, release, and the one onload path (history_onload). The lease
 * table is lease.c; eviction, offload, demotion and the reclaimer's steps
 * live in evict.c; questions that change nothing (info, stats, listings)
 * in engine_query.c; the consistency walk in engine_check.c.
 *
 * Every operation that can fail does all of its checks and all of its
 * allocations before it changes anything, so an error leaves the engine as it
 * was: a prepare plans its eviction (are there enough unpinned frames?) before
 * evicting a single user.
 *
 * Onload is asynchronous (engine_internal.h, "the onload fence"): a prepare
 * enqueues the copy and returns its fence in the lease; history_settle() is
 * the one place that waits for it.
 */
#include <errno.h>
#include <inttypes.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine_internal.h"
#include "engine_share.h"
#include "shard.h"

/* Positions stay below 2^63 so start + len never wraps. */
#define POS_LIMIT (1ull << 63)

/* ------------------------------------------------------------ life cycle */

/* The configuration checked before anything is made. */
static int config_check(const struct engine_config *cfg, struct errbuf *e)
{
	const struct kvp_layout *l = &cfg->layout;
	uint32_t nframes[KVP_TIERS] = { cfg->device_frames, cfg->host_frames };
	struct kvp_layout chk;
	char lerr[KVP_ERRLEN];

	/* Recompute the strides: a layout edited by hand must not size frames. */
	if (kvp_layout_init(&chk, l->layers, l->kv_heads, l->head_dim, l->dtype,
			    l->page_tokens, lerr, sizeof(lerr)))
		return errbuf_set(e, -EINVAL, "engine: %s", lerr);
	if (memcmp(&chk, l, sizeof(chk)))
		return errbuf_set(e, -EINVAL, "engine: layout strides do not match "
				  "its geometry (use kvp_layout_init or kvp_layout_parse)");
	if (!cfg->device_frames)
		return errbuf_set(e, -EINVAL, "engine: the device tier needs at least "
				  "one page of %" PRIu64 " bytes; raise device_mem",
				  l->page_bytes);
	if (cfg->max_tokens_per_user && cfg->max_tokens_per_user < l->page_tokens)
		return errbuf_set(e, -EINVAL, "engine: max_tokens_per_user %" PRIu64
				  " is less than one page (%" PRIu32 " tokens); use 0 "
				  "for unlimited or at least %" PRIu32,
				  cfg->max_tokens_per_user, l->page_tokens, l->page_tokens);
	for (int t = 0; t < KVP_TIERS; t++) {
		uint64_t bytes;

		if (__builtin_mul_overflow((uint64_t)nframes[t], l->page_bytes, &bytes))
			return errbuf_set(e, -EINVAL, "engine: %s tier of %" PRIu32
					  " pages overflows", kvp_tier_name(t), nframes[t]);
	}
	return 0;
}

int engine_create(struct engine **out, const struct engine_config *cfg,
		  struct errbuf *e)
{
	const struct kvp_layout *l = &cfg->layout;
	uint32_t nframes[KVP_TIERS] = { cfg->device_frames, cfg->host_frames };
	struct engine *eng;
	int ret = config_check(cfg, e);

	if (ret)
		return ret;
	eng = calloc(1, sizeof(*eng));
	if (!eng)
		return errbuf_set(e, -ENOMEM, "engine: out of memory");
	ret = tier_setup(eng, cfg, e); /* the tiers below (tier.h) */
	if (ret) {
		free(eng);
		return ret;
	}
	eng->layout = *l;
	eng->P = l->page_tokens;
	eng->max_tokens = cfg->max_tokens_per_user;
	eng->be = cfg->backend ? cfg->backend : &backend_shm;
	eng->tp = cfg->tp > 1 ? cfg->tp : 1;
	eng->be_ctx = cfg->backend_ctx;
	eng->lease_free = UINT32_MAX;
	for (int t = 0; t < KVP_TIERS; t++) {
		eng->mem[t].fd = -1;
		eng->lru[t] = (struct lru_list){ .frames = 0 };
		INIT_LIST_HEAD(&eng->lru[t].list);
	}
	ret = user_table_init(&eng->users);
	if (ret)
		goto err_nomem;
	eng->set = cfg->set;
	eng->shard = cfg->shard;
	eng->disk = cfg->disk; /* the disk tier's (tier.h) */
	eng->disk_tenant = cfg->disk_tenant;
	eng->disk_pool = cfg->disk_pool;
	eng->remote = cfg->remote; /* the remote tier's (tier.h) */
	eng->remote_chunk_skip = cfg->remote_chunk_skip;
	for (int t = 0; t < KVP_TIERS; t++) {
		if (eng->set) {
			ret = frames_init_shared(&eng->frames[t], eng->set->pool[t],
						 shard_cache_cap(eng->set, t));
			eng->mem[t] = eng->set->mem[t]; /* the set's, not freed here */
			if (ret)
				goto err_nomem;
			continue;
		}
		ret = frames_init(&eng->frames[t], nframes[t]);
		if (ret)
			goto err_nomem;
		if (!nframes[t])
			continue;
		ret = eng->be->tier_alloc(eng->be_ctx, t,
					  (uint64_t)nframes[t] * l->page_bytes,
					  &eng->mem[t], e);
		if (ret)
			goto err;
	}
	ret = share_create(eng, e); /* sized by the device tier */
	if (ret)
		goto err;
	tier_attach(eng);
	*out = eng;
	return 0;

err_nomem:
	ret = errbuf_set(e, -ENOMEM, "engine: out of memory for the page tables");
err:
	engine_destroy(eng);
	return ret;
}

static int free_history_cb(struct history *h, void *arg)
{
	history_free(arg, h);
	return 0;
}

void engine_destroy(struct engine *eng)
{
	if (!eng)
		return;
	tier_detach(eng); /* before its host frames go */
	share_destroy(eng); /* first: sequences pin histories */
	if (eng->users.ht.buckets) {
		user_table_foreach(&eng->users, free_history_cb, eng);
		user_table_fini(&eng->users);
	}
	for (int t = 0; t < KVP_TIERS; t++) {
		if (!eng->set && (eng->mem[t].base || eng->mem[t].fd >= 0))
			eng->be->tier_free(eng->be_ctx, &eng->mem[t]);
		frames_fini(&eng->frames[t]);
	}
	for (uint32_t i = 0; i < eng->leases_cap; i++)
		free(eng->leases[i].grp); /* NULL but for group leases */
	free(eng->grp_spare);
	free(eng->leases);
	free(eng->view);
	free(eng);
}

uint32_t engine_tp(const struct engine *eng)
{
	return eng->tp;
}

const struct kvp_layout *engine_layout(const struct engine *eng)
{
	return &eng->layout;
}

const struct tier_mem *engine_tier(const struct engine *eng, enum kvp_tier t)
{
	return &eng->mem[t];
}

/* ------------------------------------------------------------ pages */

/* h's onload has landed: its copy time goes to ns_h2d (the backend's
 * device time of its fences; 0 for a backend whose copies landed before
 * copy_async returned: history_onload counted their wall time). */
static void history_landed(struct engine *eng, struct history *h)
{
	if (eng->be->fence_ns && h->onload_first)
		eng->st.ns_h2d += eng->be->fence_ns(eng->be_ctx, h->onload_first,
						    h->onload_fence);
	h->onload_fence = 0;
	h->onload_first = 0;
}

void history_settle(struct engine *eng, struct history *h)
{
	if (!h->onload_fence)
		return;
	if (!eng->be->fence_done(eng->be_ctx, h->onload_fence))
		eng->be->fence_wait(eng->be_ctx, h->onload_fence);
	history_landed(eng, h);
}

void page_set_frame(struct engine *eng, struct history *h, uint32_t i,
		    enum kvp_tier t, uint32_t frame)
{
	h->pages[i].frame[t] = frame;
	h->nres[t]++;
	if (h->lru == (int)t)
		eng->lru[t].frames++;
}

void page_free_frame(struct engine *eng, struct history *h, uint32_t i,
		     enum kvp_tier t)
{
	uint32_t f = h->pages[i].frame[t];

	if (f == FRAME_NONE)
		return;
	history_settle(eng, h); /* no frame goes back while a copy uses it */
	frames_free(&eng->frames[t], f);
	h->pages[i].frame[t] = FRAME_NONE;
	h->nres[t]--;
	if (h->lru == (int)t)
		eng->lru[t].frames--;
}

/*
 * The frame allocator is a stack: freeing a history's pages last to first
 * puts its first page's frame on top, so the next history allocated gets
 * them back in ascending order, contiguous, and its copies coalesce into
 * long runs (one 55 GB/s DMA instead of one per page on the GPU).
 */
void pages_free_frames(struct engine *eng, struct history *h, uint32_t from,
		       uint32_t to, enum kvp_tier t)
{
	while (to > from)
		page_free_frame(eng, h, --to, t);
}

/* Drop pages [from, npages) of h, every tier. */
static void history_truncate(struct engine *eng, struct history *h,
			     uint32_t from)
{
	pages_free_frames(eng, h, from, h->npages, KVP_TIER_DEVICE);
	pages_free_frames(eng, h, from, h->npages, KVP_TIER_HOST);
	if (h->npages > from)
		h->npages = from;
}

void history_free(struct engine *eng, struct history *h)
{
	history_truncate(eng, h, 0);
	free(h->pages);
	free(h);
}

static int history_reserve_pages(struct history *h, uint32_t n)
{
	uint32_t cap = h->cap ? h->cap : 4;
	struct page_ref *p;

	if (n <= h->cap)
		return 0;
	while (cap < n)
		cap = cap > UINT32_MAX / 2 ? n : cap * 2;
	p = realloc(h->pages, (size_t)cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	h->pages = p;
	h->cap = cap;
	return 0;
}

/*
 * Trim whole pages off the head of an unpinned history past max_tokens.
 * Page j holds tokens [start + jP, start + (j+1)P), so dropping k head pages
 * advances start by kP and keeps that true. max_tokens >= P (checked at
 * create) so at most ceil(len/P) - 1 pages go and len stays > 0.
 */
static void history_trim_head(struct engine *eng, struct history *h)
{
	uint64_t over;
	uint32_t k;

	if (!eng->max_tokens || h->len <= eng->max_tokens)
		return;
	over = h->len - eng->max_tokens;
	k = (uint32_t)pages_for(eng, over);
	pages_free_frames(eng, h, 0, k, KVP_TIER_DEVICE);
	pages_free_frames(eng, h, 0, k, KVP_TIER_HOST);
	memmove(h->pages, h->pages + k, (size_t)(h->npages - k) * sizeof(*h->pages));
	h->npages -= k;
	h->start += (uint64_t)k * eng->P;
	h->len -= (uint64_t)k * eng->P;
	eng->st.trimmed_pages += k;
}

/* ------------------------------------------------------------ leases */

/* The table itself: lease.c. */

/* ------------------------------------------------------------ onload */

/*
 * The one onload path: every place that brings a history's host pages to
 * the device (prepare, a sequence built over a user's history) comes here.
 * Starts the host -> device copy of h's pages in [0, pages) that have no
 * device frame, into frames the caller made free (evict_for_device), and
 * leaves its fence in h->onload_fence (engine_internal.h, "the onload
 * fence"): a prepare returns it in the lease, a sequence waits for it
 * (history_settle). Returns the pages copied.
 *
 * h may belong to another shard (a sequence of shard 0 borrowing a user
 * of shard k, global mode, shard.h): the frames eng made room for move to
 * the owner's cache, and the owner's engine gives them to its pages.
 */
uint32_t history_onload(struct engine *eng, struct history *h, uint32_t pages)
{
	uint32_t n = 0;

	if (h->owner != eng) {
		uint32_t missing = 0;

		for (uint32_t i = 0; i < pages; i++)
			missing += h->pages[i].frame[KVP_TIER_DEVICE] == FRAME_NONE;
		frames_move(&h->owner->frames[KVP_TIER_DEVICE],
			    &eng->frames[KVP_TIER_DEVICE], missing);
		eng = h->owner;
	}
	/* Pages without a device frame have no copy in flight; an unpinned
	 * history none at all (history_settle): a no-op but for a pinned
	 * history whose earlier onload has not been seen landed. */
	history_settle(eng, h);
	copy_begin(&eng->copy, eng->be, eng->be_ctx, COPY_H2D, COPY_ASYNC,
		   &eng->mem[KVP_TIER_DEVICE], &eng->mem[KVP_TIER_HOST],
		   eng->layout.page_bytes);
	for (uint32_t i = 0; i < pages; i++) {
		if (h->pages[i].frame[KVP_TIER_DEVICE] != FRAME_NONE)
			continue;
		page_set_frame(eng, h, i, KVP_TIER_DEVICE,
			       frames_alloc(&eng->frames[KVP_TIER_DEVICE]));
		copy_page(&eng->copy, h->pages[i].frame[KVP_TIER_DEVICE],
			  h->pages[i].frame[KVP_TIER_HOST]);
		n++;
	}
	/* The shm backend cannot fail; a device backend that does is a
	 * hardware fault, reported by the backend itself. */
	copy_end(&eng->copy, NULL);
	h->onload_fence = eng->copy.fence;
	h->onload_first = eng->copy.first_fence;
	eng->st.onloaded_pages += n;
	eng->st.bytes_h2d += eng->copy.bytes;
	eng->st.ns_h2d += eng->copy.sync_ns; /* copies that landed at once */
	return n;
}

int engine_view_reserve(struct engine *eng, uint32_t n, struct errbuf *e)
{
	uint32_t *v;

	if (n <= eng->view_cap)
		return 0;
	v = realloc(eng->view, (size_t)n * sizeof(*v));
	if (!v)
		return errbuf_set(e, -ENOMEM, "out of memory for a page table of "
				  "%" PRIu32 " pages", n);
	eng->view = v;
	eng->view_cap = n;
	return 0;
}

/* ------------------------------------------------------------ prepare */

/*
 * seq_check_continuity - start_pos must continue the cached history exactly.
 * The message starts with seed 002's sentence, verbatim, then names the
 * user, what the cache holds and what to send instead. After the head was
 * trimmed, tokens before h->start are not cached: they cannot overlap, so an
 * input starting there is told so rather than called overlapping.
 */
static int seq_check_continuity(const struct history *h, uint64_t user,
				uint64_t start_pos, uint32_t n_new,
				struct errbuf *e)
{
	uint64_t end, last;

	if (!h || !h->len)
		return 0; /* nothing cached: a history may start anywhere */
	end = h->start + h->len;
	if (start_pos > end) {
		errbuf_set(e, -EINVAL, "The input sequence has missing tokens "
			   "from %" PRIu64 " to %" PRIu64 " (both inclusive). "
			   "For user %" PRIu64 " the cache holds tokens [%" PRIu64
			   ", %" PRIu64 "): send the input from position %" PRIu64
			   " (or evict the user to start a new history)",
			   end, start_pos - 1, user, h->start, end, end);
		return errbuf_range(e, -EINVAL, KVP_ERROR_GAP, end, start_pos - 1);
	}
	if (start_pos == end)
		return 0;
	if (start_pos < h->start) {
		errbuf_set(e, -EINVAL, "The input sequence starts at token %"
			   PRIu64 ", before the first cached token %" PRIu64
			   " (tokens before it were trimmed). For user %" PRIu64
			   " the cache holds tokens [%" PRIu64 ", %" PRIu64 ") "
			   "(max_tokens_per_user trims its head): remove the "
			   "input's tokens before %"
			   PRIu64 " and send from position %" PRIu64, start_pos,
			   h->start, user, h->start, end, end, end);
		return errbuf_range(e, -EINVAL, KVP_ERROR_TRIMMED, start_pos,
				    h->start - 1);
	}
	/* The overlap is the part of the input the cache holds (a read-only
	 * prepare names everything cached from start_pos on). */
	last = end - 1;
	if (n_new && start_pos + n_new - 1 < last)
		last = start_pos + n_new - 1;
	errbuf_set(e, -EINVAL, "The input sequence has overlapping tokens "
		   "from %" PRIu64 " to %" PRIu64 " (both inclusive). For "
		   "user %" PRIu64 " the cache holds tokens [%" PRIu64 ", %"
		   PRIu64 "): remove them and send from position %" PRIu64,
		   start_pos, last, user, h->start, end, end);
	return errbuf_range(e, -EINVAL, KVP_ERROR_OVERLAP, start_pos, last);
}

int engine_prepare(struct engine *eng, uint64_t user, uint64_t start_pos,
		   uint32_t n_new, uint32_t owner, struct engine_lease *out,
		   struct errbuf *e)
{
	return engine_prepare_flags(eng, user, start_pos, n_new, owner,
				    ENGINE_PREPARE_COUNT, out, e);
}

/*
 * The frames are not free yet and the reclaimer is making room: wait for
 * it rather than evict here, while other users' requests go on.
 *
 * A prepare that onloads also waits while taking its frames would leave
 * the pool under the reclaimer's low watermark (kswapd's min watermark):
 * that reserve is for prepares without an onload, which then find free
 * frames at once while a burst of onloads (each already waiting for its
 * host -> device copy, and reported apart) waits for the reclaimer.
 */
static bool prepare_waits(struct engine *eng, uint32_t total, uint32_t onload,
			  unsigned flags)
{
	struct shard_set *set = eng->set;
	uint32_t nfree = eng->frames[KVP_TIER_DEVICE].nfree;
	bool short_of_frames = nfree < total;

	if (!(flags & ENGINE_PREPARE_WAIT_RECLAIM) || !set)
		return false;
	if (!short_of_frames && onload)
		short_of_frames = frame_pool_free(set->pool[KVP_TIER_DEVICE]) +
				  (nfree - total) < set->rc.low[KVP_TIER_DEVICE];
	if (!short_of_frames || !shard_reclaim_kick(set, total))
		return false;
	if (flags & ENGINE_PREPARE_COUNT) {
		shard_reclaim_stalled(set, total);
		eng->st.reclaim_stalls++;
		eng->st.reclaim_onload_stalls += onload != 0;
	}
	return true;
}

/* A prepare's request checked against h (NULL: a new user): nothing
 * changes. */
static int prepare_check(struct engine *eng, const struct history *h,
			 uint64_t user, uint64_t start_pos, uint32_t n_new,
			 uint64_t after, struct errbuf *e)
{
	struct frames *dev = &eng->frames[KVP_TIER_DEVICE];
	uint64_t len = h ? h->len : 0;
	int ret;

	if (n_new && h && h->write_lease)
		return errbuf_set(e, -EBUSY, "user %" PRIu64 ": tokens from %" PRIu64
				  " are reserved by another lease that has not "
				  "committed; commit or release it first", user,
				  h->start + h->len);
	ret = seq_check_continuity(h, user, start_pos, n_new, e);
	if (ret)
		return ret;
	if (start_pos >= POS_LIMIT || n_new > POS_LIMIT - start_pos)
		return errbuf_set(e, -EINVAL, "user %" PRIu64 ": position %" PRIu64
				  " + %" PRIu32 " tokens is past 2^63", user,
				  start_pos, n_new);

	/* The whole history must fit on the device at once. */
	if (after > dev->total)
		return errbuf_set(e, -E2BIG, "user %" PRIu64 ": %" PRIu64 " tokens "
				  "need %" PRIu64 " pages but the device tier holds only %"
				  PRIu32 "; send fewer tokens, lower max_tokens_per_user "
				  "or raise device_mem", user, len + n_new, after,
				  dev->total);
	return 0;
}

/*
 * Allocate everything a prepare needs that can fail, before it changes
 * anything: a lease slot, the view, the history (*hp, when NULL: made,
 * *created set, not yet in the table) and its page table for `pages`.
 */
static int prepare_alloc(struct engine *eng, struct history **hp,
			 uint64_t user, uint32_t view_pages, uint32_t pages,
			 bool *created, struct errbuf *e)
{
	struct history *h = *hp;
	int ret;

	ret = lease_reserve(eng, e);
	if (ret)
		return ret;
	ret = engine_view_reserve(eng, view_pages, e);
	if (ret)
		return ret;
	if (!h) {
		if (user_table_reserve(&eng->users) ||
		    !(h = calloc(1, sizeof(*h))))
			return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of "
					  "memory for a new history", user);
		h->owner = eng;
		h->user = user;
		h->lru = LRU_NONE;
		INIT_LIST_HEAD(&h->lru_link);
	}
	if (history_reserve_pages(h, pages)) {
		if (!*hp)
			free(h);
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory "
				  "for a page table of %" PRIu32 " pages", user,
				  pages);
	}
	*created = !*hp;
	*hp = h;
	return 0;
}

/* The lease of a prepare that has its pages: taken, h pinned, *out. */
static void prepare_lease_out(struct engine *eng, struct history *h,
			      uint64_t len, uint32_t n_new, uint32_t owner,
			      uint32_t view_pages, uint32_t onload,
			      struct engine_lease *out)
{
	uint64_t lid;
	struct lease *l = lease_new(eng, LEASE_HISTORY, owner, &lid);

	l->h = h;
	l->len0 = len;
	l->n_new = n_new;
	if (eng->tp > 1) {
		/* A group lease: rank 0's (engine_lease_join). */
		l->grp = eng->grp_spare;
		eng->grp_spare = NULL;
		*l->grp = (struct lease_group){ .members = 1, .joined = 1,
						.of = LEASE_HISTORY };
		l->grp->owner[0] = owner;
	}
	h->pins++;
	if (n_new) {
		h->write_lease = lid;
		h->wgen++;
	}

	eng->st.prepares++;
	eng->st.hit_tokens += len;

	for (uint32_t i = 0; i < view_pages; i++)
		eng->view[i] = h->pages[i].frame[KVP_TIER_DEVICE];
	*out = (struct engine_lease){
		.id = lid,
		.start = h->start,
		.len = len,
		.n_new = n_new,
		.npages = view_pages,
		.frames = eng->view,
		.last_page_len = view_pages ?
			(uint32_t)((len + n_new - 1) % eng->P) + 1 : 0,
		.hit_tokens = len,
		.onloaded_pages = onload,
		.fence = h->onload_fence,
	};
}

/*
 * Check (prepare_check), plan the device frames, allocate what can fail
 * (prepare_alloc), then commit: make room, onload (history_onload), the
 * new pages, the lease (prepare_lease_out). The plan and the commit stay
 * here, side by side, so that what is counted is what is taken.
 */
static int prepare_body(struct engine *eng, uint64_t user, uint64_t start_pos,
			uint32_t n_new, uint32_t owner, unsigned flags,
			struct engine_lease *out, struct errbuf *e);

int engine_prepare_flags(struct engine *eng, uint64_t user, uint64_t start_pos,
			 uint32_t n_new, uint32_t owner, unsigned flags,
			 struct engine_lease *out, struct errbuf *e)
{
	/* A tensor-parallel pool's lease has a group: allocated first, kept
	 * for the next prepare when this one fails. */
	if (eng->tp > 1 && !eng->grp_spare &&
	    !(eng->grp_spare = calloc(1, sizeof(*eng->grp_spare))))
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": out of memory "
				  "for a group lease", user);
	return prepare_body(eng, user, start_pos, n_new, owner, flags, out, e);
}

static int prepare_body(struct engine *eng, uint64_t user, uint64_t start_pos,
			uint32_t n_new, uint32_t owner, unsigned flags,
			struct engine_lease *out, struct errbuf *e)
{
	struct history *h = user_table_find(&eng->users, user);
	struct frames *dev = &eng->frames[KVP_TIER_DEVICE];
	uint64_t len, avail, after;
	uint32_t old_pages, onload, new_pages, total, view_pages;
	bool created = false;
	int ret;

	/* Disk and remote tier hooks: a history only on disk, or only in the
	 * store (remote_user_histories), comes back to the host tier first
	 * (tier.h's fetch), then
	 * onloads as any other. */
	if (!h && (eng->disk || eng->remote)) {
		ret = tier_fetch(eng, user, flags, e);
		if (ret)
			return ret;
		h = user_table_find(&eng->users, user);
	}
	len = h ? h->len : 0;
	after = pages_for(eng, len + n_new);
	ret = prepare_check(eng, h, user, start_pos, n_new, after, e);
	if (ret)
		return ret;

	/*
	 * Plan: device frames for host-only pages and for the new tokens. A
	 * reader (n_new == 0) may come while a writer holds reserved pages past
	 * the committed ones: it gets the committed pages only.
	 */
	old_pages = h ? h->npages : 0;
	onload = h ? h->npages - h->nres[KVP_TIER_DEVICE] : 0;
	new_pages = n_new ? (uint32_t)after - old_pages : 0;
	view_pages = n_new ? (uint32_t)after : (uint32_t)pages_for(eng, len);
	total = onload + new_pages;
	avail = engine_device_avail(eng, h, total);
	if (prepare_waits(eng, total, onload, flags))
		return errbuf_set(e, engine_wait_set(ENGINE_WAIT_RECLAIM),
				  "user %" PRIu64 ": waiting for the reclaimer to free %" PRIu32 " device pages",
				  user, total);
	if (total > avail && eng->set && !eng->set->global)
		return errbuf_set(e, -EAGAIN, "user %" PRIu64 ": shard %" PRIu32
				  " has %" PRIu64 " of the %" PRIu32 " device pages "
				  "needed; retried with every shard", user, eng->shard,
				  avail, total);
	if (total > avail)
		return errbuf_set(e, -ENOMEM, "user %" PRIu64 ": device tier out of "
				  "memory: %" PRIu32 " pages needed, %" PRIu32 " free "
				  "and %" PRIu64 " evictable, the rest pinned by %" PRIu32
				  " leases; release leases or raise device_mem", user,
				  total, dev->nfree, avail - dev->nfree,
				  eng->history_leases);

	/* Allocate everything that can fail before changing anything. */
	ret = prepare_alloc(eng, &h, user, view_pages, old_pages + new_pages,
			    &created, e);
	if (ret)
		return ret;

	/* Commit point: from here on nothing fails. */
	if (created)
		user_table_insert(&eng->users, h);
	lru_remove(eng, h); /* pinned from now on: never its own victim */
	if (dev->nfree < total) {
		evict_for_device(eng, total);
		if (flags & ENGINE_PREPARE_COUNT)
			eng->st.reclaim_direct++; /* no room: made here */
	}

	/*
	 * Onload without waiting: the copy lands while the caller goes on, and
	 * the lease carries its fence. The frames it reads and writes stay h's
	 * and h stays pinned until it has landed (history_settle). A pinned
	 * history has every page on the device, so h has at most one onload
	 * in flight: this one, or the one a prepare before us started.
	 */
	if (onload)
		history_onload(eng, h, h->npages);
	if (h->onload_fence &&
	    eng->be->fence_done(eng->be_ctx, h->onload_fence))
		history_landed(eng, h);

	if (!len && n_new)
		h->start = start_pos;
	/* The partly filled last page keeps its host copy until tokens are
	 * committed into it (lease_settle): the onload above may still be
	 * reading it. */
	for (uint32_t i = 0; i < new_pages; i++) {
		h->pages[h->npages] = (struct page_ref){
			.frame = { frames_alloc(dev), FRAME_NONE } };
		h->nres[KVP_TIER_DEVICE]++;
		h->npages++;
	}
	prepare_lease_out(eng, h, len, n_new, owner, view_pages, onload, out);
	return 0;
}

int engine_lease_slots(struct engine *eng, uint64_t id, uint32_t first,
		       uint32_t n, struct kvp_slot *out, struct errbuf *e)
{
	struct lease *l = lease_lookup(eng, id);

	if (!l)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not held "
				  "(released, or never prepared)", id);
	if (l->kind != LEASE_HISTORY)
		return share_lease_slots(eng, l, id, first, n, out, e);
	if (l->committed)
		return errbuf_set(e, -EALREADY, "lease %#" PRIx64 " has committed; "
				  "its slots are no longer writable", id);
	if (first > l->n_new || n > l->n_new - first)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": slots [%" PRIu32
				  ", %" PRIu32 ") past its %" PRIu32 " new tokens",
				  id, first, first + n, l->n_new);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t q = l->len0 + first + i;

		out[i].frame = l->h->pages[q / eng->P].frame[KVP_TIER_DEVICE];
		out[i].slot = (uint32_t)(q % eng->P);
	}
	return 0;
}

/* ------------------------------------------------------------ commit / release */

/*
 * End l's reservation keeping n tokens; free the pages they do not reach.
 * A reader's lease reserved nothing: settling it changes nothing.
 */
static void lease_settle(struct engine *eng, struct lease *l, uint32_t n)
{
	struct history *h = l->h;

	l->committed = true;
	if (h->write_lease != lease_id(eng, l))
		return;
	/* Tokens committed into the partly filled last page make its host
	 * copy stale. (Until now it was not: the writer's slots lie past the
	 * committed tokens, and a pinned page is never copied back from it.) */
	if (n && l->len0 % eng->P)
		page_free_frame(eng, h, (uint32_t)(l->len0 / eng->P), KVP_TIER_HOST);
	h->len = l->len0 + n;
	history_truncate(eng, h, (uint32_t)pages_for(eng, h->len));
	h->write_lease = 0;
}

int engine_commit(struct engine *eng, uint64_t id, uint32_t n,
		  struct errbuf *e)
{
	struct lease *l = lease_lookup(eng, id);

	if (!l)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not held "
				  "(released, or never prepared)", id);
	if (l->kind != LEASE_HISTORY)
		return share_lease_commit(eng, l, id, n, e);
	if (l->committed)
		return errbuf_set(e, -EALREADY, "lease %#" PRIx64 " has already "
				  "committed; prepare again for more tokens", id);
	if (n > l->n_new)
		return errbuf_set(e, -EINVAL, "lease %#" PRIx64 ": commit of %"
				  PRIu32 " tokens but only %" PRIu32 " were prepared",
				  id, n, l->n_new);
	lease_settle(eng, l, n);
	eng->st.commits++;
	eng->st.committed_tokens += n;
	return 0;
}

/* lease_release() of a history lease; the slot is freed after. */
void history_lease_end(struct engine *eng, struct lease *l)
{
	if (!l->committed)
		lease_settle(eng, l, 0); /* roll the reservation back */
	history_unpin(eng, l->h);
}

/* A sequence of shard 0 may pin a history of another shard (global mode,
 * shard.h): the history's own engine keeps its lists. */
void history_pin(struct engine *eng, struct history *h)
{
	(void)eng;
	lru_remove(h->owner, h);
	h->pins++;
}

void history_unpin(struct engine *eng, struct history *h)
{
	eng = h->owner;
	if (--h->pins)
		return;
	/* Unpinned, h may be evicted: its onload must be over (only a lease
	 * released before its completion was sent can get here first). */
	history_settle(eng, h);
	history_trim_head(eng, h);
	if (!h->npages) {
		user_table_remove(&eng->users, h);
		history_free(eng, h);
		return;
	}
	lru_insert(eng, h);
}

int engine_release(struct engine *eng, uint64_t id, struct errbuf *e)
{
	struct lease *l = lease_lookup(eng, id);

	if (!l)
		return errbuf_set(e, -ENOENT, "lease %#" PRIx64 " is not held "
				  "(released already, or never prepared)", id);
	lease_release(eng, l);
	return 0;
}

uint32_t engine_release_owner(struct engine *eng, uint32_t owner)
{
	/* Leases of every kind first (they hold sequences' writes), then
	 * the sequences the client made. */
	uint32_t n = lease_release_owner(eng, owner);

	return n + share_release_owner(eng, owner);
}
