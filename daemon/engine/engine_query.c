/* SPDX-License-Identifier: MIT */
/*
 * engine_query.c - what the engine answers without changing anything: a
 * user's info, statistics, the users listed, a lease's owner and user, the
 * page count of a prepare, fences, and the test hook that reads tokens
 * back. The operations that change state are engine.c's and evict.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "engine_share.h"
#include "shard.h"

/* ------------------------------------------------------------ info */

void engine_info(struct engine *eng, uint64_t user, struct engine_user_info *out)
{
	struct history *h = user_table_find(&eng->users, user);

	memset(out, 0, sizeof(*out));
	/* Disk tier hook: the disk copy's figures (all of them for a history
	 * only on disk). */
	tier_info(eng, user, out);
	if (!h)
		return;
	out->exists = true;
	out->start = h->start;
	out->len = h->len;
	out->pages = (uint32_t)pages_for(eng, h->len);
	out->leases = h->pins - h->demoting; /* the reclaimer's pin is no lease */
	for (uint32_t i = 0; i < out->pages; i++) {
		out->pages_device += h->pages[i].frame[KVP_TIER_DEVICE] != FRAME_NONE;
		out->pages_host += h->pages[i].frame[KVP_TIER_HOST] != FRAME_NONE;
	}
}

/* ------------------------------------------------------------ stats */

void engine_set_max_tokens(struct engine *eng, uint64_t max_tokens)
{
	eng->max_tokens = max_tokens;
}

void engine_stats(const struct engine *eng, struct kvp_stats *out)
{
	*out = eng->st;
	for (int t = 0; t < KVP_TIERS; t++) {
		const struct frames *f = &eng->frames[t];

		out->tier[t] = (struct kvp_tier_stats){
			.frames_total = f->total,
			.frames_used = frames_used(f),
			.frames_free = f->nfree,
			.bytes_total = (uint64_t)f->total * eng->layout.page_bytes,
		};
	}
	out->users = user_table_count(&eng->users);
	out->leases = eng->leases_live; /* every kind: one table */
	share_stats(eng, out);
	tier_stats(eng, out); /* the tiers below */
}

uint64_t engine_prepare_pages(struct engine *eng, uint64_t user, uint32_t n_new)
{
	struct history *h = user_table_find(&eng->users, user);

	return pages_for(eng, (h ? h->len : 0) + n_new);
}

int64_t engine_lease_owner(struct engine *eng, uint64_t id)
{
	struct lease *l = lease_lookup(eng, id);

	return l ? (int64_t)l->owner : -ENOENT;
}

int engine_lease_user(struct engine *eng, uint64_t id, uint64_t *user)
{
	struct lease *l = lease_lookup(eng, id);

	if (!l || l->kind != LEASE_HISTORY)
		return -ENOENT;
	*user = l->h->user;
	return 0;
}

/* Only the backend is touched (immutable after create): no mutex needed. */
int engine_fence_done(struct engine *eng, uint64_t fence)
{
	return !fence || eng->be->fence_done(eng->be_ctx, fence);
}

void engine_fence_wait(struct engine *eng, uint64_t fence)
{
	if (fence && !eng->be->fence_done(eng->be_ctx, fence))
		eng->be->fence_wait(eng->be_ctx, fence);
}

struct list_ctx {
	uint64_t cursor;
	uint64_t *ids;
	uint64_t n;
};

