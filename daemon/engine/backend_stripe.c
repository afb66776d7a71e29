/* SPDX-License-Identifier: MIT */
/*
 * backend_stripe.c - a tensor-parallel pool's backend: N rank backends
 * behind one backend_ops, so the engine stays oblivious (backend.h).
 *
 * A frame of a TP pool is every rank's page, rank after rank:
 *
 *   logical frame f (page_bytes = N * rank_page_bytes):
 *     [rank 0's page][rank 1's page]...[rank N-1's page]
 *
 * The host tier holds frames so (rank 0's backend allocates it whole:
 * on cuda, portable pinned memory every GPU may copy to). The device tier
 * is striped: rank r's backend (its GPU, or a memfd on shm) holds rank r's
 * page of every frame, frame f at f * rank_page_bytes of rank r's
 * allocation, so rank r's client maps a pool of rank pages and addresses
 * it with the rank layout (kv_heads / N) and the frame indices every rank
 * shares.
 *
 * The device tier this backend hands the engine is not host-visible; its
 * base is an opaque handle (struct stripe_mem) the engine only passes
 * back. Copies name whole frames on the device side (copy.c's runs are
 * multiples of page_bytes), and are split here per rank: frame j of a run
 * becomes, on rank r, rank_page_bytes between device offset
 * (f + j) * rank_page_bytes and host offset (h + j) * page_bytes +
 * r * rank_page_bytes. Device to device: per rank, offsets and sizes / N.
 *
 * Fences and tickets. One stripe number maps to the N rank numbers it was
 * made of (a ring of records under a mutex); it has landed when every rank
 * number has. Stripe numbers are handed out in order under the mutex, and
 * each rank's land in order, so stripe numbers land in order too
 * (backend.h's promise). A number whose record was reused (more than
 * STRIPE_RING later ones were made) is answered by the record that took
 * its place: a later number, landed only after it, so the answer is late,
 * never early. When every rank answers 0 (shm: landed already), so does
 * the stripe: the engine then times the copy itself, as on shm.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#define STRIPE_RING 4096u       /* fence / ticket records kept */
#define STRIPE_RUNS 256u        /* rank runs per call to a rank backend */

struct stripe_rec {
	uint64_t seq;                   /* the stripe number, 0: unused */
	uint64_t rank[BACKEND_STRIPE_MAX];
};

struct stripe_numbers {
	uint64_t next;                  /* the last number handed out */
	struct stripe_rec ring[STRIPE_RING];
};

/* A device tier: one allocation per rank. */
struct stripe_mem {
	struct tier_mem rank[BACKEND_STRIPE_MAX];
	struct stripe_mem *next;        /* the context's list */
};

struct stripe {
	uint32_t n;
	uint64_t rpb;                   /* rank_page_bytes */
	uint64_t pb;                    /* n * rpb: the engine's page_bytes */
	const struct backend_ops *ops[BACKEND_STRIPE_MAX];
	void *ctx[BACKEND_STRIPE_MAX];
	pthread_mutex_t lock;           /* fences, tickets, mems */
	struct stripe_numbers fences, tickets;
	struct stripe_mem *mems;
};

/* ------------------------------------------------------------ numbers */

/* Record one stripe number for rank numbers r[]; 0 when all are 0. */
static uint64_t num_make(struct stripe *s, struct stripe_numbers *t,
			 const uint64_t *r)
{
	struct stripe_rec *rec;
	uint64_t seq;
	bool any = false;

	for (uint32_t i = 0; i < s->n; i++)
		any |= r[i] != 0;
	if (!any)
		return 0;
	pthread_mutex_lock(&s->lock);
	seq = ++t->next;
	rec = &t->ring[seq % STRIPE_RING];
	rec->seq = seq;
	memcpy(rec->rank, r, s->n * sizeof(r[0]));
	pthread_mutex_unlock(&s->lock);
	return seq;
}

