/* SPDX-License-Identifier: MIT */
/*
 * share_seq_create.c - a virtual sequence made from the pages of sources
 * (seed 000): user histories (pinned, onloaded when offloaded), chunks
 * (held) and other sequences (their pins and page references taken over),
 * then n_new tokens of its own behind a write lease.
 *
 * The order share_seq.c describes: resolve and plan every source, reserve
 * what can fail, then pin and reference, evict, onload, list the pages.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"
#include "share_internal.h"

#define SEQ_MAX_SOURCES 64

struct src_plan {
	uint32_t kind;
	uint64_t tokens;
	struct history *h;
	struct chunk *c;
	struct seq *q;
};

static int src_resolve(struct engine *eng, const struct kvp_seq_src *src,
		       uint32_t i, struct src_plan *p, struct errbuf *e)
{
	char sid[17];

	*p = (struct src_plan){ .kind = src->kind };
	switch (src->kind) {
	case KVP_SRC_USER:
		p->h = engine_find_history(eng, src->id); /* any shard's */
		if (!p->h || !p->h->len)
			return errbuf_set(e, -ENOENT, "source %" PRIu32 ": user %"
					  PRIu64 " has nothing cached", i, src->id);
		if (p->h->start)
			return errbuf_set(e, -EINVAL, "source %" PRIu32 ": user %"
					  PRIu64 "'s history starts at token %" PRIu64
					  " (its head was trimmed): a sequence starts "
					  "at token 0", i, src->id, p->h->start);
		p->tokens = src->tokens ? src->tokens : p->h->len;
		if (p->tokens > p->h->len)
			return errbuf_set(e, -EINVAL, "source %" PRIu32 ": user %"
					  PRIu64 " has %" PRIu64 " tokens committed, "
					  "not %" PRIu64, i, src->id, p->h->len,
					  p->tokens);
		return 0;
	case KVP_SRC_CHUNK:
		p->c = chunk_resolve(eng, &src->chunk);
		chunk_id_short(&src->chunk, sid);
		if (!p->c)
			return errbuf_set(e, -ENOENT, "source %" PRIu32 ": chunk %s "
					  "is not registered (never, or deleted, or "
					  "evicted)", i, sid);
		if (p->c->state != KVP_CHUNK_READY)
			return errbuf_set(e, -EAGAIN, "source %" PRIu32 ": chunk %s "
					  "is not ready (being filled); retry after "
					  "it seals", i, sid);
		p->tokens = p->c->tokens;
		return 0;
	case KVP_SRC_SEQ:
		p->q = seq_find(eng, src->id);
		if (!p->q || !p->q->len)
			return errbuf_set(e, -ENOENT, "source %" PRIu32 ": sequence %"
					  PRIu64 " %s", i, src->id, p->q ?
					  "has no committed tokens" : "does not exist");
		p->tokens = p->q->len;
		return 0;
	default:
		return errbuf_set(e, -EINVAL, "source %" PRIu32 ": kind %" PRIu32
				  " is not user (1), chunk (2) or sequence (3)", i,
				  src->kind);
	}
}

/* Frames the pins of source i take off the evictable lists (once per
 * history or chunk however often it appears). */
static uint64_t src_unavailable(const struct src_plan *p, uint32_t i)
{
	for (uint32_t j = 0; j < i; j++)
		if ((p[i].h && p[j].h == p[i].h) || (p[i].c && p[j].c == p[i].c))
			return 0;
	if (p[i].h && p[i].h->lru == LRU_DEVICE)
		return p[i].h->nres[KVP_TIER_DEVICE];
	if (p[i].c && p[i].c->on_lru)
		return p[i].c->npages;
	return 0;
}

/* Host-only pages of source i's history: the create onloads all of them
 * (counted once however often the history appears). */
static uint32_t src_onload(const struct src_plan *p, uint32_t i)
{
	uint32_t n = 0;

	for (uint32_t j = 0; j < i; j++)
		if (p[i].h && p[j].h == p[i].h)
			return 0;
	for (uint64_t k = 0; p[i].h && k < p[i].h->npages; k++)
		n += p[i].h->pages[k].frame[KVP_TIER_DEVICE] == FRAME_NONE;
	return n;
}

static void seq_pin(struct engine *eng, struct seq *q, uint32_t kind, void *obj)
{
	if (kind == KVP_SRC_USER) {
		history_pin(eng, obj);
		eng->seq_pins++;
		((struct history *)obj)->owner->pinned_by_seqs++;
	} else {
		chunk_hold(eng, obj);
	}
	q->pins[q->npins++] = (struct seq_pin){ kind, obj };
}

