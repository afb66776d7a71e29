/* SPDX-License-Identifier: MIT */
/*
 * share_seq.c - sequences: request-scoped page lists built on prefix-cache
 * hits (seed 004 allocate/free) and virtual sequences built from the pages
 * of user histories, chunks and other sequences (seed 000; their create is
 * share_seq_create.c).
 *
 * A sequence's page i is either borrowed (a history's or a chunk's frame:
 * the sequence pins the history / holds the chunk, which keeps the frame and
 * its bytes) or refcounted (sp[].refs: prefix hits, another sequence's
 * pages, its own). Only the last page of a sequence may be partial, and a
 * partial last page that someone else can see (borrowed, or refs > 1) is
 * copied before the sequence writes into it: copy on write, so neither side
 * ever sees the other's new tokens. (The owner of a borrowed history page
 * appends past our tokens only, so our tokens never change under us.)
 *
 * Ordering within the engine: every operation plans its frames (free +
 * evictable after the pins it is about to take) before it changes anything,
 * takes its pins and references first, then evicts, so eviction can never
 * pick what the operation is about to use.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "share_internal.h"

/* ------------------------------------------------------------ table */

/* Sequences by id: lib/hashtab.h keyed by the uint64 id. */
int seq_table_init(struct seq_table *t)
{
	return hashtab_init(&t->ht, 64);
}

struct seq *seq_find(struct engine *eng, uint64_t id)
{
	struct hnode *n = hashtab_find_u64(&eng->share->seqs.ht, id);

	return n ? hashtab_entry(n, struct seq, hnode) : NULL;
}

/* Grow before inserting, so the insert itself cannot fail. */
int seq_table_reserve(struct seq_table *t)
{
	return hashtab_reserve(&t->ht, 1);
}

void seq_table_insert(struct seq_table *t, struct seq *q)
{
	hashtab_insert(&t->ht, &q->hnode, hashtab_hash_u64(q->id));
}

static void seq_table_remove(struct seq_table *t, struct seq *q)
{
	hashtab_remove(&t->ht, &q->hnode);
}

/* ------------------------------------------------------------ helpers */