/* The rank numbers of stripe number seq (or of the later one that reused
 * its record: see the top comment). */
static void num_get(struct stripe *s, struct stripe_numbers *t, uint64_t seq,
		    uint64_t *r)
{
	pthread_mutex_lock(&s->lock);
	memcpy(r, t->ring[seq % STRIPE_RING].rank, s->n * sizeof(r[0]));
	pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------ memory */

static bool is_stripe_mem(struct stripe *s, const struct tier_mem *m)
{
	bool found = false;

	pthread_mutex_lock(&s->lock);
	for (struct stripe_mem *sm = s->mems; sm && !found; sm = sm->next)
		found = sm == m->base;
	pthread_mutex_unlock(&s->lock);
	return found;
}

static int stripe_tier_alloc(void *ctx, enum kvp_tier tier, uint64_t bytes,
			     struct tier_mem *out, struct errbuf *e)
{
	struct stripe *s = ctx;
	struct stripe_mem *sm;
	uint64_t frames = bytes / s->pb;
	int ret = 0;

	if (tier == KVP_TIER_HOST)
		return s->ops[0]->tier_alloc(s->ctx[0], tier, bytes, out, e);
	if (!frames || bytes % s->pb)
		return errbuf_set(e, -EINVAL, "tensor-parallel device tier of %"
				  PRIu64 " bytes: not whole frames of %" PRIu64
				  " bytes (%" PRIu32 " ranks of %" PRIu64 ")", bytes,
				  s->pb, s->n, s->rpb);
	sm = calloc(1, sizeof(*sm));
	if (!sm)
		return errbuf_set(e, -ENOMEM, "out of memory for a striped tier");
	for (uint32_t r = 0; r < s->n; r++)
		sm->rank[r].fd = -1;
	for (uint32_t r = 0; r < s->n && !ret; r++) {
		ret = s->ops[r]->tier_alloc(s->ctx[r], tier, frames * s->rpb,
					    &sm->rank[r], e);
		if (ret) {
			while (r--)
				s->ops[r]->tier_free(s->ctx[r], &sm->rank[r]);
			free(sm);
			return ret;
		}
	}
	pthread_mutex_lock(&s->lock);
	sm->next = s->mems;
	s->mems = sm;
	pthread_mutex_unlock(&s->lock);
	*out = (struct tier_mem){ .base = sm, .host_visible = false,
				  .bytes = bytes, .fd = sm->rank[0].fd };
	return 0;
}

static void stripe_tier_free(void *ctx, struct tier_mem *m)
{
	struct stripe *s = ctx;
	struct stripe_mem *sm = m->base, **pp;

	if (!is_stripe_mem(s, m)) {
		s->ops[0]->tier_free(s->ctx[0], m);
		return;
	}
	pthread_mutex_lock(&s->lock);
	for (pp = &s->mems; *pp && *pp != sm; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = sm->next;
	pthread_mutex_unlock(&s->lock);
	for (uint32_t r = 0; r < s->n; r++)
		s->ops[r]->tier_free(s->ctx[r], &sm->rank[r]);
	free(sm);
	m->base = NULL;
	m->fd = -1;
}

/* ------------------------------------------------------------ copies */

/*
 * Walks the rank runs of logical runs, STRIPE_RUNS at a time, for one
 * rank: each batch goes to emit(). The device side must be whole frames.
 */
struct split {
	struct stripe *s;
	enum copy_dir dir;
	uint32_t r;
	struct copy_run out[STRIPE_RUNS];
	uint32_t n;
};

static int runs_check(const struct stripe *s, enum copy_dir dir,
		      const struct copy_run *runs, uint32_t n, struct errbuf *e)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct copy_run *c = &runs[i];
		uint64_t dev = dir == COPY_H2D ? c->dst_off : c->src_off;

		if (dev % s->pb || c->bytes % s->pb ||
		    (dir == COPY_D2D && c->dst_off % s->pb))
			return errbuf_set(e, -EINVAL, "striped copy: run %" PRIu32
					  " (%" PRIu64 " bytes, %" PRIu64 " -> %"
					  PRIu64 ") is not whole frames of %" PRIu64
					  " bytes", i, c->bytes, c->src_off,
					  c->dst_off, s->pb);
	}
	return 0;
}