/* What a create found its sources to be, before it changes anything. */
struct create_plan {
	struct src_plan src[SEQ_MAX_SOURCES];
	uint64_t total;          /* tokens of every source */
	uint64_t unavailable;    /* device frames the pins take off the LRUs */
	uint64_t onload;         /* host-only pages of the user sources */
	uint32_t npins, nanchors;
};

static int create_plan(struct engine *eng, uint64_t id,
		       const struct kvp_seq_src *src, uint32_t nsrc,
		       struct create_plan *cp, struct errbuf *e)
{
	struct src_plan *plan = cp->src;
	int ret;

	for (uint32_t i = 0; i < nsrc; i++) {
		ret = src_resolve(eng, &src[i], i, &plan[i], e);
		if (ret)
			return ret;
		if (i + 1 < nsrc && plan[i].tokens % eng->P)
			return errbuf_set(e, -EINVAL, "sequence %" PRIu64 ": source %"
					  PRIu32 " ends mid-page (%" PRIu64 " tokens, "
					  "pages of %" PRIu32 "); only the last source "
					  "may, since a page table has one partial page "
					  "(compose chunks with kvp_compose instead)",
					  id, i, plan[i].tokens, eng->P);
		cp->total += plan[i].tokens;
		cp->unavailable += src_unavailable(plan, i);
		cp->onload += src_onload(plan, i);
		cp->npins += plan[i].q ? plan[i].q->npins : 1;
		cp->nanchors += plan[i].q ? plan[i].q->nanchors : 0;
	}
	return 0;
}

/* Commit, first step: q pins and references everything its sources have,
 * so that the eviction after it cannot take any of it. */
static void create_pin_sources(struct engine *eng, struct seq *q,
			       const struct src_plan *plan, uint32_t nsrc)
{
	for (uint32_t i = 0; i < nsrc; i++) {
		struct seq *from = plan[i].q;

		if (!from) {
			seq_pin(eng, q, plan[i].kind, plan[i].h ? (void *)plan[i].h
							        : (void *)plan[i].c);
			continue;
		}
		for (uint32_t k = 0; k < from->npins; k++)
			seq_pin(eng, q, from->pins[k].kind, from->pins[k].obj);
		/* Its anchors hold the published parents of pages it published
		 * after a duplicate: we hold those pages now, so them too. */
		for (uint32_t k = 0; k < from->nanchors; k++) {
			sp_ref(eng, from->anchors[k]);
			q->anchors[q->nanchors++] = from->anchors[k];
		}
	}
	for (uint32_t i = 0; i < nsrc; i++) {
		uint64_t np = pages_for(eng, plan[i].tokens);

		for (uint64_t k = 0; plan[i].q && k < np; k++)
			if (plan[i].q->pages[k].kind == SP_REF)
				sp_ref(eng, plan[i].q->pages[k].frame);
	}
}

/* Commit, after eviction: onload the user sources' host pages (the one
 * onload path) and list every source's pages in q. */
static void create_list_pages(struct engine *eng, struct seq *q,
			      const struct src_plan *plan, uint32_t nsrc)
{
	for (uint32_t i = 0; i < nsrc; i++) {
		uint64_t np = pages_for(eng, plan[i].tokens);

		if (plan[i].h && src_onload(plan, i)) {
			history_onload(eng, plan[i].h, plan[i].h->npages);
			/* borrowed pages must be there when we return */
			history_settle(plan[i].h->owner, plan[i].h);
		}
		for (uint64_t k = 0; k < np; k++) {
			struct seq_page pg;

			if (plan[i].h)
				pg = (struct seq_page){
					plan[i].h->pages[k].frame[KVP_TIER_DEVICE],
					SP_BORROWED };
			else if (plan[i].c)
				pg = (struct seq_page){ plan[i].c->frames[k],
							SP_BORROWED };
			else
				pg = plan[i].q->pages[k]; /* referenced above */
			q->pages[q->npages++] = pg;
			eng->share->seq_pages += pg.kind == SP_REF;
		}
	}
}

/*
 * Sources only on the disk tier come back first: a user into the host tier
 * (then onloaded as any host history), a chunk to the device; a user only
 * in the remote tier (remote_user_histories) into the host tier the same
 * way. All of them
 * before any source is resolved: bringing one back may evict, and a source
 * resolved already would be left pointing at what went. 0, -EINPROGRESS
 * while the disk or remote thread reads (the worker retries), or why one cannot
 * come back.
 */