int seq_reserve_pages(struct seq *q, uint64_t n)
{
	uint32_t cap = q->cap ? q->cap : 4;
	struct seq_page *p;

	if (n <= q->cap)
		return 0;
	if (n > UINT32_MAX)
		return -ENOMEM;
	while (cap < n)
		cap = cap > UINT32_MAX / 2 ? (uint32_t)n : cap * 2;
	p = realloc(q->pages, (size_t)cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	q->pages = p;
	q->cap = cap;
	return 0;
}

static int seq_reserve_tokens(struct seq *q, uint64_t n)
{
	uint64_t cap = q->tokens_cap ? q->tokens_cap : 64;
	uint32_t *t;

	if (n <= q->tokens_cap)
		return 0;
	while (cap < n)
		cap *= 2;
	t = realloc(q->tokens, cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	q->tokens = t;
	q->tokens_cap = cap;
	return 0;
}

void seq_push_ref(struct engine *eng, struct seq *q, uint32_t frame)
{
	sp_ref(eng, frame);
	q->pages[q->npages++] = (struct seq_page){ frame, SP_REF };
	eng->share->seq_pages++;
}

static void seq_drop_page(struct engine *eng, struct seq *q, uint32_t i)
{
	if (q->pages[i].kind == SP_REF) {
		sp_unref(eng, q->pages[i].frame);
		eng->share->seq_pages--;
	}
}

/* Drop pages [from, npages), last first (frames go back ascending). */
static void seq_truncate(struct engine *eng, struct seq *q, uint32_t from)
{
	while (q->npages > from)
		seq_drop_page(eng, q, --q->npages);
}

/* Is the partial last page visible to anyone else? Then copy it first. */
static bool seq_needs_cow(const struct engine *eng, const struct seq *q)
{
	const struct seq_page *p;

	if (!(q->len % eng->P) || !q->npages)
		return false;
	p = &q->pages[q->npages - 1];
	/* Published, the page is full for the sequence that published it (a
	 * sequence created from it before that commit sees it partial) and
	 * any later prefix hit's: never written in place (test_shard_model,
	 * test_extend_copies_a_published_partial_page). */
	return p->kind == SP_BORROWED || eng->share->sp[p->frame].refs > 1 ||
	       eng->share->sp[p->frame].pc != PC_NONE;
}

/* Copy the last page into a frame of q's own (device to device). */
void seq_cow(struct engine *eng, struct seq *q)
{
	struct seq_page *p = &q->pages[q->npages - 1];
	uint32_t f = share_frame_alloc(eng);

	copy_begin(&eng->copy, eng->be, eng->be_ctx, COPY_D2D, COPY_SYNC,
		   &eng->mem[KVP_TIER_DEVICE], &eng->mem[KVP_TIER_DEVICE],
		   eng->layout.page_bytes);
	copy_page(&eng->copy, f, p->frame);
	copy_end(&eng->copy, NULL); /* as every copy: a fault is the backend's to report */
	seq_drop_page(eng, q, q->npages - 1);
	sp_ref(eng, f);
	*p = (struct seq_page){ f, SP_REF };
	eng->share->seq_pages++;
	eng->st.cow_pages++;
}

void seq_lease_out(struct engine *eng, const struct seq *q, uint64_t lid,
		   uint64_t hit, struct engine_lease *out)
{
	uint64_t tokens = q->len + q->n_new;

	for (uint32_t i = 0; i < q->npages; i++)
		eng->view[i] = q->pages[i].frame;
	*out = (struct engine_lease){
		.id = lid,
		.len = q->len,
		.n_new = q->n_new,
		.npages = q->npages,
		.frames = eng->view,
		.last_page_len = tokens ? (uint32_t)((tokens - 1) % eng->P) + 1 : 0,
		.hit_tokens = hit,
	};
}

void share_seq_join_out(struct engine *eng, struct lease *l, uint64_t id,
			struct engine_lease *out)
{
	seq_lease_out(eng, l->seq, id, l->seq->len, out);
}

struct seq *seq_new(uint64_t id, uint32_t owner)
{
	struct seq *q = calloc(1, sizeof(*q));

	if (q) {
		q->id = id;
		q->owner = owner;
	}
	return q;
}

void seq_free_mem(struct seq *q)
{
	free(q->pages);
	free(q->pins);
	free(q->tokens);
	free(q->anchors);
	free(q);
}

int seq_exists(uint64_t id, struct errbuf *e)
{
	return errbuf_set(e, -EEXIST, "sequence %" PRIu64 " exists already; "
			  "free it first or pick another id", id);
}

void share_seq_configure(struct engine *eng, bool caching, uint64_t max_tokens,
			 uint64_t max_seqs)
{
	eng->share->no_caching = !caching;
	eng->share->max_seq_tokens = max_tokens;
	eng->share->max_seqs = max_seqs;
}

/* Seed 004's MaxSeqLen and MaxNumRequests, per tenant and pool. */
int seq_check_limits(struct engine *eng, uint64_t id, uint64_t tokens,
		     bool adding, struct errbuf *e)
{
	const struct share *s = eng->share;

	if (s->max_seq_tokens && tokens > s->max_seq_tokens)
		return errbuf_set(e, -E2BIG, "sequence %" PRIu64 ": %" PRIu64
				  " tokens but max_seq_tokens is %" PRIu64 "; use "
				  "fewer tokens or raise max_seq_tokens (kvpool.conf)",
				  id, tokens, s->max_seq_tokens);
	if (adding && s->max_seqs && s->seqs.ht.count >= s->max_seqs)
		return errbuf_set(e, -ENOSPC, "sequence %" PRIu64 ": the tenant "
				  "has %" PRIu64 " sequences in this pool and max_seqs "
				  "is %" PRIu64 "; free one (kvp_seq_free) or raise "
				  "max_seqs (kvpool.conf)", id,
				  (uint64_t)s->seqs.ht.count, s->max_seqs);
	return 0;
}

int seq_plan_frames(struct engine *eng, uint64_t id, uint64_t pages_total,
		    uint64_t need, uint64_t unavailable, struct errbuf *e)
{
	uint64_t want = need + unavailable; /* pulled from the pool first */
	uint64_t avail = engine_device_avail(eng, NULL, want > UINT32_MAX ?
					     UINT32_MAX : (uint32_t)want);

	if (pages_total > eng->frames[KVP_TIER_DEVICE].total)
		return errbuf_set(e, -E2BIG, "sequence %" PRIu64 ": %" PRIu64
				  " pages but the device tier holds only %" PRIu32
				  "; use fewer tokens or raise device_mem", id,
				  pages_total, eng->frames[KVP_TIER_DEVICE].total);
	avail = avail > unavailable ? avail - unavailable : 0;
	if (need > avail)
		return errbuf_set(e, -ENOMEM, "sequence %" PRIu64 ": device tier out "
				  "of memory: %" PRIu64 " pages needed, %" PRIu64
				  " free or evictable, the rest held; release leases, "
				  "free sequences or raise device_mem", id, need, avail);
	return 0;
}

/* ------------------------------------------------------------ publishing */

/* Publish the full committed pages not yet published (see the top of
 * share_prefix.c for the chain). */
static void seq_publish(struct engine *eng, struct seq *q)
{
	static const uint8_t zero[32];
	struct share *s = eng->share;
	uint32_t full = (uint32_t)(q->len / eng->P);

	if (s->no_caching)
		return; /* prefix_caching off: a later commit with it on catches up */
	while (q->hashable && q->published < full) {
		uint32_t i = q->published, parent = PC_NONE, e;
		const uint8_t *prev = zero;
		uint8_t h[32];

		if (i) {
			/* Page i-1 is published: by us, or anchored. */
			parent = q->nanchors && s->sp[q->pages[i - 1].frame].pc == PC_NONE ?
				 s->sp[q->anchors[q->nanchors - 1]].pc :
				 s->sp[q->pages[i - 1].frame].pc;
			prev = s->pc[parent].hash;
		}
		pc_hash_page(eng, prev, q->tokens + (uint64_t)i * eng->P, h);
		e = pc_find(eng, h);
		if (e == PC_NONE) {
			pc_publish(eng, q->pages[i].frame, h, parent);
		} else if (s->pc[e].frame != q->pages[i].frame) {
			/* Someone published the same tokens first: keep ours (the
			 * client holds our page table) and hold theirs. */
			uint32_t *a = realloc(q->anchors,
					      (q->nanchors + 1) * sizeof(*a));

			if (!a) {
				q->hashable = false; /* stop publishing; nothing lost */
				break;
			}
			q->anchors = a;
			sp_ref(eng, s->pc[e].frame);
			q->anchors[q->nanchors++] = s->pc[e].frame;
			eng->st.prefix_dedupe_pages++;
		}
		q->published++;
	}
}

/* ------------------------------------------------------------ commit */

void seq_commit(struct engine *eng, struct seq *q, uint32_t n)
{
	q->len += n;
	q->n_new = 0;
	seq_truncate(eng, q, (uint32_t)pages_for(eng, q->len));
	seq_publish(eng, q);
}

void seq_end_write(struct engine *eng, struct seq *q)
{
	q->n_new = 0;
	seq_truncate(eng, q, (uint32_t)pages_for(eng, q->len));
}

/* ------------------------------------------------------------ alloc */

int share_seq_alloc(struct engine *eng, uint64_t id, const uint32_t *tokens,
		    uint32_t n, uint32_t owner, struct engine_lease *out,
		    struct errbuf *e)
{
	struct share *s = eng->share;
	uint32_t full, hit = 0, idle_hits = 0, *hits = NULL, cached;
	uint64_t pages, lid;
	struct lease *l;
	struct seq *q = NULL;
	bool whole;
	int ret;

	if (!n)
		return errbuf_set(e, -EINVAL, "sequence %" PRIu64 ": no tokens "
				  "given", id);
	if (seq_find(eng, id))
		return seq_exists(id, e);
	ret = seq_check_limits(eng, id, n, true, e);
	if (ret)
		return ret;
	pages = pages_for(eng, n);
	/* Every full page may hit, the last one too; none without caching. */
	full = s->no_caching ? 0 : n / eng->P;
	ret = seq_plan_frames(eng, id, pages, 0, 0, e);
	if (ret)
		return ret;
	if (tier_prefix_waiting(eng)) /* nothing read since the last try */
		return errbuf_set(e, -EINPROGRESS, "sequence %" PRIu64 ": a cached "
				  "prefix is being read back from the disk tier", id);
	hits = malloc((full ? full : 1) * sizeof(*hits));
	if (!hits)
		return errbuf_set(e, -ENOMEM, "out of memory");
	hit = pc_match(eng, tokens, full, hits, &idle_hits);
	/* Pages of the chain on the disk tier come back first (idle). */
	if (tier_prefix_more(eng, ENGINE_TIER_DISK, tokens, full, hits, &hit,
			     &idle_hits, false)) {
		free(hits);
		return errbuf_set(e, -EINPROGRESS, "sequence %" PRIu64 ": its "
				  "cached prefix is being read back from the disk "
				  "tier", id);
	}
	/* Then the remote tier's (remote_engine.h), counted idle once back. */
	if (tier_prefix_more(eng, ENGINE_TIER_REMOTE, tokens, full, hits, &hit,
			     &idle_hits, false)) {
		free(hits);
		return errbuf_set(e, -EINPROGRESS, "sequence %" PRIu64 ": its "
				  "cached prefix is being fetched from the remote "
				  "tier", id);
	}
	if (eng->remote)
		hit = pc_match(eng, tokens, full, hits, &idle_hits);
	/*
	 * Seed 004: a prompt cached whole reports n - 1 tokens, not a page
	 * less; the last token is left to compute. We write that token into
	 * the last page, which others see, so that page is copied on write
	 * (one more frame). The copy counts as unpublished: the commit finds
	 * the cached page by its hash and holds it as the anchor our chain
	 * continues from, or, when the lease was rolled back and other tokens
	 * came at n - 1, publishes the copy under their own hash.
	 */
	whole = hit && (uint64_t)hit * eng->P == n;
	cached = share_prefix_cached(eng, n, hit);
	/* Idle hits are counted evictable now, but they will be ours. */
	ret = seq_plan_frames(eng, id, pages, pages - hit + whole, idle_hits, e);
	if (!ret)
		ret = lease_reserve(eng, e);
	if (!ret)
		ret = lease_group_reserve(eng, e);
	if (!ret)
		ret = engine_view_reserve(eng, (uint32_t)pages, e);
	if (!ret && (seq_table_reserve(&s->seqs) || !(q = seq_new(id, owner)))) {
		ret = errbuf_set(e, -ENOMEM, "out of memory for a sequence");
	} else if (!ret && (seq_reserve_pages(q, pages) ||
			    seq_reserve_tokens(q, n))) {
		seq_free_mem(q);
		ret = errbuf_set(e, -ENOMEM, "out of memory for a sequence");
	}
	if (ret) {
		free(hits);
		return ret;
	}

	/* Commit point. References first, then eviction. */
	eng->st.prefix_lookups++;
	eng->st.prefix_lookup_tokens += n;
	eng->st.prefix_hit_tokens += cached;
	for (uint32_t i = 0; i < hit; i++)
		seq_push_ref(eng, q, hits[i]);
	free(hits);
	evict_for_device(eng, (uint32_t)(pages - hit + whole));
	if (whole)
		seq_cow(eng, q);
	while (q->npages < pages)
		seq_push_ref(eng, q, share_frame_alloc(eng));
	memcpy(q->tokens, tokens, (size_t)n * sizeof(*tokens));
	q->hashable = true;
	q->published = hit - whole;
	q->len = cached;
	q->cached = cached;
	q->n_new = n - cached;
	seq_table_insert(&s->seqs, q);
	l = lease_new(eng, LEASE_SEQ_WRITE, owner, &lid);
	l->seq = q;
	lease_group_attach(eng, l, owner); /* tp > 1: ranks join it */
	q->write_lease = lid;
	eng->st.prepares++;
	eng->st.hit_tokens += q->len;
	seq_lease_out(eng, q, lid, q->len, out);
	return 0;
}

/* ------------------------------------------------------------ extend / free */

static int seq_of_owner(struct engine *eng, uint64_t id, uint32_t owner,
			struct seq **out, struct errbuf *e)
{
	struct seq *q = seq_find(eng, id);

	if (!q)
		return errbuf_set(e, -ENOENT, "sequence %" PRIu64 " does not exist "
				  "(freed, or its client detached)", id);
	if (q->owner != owner)
		return errbuf_set(e, -EPERM, "sequence %" PRIu64 " belongs to client "
				  "%" PRIu32 "; only it may change or free it "
				  "(others may use it as a source)", id, q->owner);
	*out = q;
	return 0;
}

int share_seq_extend(struct engine *eng, uint64_t id, uint32_t n_new,
		     const uint32_t *tokens, uint32_t owner,
		     struct engine_lease *out, struct errbuf *e)
{
	struct lease *l = NULL;
	uint64_t pages, need, lid;
	struct seq *q = NULL;
	bool cow;
	int ret = seq_of_owner(eng, id, owner, &q, e);

	if (ret)
		return ret;
	if (!n_new)
		return errbuf_set(e, -EINVAL, "sequence %" PRIu64 ": extend by 0 "
				  "tokens does nothing", id);
	if (q->write_lease)
		l = lease_lookup(eng, q->write_lease);
	if (l && !l->committed)
		return errbuf_set(e, -EBUSY, "sequence %" PRIu64 ": its write lease "
				  "%#" PRIx64 " has not committed; commit or release "
				  "it first", id, q->write_lease);
	if (q->len + n_new >= (1ull << 40))
		return errbuf_set(e, -EINVAL, "sequence %" PRIu64 ": too long", id);
	ret = seq_check_limits(eng, id, q->len + n_new, false, e);
	if (ret)
		return ret;
	cow = seq_needs_cow(eng, q);
	pages = pages_for(eng, q->len + n_new);
	need = pages - q->npages + cow;
	ret = seq_plan_frames(eng, id, pages, need, 0, e);
	if (!ret)
		ret = lease_reserve(eng, e);
	if (!ret)
		ret = lease_group_reserve(eng, e);
	if (!ret)
		ret = engine_view_reserve(eng, (uint32_t)pages, e);
	if (!ret && (seq_reserve_pages(q, pages) ||
		     (tokens && q->hashable && seq_reserve_tokens(q, q->len + n_new))))
		ret = errbuf_set(e, -ENOMEM, "out of memory for a sequence");
	if (ret)
		return ret;

	/* Commit point. A committed lease still open goes with the new one
	 * (in a tensor-parallel pool for every rank that still held it). */
	if (l)
		lease_release(eng, l);
	evict_for_device(eng, (uint32_t)need);
	if (cow)
		seq_cow(eng, q);
	while (q->npages < pages)
		seq_push_ref(eng, q, share_frame_alloc(eng));
	if (tokens && q->hashable)
		memcpy(q->tokens + q->len, tokens, (size_t)n_new * sizeof(*tokens));
	else
		q->hashable = false;
	q->n_new = n_new;
	l = lease_new(eng, LEASE_SEQ_WRITE, owner, &lid);
	l->seq = q;
	lease_group_attach(eng, l, owner); /* tp > 1: ranks join it */
	q->write_lease = lid;
	eng->st.prepares++;
	seq_lease_out(eng, q, lid, 0, out);
	return 0;
}

void seq_destroy(struct engine *eng, struct seq *q)
{
	seq_truncate(eng, q, 0);
	while (q->nanchors)
		sp_unref(eng, q->anchors[--q->nanchors]);
	while (q->npins) {
		struct seq_pin *p = &q->pins[--q->npins];

		if (p->kind == KVP_SRC_USER) {
			eng->seq_pins--;
			((struct history *)p->obj)->owner->pinned_by_seqs--;
			history_unpin(eng, p->obj);
		} else {
			chunk_unhold(eng, p->obj);
		}
	}
	seq_table_remove(&eng->share->seqs, q);
	seq_free_mem(q);
}

int share_seq_free(struct engine *eng, uint64_t id, uint32_t owner,
		   struct errbuf *e)
{
	struct seq *q = NULL;
	int ret = seq_of_owner(eng, id, owner, &q, e);

	if (ret)
		return ret;
	/* The rule evict follows for a leased history: never take pages from
	 * under a lease its client still holds (issue 11: a free that ended
	 * the lease let the next append land in pages another user owned). */
	if (q->write_lease && lease_lookup(eng, q->write_lease))
		return errbuf_set(e, -EBUSY, "sequence %" PRIu64 ": its write lease "
				  "%#" PRIx64 " is still held; release it "
				  "(kvp_release) before freeing the sequence", id,
				  q->write_lease);
	seq_destroy(eng, q);
	return 0;
}

void share_seq_discard(struct engine *eng, uint64_t id, uint32_t owner)
{
	struct seq *q = NULL;
	struct lease *l;

	if (seq_of_owner(eng, id, owner, &q, NULL))
		return;
	l = q->write_lease ? lease_lookup(eng, q->write_lease) : NULL;
	if (l)
		lease_release(eng, l);
	seq_destroy(eng, q);
}

uint32_t seq_release_owner(struct engine *eng, uint32_t owner)
{
	struct seq *q;
	uint32_t n = 0;

	hashtab_for_each_safe(&eng->share->seqs.ht, q, hnode) {
		if (q->owner != owner)
			continue;
		share_seq_discard(eng, q->id, owner); /* removes q only */
		n++;
	}
	return n;
}

void seq_table_fini(struct engine *eng)
{
	struct seq_table *t = &eng->share->seqs;
	struct seq *q;

	hashtab_for_each_safe(&t->ht, q, hnode)
		seq_destroy(eng, q);
	hashtab_fini(&t->ht);
}

int share_seq_info(struct engine *eng, uint64_t id,
		   struct share_seq_state *out, struct errbuf *e)
{
	struct seq *q = seq_find(eng, id);
	struct kvp_seq_info *in = &out->info;
	int ret;

	if (!q)
		return errbuf_set(e, -ENOENT, "sequence %" PRIu64 " does not exist "
				  "(never made, freed, or its client detached)", id);
	ret = engine_view_reserve(eng, q->npages, e);
	if (ret)
		return ret;
	*in = (struct kvp_seq_info){
		.seq = q->id,
		.tokens = q->len + q->n_new,
		.computed = q->len,
		.cached = q->cached,
		.write_lease = q->write_lease && lease_lookup(eng, q->write_lease) ?
			       q->write_lease : 0,
		.n_new = q->n_new,
		.npages = q->npages,
		.computed_pages = (uint32_t)(q->len / eng->P),
		.published = q->published,
		.owner = q->owner,
		.flags = (q->hashable ? KVP_SEQ_TOKEN_IDS : 0) |
			 (eng->share->no_caching ? 0 : KVP_SEQ_CACHING),
		.ntoken_ids = q->hashable ? (uint32_t)(q->len + q->n_new) : 0,
	};
	for (uint32_t i = 0; i < q->npages; i++) {
		eng->view[i] = q->pages[i].frame;
		in->borrowed += q->pages[i].kind == SP_BORROWED;
	}
	out->frames = eng->view;
	out->tokens = q->hashable ? q->tokens : NULL;
	return 0;
}

int share_seq_read_tokens(struct engine *eng, uint64_t id, uint64_t pos,
			  uint32_t n, void *out, struct errbuf *e)
{
	struct seq *q = seq_find(eng, id);
	unsigned char *dst = out;
	int ret = 0;

	if (!q)
		return errbuf_set(e, -ENOENT, "sequence %" PRIu64 " does not exist",
				  id);
	if (pos > q->len || n > q->len - pos)
		return errbuf_set(e, -ERANGE, "sequence %" PRIu64 ": tokens [%" PRIu64
				  ", %" PRIu64 ") are not all committed", id, pos,
				  pos + n);
	for (uint32_t i = 0; i < n && !ret; i++, dst += eng->layout.token_bytes)
		ret = share_read_token(eng, q->pages[(pos + i) / eng->P].frame,
				       (uint32_t)((pos + i) % eng->P), dst, e);
	return ret;
}

int seq_check(struct engine *eng, uint32_t *refs, struct errbuf *e)
{
	struct seq_table *t = &eng->share->seqs;
	uint64_t pins = 0, count = 0, ref_pages = 0;
	struct seq *q;

	hashtab_for_each_safe(&t->ht, q, hnode) {
		count++;
		if (q->npages != pages_for(eng, q->len + q->n_new))
			return errbuf_set(e, -EFAULT, "sequence %" PRIu64 ": %"
					  PRIu32 " pages for %" PRIu64 " + %"
					  PRIu32 " tokens", q->id, q->npages,
					  q->len, q->n_new);
		for (uint32_t i = 0; i < q->npages; i++) {
			uint32_t f = q->pages[i].frame;

			if (!engine_device_frame_in_use(eng, f))
				return errbuf_set(e, -EFAULT, "sequence %"
						  PRIu64 " page %" PRIu32
						  ": frame %" PRIu32 " is free",
						  q->id, i, f);
			if (q->pages[i].kind == SP_REF) {
				refs[f]++;
				ref_pages++;
			}
		}
		for (uint32_t i = 0; i < q->nanchors; i++)
			refs[q->anchors[i]]++;
		for (uint32_t i = 0; i < q->npins; i++)
			pins += q->pins[i].kind == KVP_SRC_USER;
	}
	if (count != t->ht.count || pins != eng->seq_pins ||
	    ref_pages != eng->share->seq_pages)
		return errbuf_set(e, -EFAULT, "sequences: table counts %" PRIu64
				  " (found %" PRIu64 "), history pins %" PRIu64
				  " (found %" PRIu64 "), pages %" PRIu64 " (found %"
				  PRIu64 ")", t->ht.count, count, eng->seq_pins, pins,
				  eng->share->seq_pages, ref_pages);
	return 0;
}