/* Rank r's runs of logical run c, appended to sp->out through push(). */
typedef int (*flush_fn)(struct split *sp, void *arg);

static int split_push(struct split *sp, uint64_t dst, uint64_t src,
		      uint64_t bytes, flush_fn flush, void *arg)
{
	struct copy_run *last = sp->n ? &sp->out[sp->n - 1] : NULL;
	int ret;

	if (last && last->dst_off + last->bytes == dst &&
	    last->src_off + last->bytes == src) {
		last->bytes += bytes;
		return 0;
	}
	if (sp->n == STRIPE_RUNS) {
		ret = flush(sp, arg);
		sp->n = 0;
		if (ret)
			return ret;
	}
	sp->out[sp->n++] = (struct copy_run){ .dst_off = dst, .src_off = src,
					      .bytes = bytes };
	return 0;
}

static int split_rank(struct split *sp, const struct copy_run *runs, uint32_t n,
		      flush_fn flush, void *arg)
{
	const struct stripe *s = sp->s;
	uint64_t rpb = s->rpb, pb = s->pb, off = sp->r * rpb;
	int ret = 0;

	sp->n = 0;
	for (uint32_t i = 0; i < n && !ret; i++) {
		const struct copy_run *c = &runs[i];
		uint64_t frames = c->bytes / pb;

		if (sp->dir == COPY_D2D) {
			ret = split_push(sp, c->dst_off / s->n, c->src_off / s->n,
					 c->bytes / s->n, flush, arg);
			continue;
		}
		for (uint64_t j = 0; j < frames && !ret; j++) {
			uint64_t host, dev;

			if (sp->dir == COPY_D2H) {
				dev = c->src_off / s->n + j * rpb;
				host = c->dst_off + j * pb + off;
				ret = split_push(sp, host, dev, rpb, flush, arg);
			} else {
				dev = c->dst_off / s->n + j * rpb;
				host = c->src_off + j * pb + off;
				ret = split_push(sp, dev, host, rpb, flush, arg);
			}
		}
	}
	if (!ret && sp->n)
		ret = flush(sp, arg);
	sp->n = 0;
	return ret;
}

/* The rank's views of dst and src: a stripe_mem's rank allocation, or the
 * host tier as it is. */
static const struct tier_mem *rank_mem(const struct tier_mem *m, bool device,
				       uint32_t r)
{
	return device ? &((const struct stripe_mem *)m->base)->rank[r] : m;
}

struct call {
	const struct tier_mem *dst, *src;
	struct errbuf *e;
	uint64_t num;                   /* the rank's last fence / ticket */
	int mode;                       /* 0 copy, 1 copy_async, 2 copy_start */
};

static int flush_call(struct split *sp, void *arg)
{
	struct call *c = arg;
	struct stripe *s = sp->s;
	uint32_t r = sp->r;
	uint64_t num = 0;
	int ret;

	if (c->mode == 0)
		return s->ops[r]->copy(s->ctx[r], sp->dir, c->dst, c->src, sp->out,
				       sp->n, c->e);
	if (c->mode == 1)
		ret = s->ops[r]->copy_async(s->ctx[r], sp->dir, c->dst, c->src,
					    sp->out, sp->n, &num, c->e);
	else
		ret = s->ops[r]->copy_start(s->ctx[r], c->dst, c->src, sp->out,
					    sp->n, &num, c->e);
	if (num > c->num)
		c->num = num;
	return ret;
}

/* Every rank's share of runs; nums[r] gets each rank's last number. On an
 * error, what was enqueued has landed before it returns (backend.h: an
 * error leaves nothing in flight). */