static int list_collect_cb(struct history *h, void *arg)
{
	struct list_ctx *c = arg;

	if (h->user >= c->cursor)
		c->ids[c->n++] = h->user;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int engine_list_users(struct engine *eng, uint64_t cursor,
		      struct kvp_user_info *rows, uint32_t max, uint64_t *next)
{
	struct list_ctx c = { cursor, NULL, 0 };
	uint64_t cap;
	uint32_t n;

	*next = 0;
	/* Disk tier hook: users only on disk are listed too. */
	cap = user_table_count(&eng->users) + tier_list_count(eng, cursor);
	if (!cap || !max)
		return 0;
	c.ids = malloc(cap * sizeof(*c.ids));
	if (!c.ids)
		return -ENOMEM;
	user_table_foreach(&eng->users, list_collect_cb, &c);
	tier_list(eng, cursor, c.ids, &c.n, cap); /* the tiers below */
	qsort(c.ids, c.n, sizeof(*c.ids), cmp_u64);
	n = c.n < max ? (uint32_t)c.n : max;
	for (uint32_t i = 0; i < n; i++) {
		struct engine_user_info in;

		engine_info(eng, c.ids[i], &in);
		rows[i] = (struct kvp_user_info){
			.user = c.ids[i], .start = in.start, .len = in.len,
			.pages_device = in.pages_device, .pages_host = in.pages_host,
			.leases = in.leases, .pages_disk = in.pages_disk,
			.tokens_disk = in.tokens_disk,
		};
	}
	/* A last id of UINT64_MAX has no successor: that page is the last. */
	if (c.n > n && c.ids[n - 1] != UINT64_MAX)
		*next = c.ids[n - 1] + 1;
	free(c.ids);
	return (int)n;
}

/*
 * Through the backend's read op, page by page: the device tier need not be
 * host-visible (cuda). For each page the tokens [a, b) wanted lie in 2 *
 * layers contiguous row ranges (one per layer and K|V); those are read into
 * a page-sized bounce buffer at their page offsets, then gathered in token
 * order by the CPU reference.
 */
int engine_read_tokens(struct engine *eng, uint64_t user, uint64_t pos,
		       uint32_t n, void *out, struct errbuf *e)
{
	struct history *h = user_table_find(&eng->users, user);
	const struct kvp_layout *l = &eng->layout;
	struct kvp_slot *slots = NULL;
	unsigned char *dst = out, *page = NULL;
	uint32_t i = 0;
	int ret = 0;

	if (!h || pos < h->start || pos - h->start > h->len ||
	    n > h->len - (pos - h->start))
		return errbuf_set(e, -ERANGE, "user %" PRIu64 ": tokens [%" PRIu64
				  ", %" PRIu64 ") are not all cached", user, pos,
				  pos + n);
	if (!n)
		return 0;
	history_settle(eng, h); /* read what the onload brought */
	page = malloc(l->page_bytes);
	slots = malloc((size_t)eng->P * sizeof(*slots));
	if (!page || !slots) {
		ret = errbuf_set(e, -ENOMEM, "out of memory for a page of %" PRIu64
				 " bytes", l->page_bytes);
		goto out;
	}
	while (i < n) {
		uint64_t q = pos - h->start + i;
		const struct page_ref *p = &h->pages[q / eng->P];
		int t = p->frame[KVP_TIER_DEVICE] != FRAME_NONE ? KVP_TIER_DEVICE
								 : KVP_TIER_HOST;
		uint32_t a = (uint32_t)(q % eng->P), b = eng->P;
		uint64_t frame_off = (uint64_t)p->frame[t] * l->page_bytes;

		if (b - a > n - i)
			b = a + (n - i);
		for (uint32_t layer = 0; layer < l->layers && !ret; layer++) {
			for (uint32_t kv = 0; kv < 2 && !ret; kv++) {
				uint64_t in = layer * l->layer_stride +
					      kv * l->kv_stride + a * l->token_stride;

				ret = eng->be->read(eng->be_ctx, &eng->mem[t],
						    frame_off + in, page + in,
						    (b - a) * l->token_stride, e);
			}
		}
		if (ret)
			goto out;
		for (uint32_t s = a; s < b; s++)
			slots[s - a] = (struct kvp_slot){ 0, s };
		kvp_read_cpu(l, page, slots, b - a, dst);
		dst += (uint64_t)(b - a) * l->token_bytes;
		i += b - a;
	}
out:
	free(page);
	free(slots);
	return ret;
}

/* ------------------------------------------------------------ lookups */

bool engine_device_frame_in_use(const struct engine *eng, uint32_t f)
{
	if (!eng->set)
		return frames_in_use(&eng->frames[KVP_TIER_DEVICE], f);
	for (uint32_t i = 0; i < eng->set->n; i++)
		if (frames_in_use(&eng->set->v[i].eng->frames[KVP_TIER_DEVICE], f))
			return true;
	return false;
}

struct history *engine_find_history(struct engine *eng, uint64_t user)
{
	if (eng->set)
		eng = eng->set->v[shard_of_user(eng->set, user)].eng;
	return user_table_find(&eng->users, user);
}