static int sources_from_disk(struct engine *eng, const struct kvp_seq_src *src,
			     uint32_t nsrc, struct errbuf *e)
{
	for (uint32_t i = 0; (eng->disk || eng->remote) && i < nsrc; i++) {
		struct engine *ue = eng;
		int ret = 0;

		if (src[i].kind == KVP_SRC_USER &&
		    !engine_find_history(eng, src[i].id)) {
			if (eng->set)
				ue = eng->set->v[shard_of_user(eng->set, src[i].id)].eng;
			ret = tier_fetch_one(ue, ENGINE_TIER_DISK, src[i].id,
					     ENGINE_PREPARE_DEFER, e);
			/* Remote tier hook: not on disk either, the store's. */
			if (!ret && !engine_find_history(eng, src[i].id))
				ret = tier_fetch_one(ue, ENGINE_TIER_REMOTE,
						     src[i].id,
						     ENGINE_PREPARE_DEFER, e);
		} else if (src[i].kind == KVP_SRC_CHUNK &&
			   !chunk_resolve(eng, &src[i].chunk)) {
			ret = tier_chunk_restore(eng, &src[i].chunk, 0, false, e);
			if (ret == -ENOENT)
				ret = 0; /* not there either: resolving says so */
		}
		if (ret)
			return ret;
	}
	return 0;
}

int share_seq_create(struct engine *eng, uint64_t id,
		     const struct kvp_seq_src *src, uint32_t nsrc, uint32_t n_new,
		     uint32_t owner, struct engine_lease *out, struct errbuf *e)
{
	struct create_plan cp = { .total = 0 };
	uint64_t total, pages, need, lid = 0;
	struct lease *l;
	struct seq *q = NULL;
	bool cow;
	int ret;

	if (nsrc > SEQ_MAX_SOURCES)
		return errbuf_set(e, -EINVAL, "sequence %" PRIu64 ": %" PRIu32
				  " sources, at most %d", id, nsrc, SEQ_MAX_SOURCES);
	if (!nsrc && !n_new)
		return errbuf_set(e, -EINVAL, "sequence %" PRIu64 ": no sources and "
				  "no new tokens: nothing to make", id);
	if (seq_find(eng, id))
		return seq_exists(id, e);
	ret = sources_from_disk(eng, src, nsrc, e);
	if (!ret)
		ret = create_plan(eng, id, src, nsrc, &cp, e);
	if (ret)
		return ret;
	total = cp.total;
	ret = seq_check_limits(eng, id, total + n_new, true, e);
	if (ret)
		return ret;
	cow = n_new && total % eng->P;
	pages = pages_for(eng, total + n_new);
	need = cp.onload + (pages - pages_for(eng, total)) + cow;
	ret = seq_plan_frames(eng, id, pages, need, cp.unavailable, e);
	if (!ret && n_new)
		ret = lease_reserve(eng, e);
	if (!ret && n_new)
		ret = lease_group_reserve(eng, e);
	if (!ret)
		ret = engine_view_reserve(eng, (uint32_t)pages, e);
	if (ret)
		return ret;
	if (seq_table_reserve(&eng->share->seqs) || !(q = seq_new(id, owner)))
		return errbuf_set(e, -ENOMEM, "out of memory for a sequence");
	q->pins = malloc((cp.npins ? cp.npins : 1) * sizeof(*q->pins));
	q->anchors = cp.nanchors ? malloc(cp.nanchors * sizeof(*q->anchors)) : NULL;
	if (!q->pins || (cp.nanchors && !q->anchors) ||
	    seq_reserve_pages(q, pages)) {
		seq_free_mem(q);
		return errbuf_set(e, -ENOMEM, "out of memory for a sequence");
	}

	/* Commit point. Pins and references first, then eviction. */
	create_pin_sources(eng, q, cp.src, nsrc);
	evict_for_device(eng, (uint32_t)need);
	create_list_pages(eng, q, cp.src, nsrc);
	q->len = total;
	q->cached = total;
	if (cow)
		seq_cow(eng, q);
	while (q->npages < pages)
		seq_push_ref(eng, q, share_frame_alloc(eng));
	q->n_new = n_new;
	seq_table_insert(&eng->share->seqs, q);
	if (n_new) {
		l = lease_new(eng, LEASE_SEQ_WRITE, owner, &lid);
		l->seq = q;
		lease_group_attach(eng, l, owner); /* tp > 1: ranks join it */
		q->write_lease = lid;
	}
	eng->st.prepares++;
	eng->st.hit_tokens += total;
	seq_lease_out(eng, q, lid, total, out);
	return 0;
}