static int stripe_run(struct stripe *s, int mode, enum copy_dir dir,
		      const struct tier_mem *dst, const struct tier_mem *src,
		      const struct copy_run *runs, uint32_t n, uint64_t *nums,
		      struct errbuf *e)
{
	struct split *sp;
	int ret;

	ret = runs_check(s, dir, runs, n, e);
	if (ret)
		return ret;
	sp = malloc(sizeof(*sp));
	if (!sp)
		return errbuf_set(e, -ENOMEM, "out of memory for a striped copy");
	memset(nums, 0, s->n * sizeof(nums[0]));
	for (uint32_t r = 0; r < s->n; r++) {
		struct call c = {
			.dst = rank_mem(dst, dir != COPY_D2H, r),
			.src = rank_mem(src, dir != COPY_H2D, r),
			.e = e, .mode = mode,
		};

		*sp = (struct split){ .s = s, .dir = dir, .r = r };
		ret = split_rank(sp, runs, n, flush_call, &c);
		nums[r] = c.num;
		if (ret) {
			for (uint32_t q = 0; q <= r; q++) {
				if (!nums[q])
					continue;
				if (mode == 2)
					s->ops[q]->copy_wait(s->ctx[q], nums[q]);
				else
					s->ops[q]->fence_wait(s->ctx[q], nums[q]);
			}
			break;
		}
	}
	free(sp);
	return ret;
}

static int stripe_copy(void *ctx, enum copy_dir dir, const struct tier_mem *dst,
		       const struct tier_mem *src, const struct copy_run *runs,
		       uint32_t n, struct errbuf *e)
{
	uint64_t nums[BACKEND_STRIPE_MAX];

	return stripe_run(ctx, 0, dir, dst, src, runs, n, nums, e);
}

static int stripe_copy_async(void *ctx, enum copy_dir dir,
			     const struct tier_mem *dst, const struct tier_mem *src,
			     const struct copy_run *runs, uint32_t n,
			     uint64_t *fence, struct errbuf *e)
{
	struct stripe *s = ctx;
	uint64_t nums[BACKEND_STRIPE_MAX];
	int ret = stripe_run(s, 1, dir, dst, src, runs, n, nums, e);

	*fence = ret ? 0 : num_make(s, &s->fences, nums);
	return ret;
}

static int stripe_copy_start(void *ctx, const struct tier_mem *dst,
			     const struct tier_mem *src,
			     const struct copy_run *runs, uint32_t n,
			     uint64_t *ticket, struct errbuf *e)
{
	struct stripe *s = ctx;
	uint64_t nums[BACKEND_STRIPE_MAX];
	int ret = stripe_run(s, 2, COPY_D2H, dst, src, runs, n, nums, e);

	*ticket = ret ? 0 : num_make(s, &s->tickets, nums);
	return ret;
}

/* Every rank's ticket waited for, even after one failed: none is left in
 * flight. */
static int stripe_copy_wait(void *ctx, uint64_t ticket)
{
	struct stripe *s = ctx;
	uint64_t nums[BACKEND_STRIPE_MAX];
	int ret = 0;

	if (!ticket)
		return 0;
	num_get(s, &s->tickets, ticket, nums);
	for (uint32_t r = 0; r < s->n; r++) {
		int err = nums[r] ? s->ops[r]->copy_wait(s->ctx[r], nums[r]) : 0;

		if (err && !ret)
			ret = err;
	}
	return ret;
}

static int stripe_fence_done(void *ctx, uint64_t fence)
{
	struct stripe *s = ctx;
	uint64_t nums[BACKEND_STRIPE_MAX];

	if (!fence)
		return 1;
	num_get(s, &s->fences, fence, nums);
	for (uint32_t r = 0; r < s->n; r++)
		if (nums[r] && !s->ops[r]->fence_done(s->ctx[r], nums[r]))
			return 0;
	return 1;
}

static void stripe_fence_wait(void *ctx, uint64_t fence)
{
	struct stripe *s = ctx;
	uint64_t nums[BACKEND_STRIPE_MAX];

	if (!fence)
		return;
	num_get(s, &s->fences, fence, nums);
	for (uint32_t r = 0; r < s->n; r++)
		if (nums[r])
			s->ops[r]->fence_wait(s->ctx[r], nums[r]);
}

/* The slowest rank's device time; 0 when a rank does not know it. */
static uint64_t stripe_fence_ns(void *ctx, uint64_t first, uint64_t last)
{
	struct stripe *s = ctx;
	uint64_t a[BACKEND_STRIPE_MAX], b[BACKEND_STRIPE_MAX], ns = 0;

	num_get(s, &s->fences, first, a);
	num_get(s, &s->fences, last, b);
	for (uint32_t r = 0; r < s->n; r++) {
		uint64_t x;

		if (!a[r] || !b[r] || !s->ops[r]->fence_ns)
			continue;
		x = s->ops[r]->fence_ns(s->ctx[r], a[r], b[r]);
		if (x > ns)
			ns = x;
	}
	return ns;
}

/*
 * Bytes [off, off + bytes) of the logical tier: of the host tier as they
 * are; of the striped device tier gathered from each rank's page of each
 * frame they cross.
 */
static int stripe_read(void *ctx, const struct tier_mem *m, uint64_t off,
		       void *dst, uint64_t bytes, struct errbuf *e)
{
	struct stripe *s = ctx;
	const struct stripe_mem *sm = m->base;
	char *out = dst;

	if (!is_stripe_mem(s, m))
		return s->ops[0]->read(s->ctx[0], m, off, dst, bytes, e);
	if (off > m->bytes || bytes > m->bytes - off)
		return errbuf_set(e, -ERANGE, "read of %" PRIu64 " bytes at %" PRIu64
				  " is outside the %" PRIu64 "-byte tier", bytes,
				  off, m->bytes);
	while (bytes) {
		uint64_t f = off / s->pb, in = off % s->pb;
		uint32_t r = (uint32_t)(in / s->rpb);
		uint64_t at = in % s->rpb, k = s->rpb - at;
		int ret;

		if (k > bytes)
			k = bytes;
		ret = s->ops[r]->read(s->ctx[r], &sm->rank[r], f * s->rpb + at,
				      out, k, e);
		if (ret)
			return ret;
		out += k;
		off += k;
		bytes -= k;
	}
	return 0;
}

/*
 * backend_ops.copy_peer (a move between pools, engine_move.h): another
 * striped pool's device tier (src_ctx: the same ranks and rank page size)
 * into this one's, rank r to rank r, with the device-to-device split (per
 * rank, offsets and sizes / n). Each rank copies through its backend's
 * copy_peer (cuda: peer to peer, GPU r of one pool to GPU r of the other),
 * or with memcpy where both rank tiers are host-visible (shm).
 */
struct peer_call {
	const struct tier_mem *dst, *src;
	void *src_ctx;
	struct errbuf *e;
};

static int flush_peer(struct split *sp, void *arg)
{
	struct peer_call *c = arg;
	struct stripe *s = sp->s;
	uint32_t r = sp->r;

	if (c->dst->host_visible && c->src->host_visible) {
		for (uint32_t i = 0; i < sp->n; i++)
			memcpy((char *)c->dst->base + sp->out[i].dst_off,
			       (const char *)c->src->base + sp->out[i].src_off,
			       sp->out[i].bytes);
		return 0;
	}
	if (!s->ops[r]->copy_peer)
		return errbuf_set(c->e, -EOPNOTSUPP, "striped move: the %s backend "
				  "of rank %" PRIu32 " cannot copy between pools",
				  s->ops[r]->name, r);
	return s->ops[r]->copy_peer(s->ctx[r], c->dst, c->src_ctx, c->src, sp->out,
				    sp->n, c->e);
}

static int stripe_copy_peer(void *ctx, const struct tier_mem *dst, void *src_ctx,
			    const struct tier_mem *src, const struct copy_run *runs,
			    uint32_t n, struct errbuf *e)
{
	struct stripe *s = ctx, *o = src_ctx;
	const struct stripe_mem *dm, *sm;
	struct split *sp;
	int ret = 0;

	if (!o || o->n != s->n || o->rpb != s->rpb)
		return errbuf_set(e, -EINVAL, "striped move: both pools need the "
				  "same ranks and page size (tp %" PRIu32 ", %" PRIu64
				  " bytes a rank page here)", s->n, s->rpb);
	if (!is_stripe_mem(s, dst) || !is_stripe_mem(o, src))
		return errbuf_set(e, -EINVAL, "striped move: copies device tier to "
				  "device tier (a host tier is the engine's memcpy)");
	ret = runs_check(s, COPY_D2D, runs, n, e);
	if (ret)
		return ret;
	sp = malloc(sizeof(*sp));
	if (!sp)
		return errbuf_set(e, -ENOMEM, "out of memory for a striped move");
	dm = dst->base;
	sm = src->base;
	for (uint32_t r = 0; r < s->n && !ret; r++) {
		struct peer_call c = { .dst = &dm->rank[r], .src = &sm->rank[r],
				       .src_ctx = o->ctx[r], .e = e };

		*sp = (struct split){ .s = s, .dir = COPY_D2D, .r = r };
		ret = split_rank(sp, runs, n, flush_peer, &c);
	}
	free(sp);
	return ret;
}

const struct backend_ops backend_stripe = {
	.name = "stripe",
	.tier_alloc = stripe_tier_alloc,
	.tier_free = stripe_tier_free,
	.copy = stripe_copy,
	.copy_async = stripe_copy_async,
	.copy_start = stripe_copy_start,
	.copy_wait = stripe_copy_wait,
	.fence_done = stripe_fence_done,
	.fence_wait = stripe_fence_wait,
	.fence_ns = stripe_fence_ns,
	.read = stripe_read,
	.copy_peer = stripe_copy_peer,
};

/* ------------------------------------------------------------ open */

int backend_stripe_open(const struct backend_ops *rank_ops,
			void *const *rank_ctx, uint32_t n,
			uint64_t rank_page_bytes, void **ctx, struct errbuf *e)
{
	struct stripe *s;

	if (n < 2 || n > BACKEND_STRIPE_MAX || !rank_page_bytes)
		return errbuf_set(e, -EINVAL, "a striped pool of %" PRIu32 " ranks "
				  "of %" PRIu64 "-byte pages: use 2 to %u ranks",
				  n, rank_page_bytes, BACKEND_STRIPE_MAX);
	s = calloc(1, sizeof(*s));
	if (!s)
		return errbuf_set(e, -ENOMEM, "out of memory for a striped pool");
	s->n = n;
	s->rpb = rank_page_bytes;
	s->pb = n * rank_page_bytes;
	for (uint32_t r = 0; r < n; r++) {
		s->ops[r] = rank_ops;
		s->ctx[r] = rank_ctx ? rank_ctx[r] : NULL;
	}
	pthread_mutex_init(&s->lock, NULL);
	*ctx = s;
	return 0;
}

void backend_stripe_close(void *ctx)
{
	struct stripe *s = ctx;

	if (!s)
		return;
	pthread_mutex_destroy(&s->lock);
	free(s);
}

int backend_stripe_fd(void *ctx, const struct tier_mem *m, uint32_t rank,
		      uint64_t *bytes)
{
	struct stripe *s = ctx;
	const struct stripe_mem *sm = m->base;

	if (rank >= s->n || !is_stripe_mem(s, m))
		return -EINVAL;
	*bytes = sm->rank[rank].bytes;
	return sm->rank[rank].fd;
}
