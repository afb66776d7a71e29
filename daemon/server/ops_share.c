/* SPDX-License-Identifier: MIT */
/*
 * ops_share.c - the sharing operations: prefix lookup, sequences and
 * compositions (proto.h, "sharing (v3)"), each a thin layer between a
 * checked submission and the engine's share_* call (share.h); chunks are
 * ops_chunk.c's, on the helpers here.
 *
 * Every operation here follows the same three steps, in this order:
 *   1. op_input() copies the input out of the client's arena ONCE into the
 *      worker's private scratch (the client may rewrite its arena at any
 *      moment; nothing below ever reads the arena again);
 *   2. the copy is validated: lengths exactly what the counts say (computed
 *      in 64 bits, so no count can wrap them), strings NUL-terminated where
 *      they claim to end, token counts within SHARE_MAX_TOKENS, reserved
 *      words zero; the result range is checked where its size is known
 *      before the call;
 *   3. the engine is called under the tenant pool's mutex (owner = client
 *      id, time = CLOCK_REALTIME), and its results, which point into engine
 *      memory valid until the next engine call, are copied to the result
 *      range before the mutex is let go.
 * A result that turns out not to fit after the engine made something (a
 * lease, a sequence) undoes it before the error goes back, so a failed
 * operation still changes nothing.
 *
 * Waiting for a seal is the client's business: CHUNK_ACQUIRE of a chunk
 * being filled completes at once with -EAGAIN and libkvpool retries with a
 * short sleep until its wait_ms runs out (kvp_chunk_acquire). A worker
 * never blocks and never parks on another client's progress: a filler that
 * never seals cannot stall anyone but the clients asking for its chunk.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "ops_internal.h"
#include "kvpool_engine.h"

/* Tokens one register, seq_alloc, extend or lookup may carry (a 4 MiB input). */
#define SHARE_MAX_TOKENS (1u << 20)
/* Sources one virtual sequence may have. */
#define SHARE_MAX_SOURCES 4096u

uint64_t op_now_ns(void)
{
	return real_ns();
}

/*
 * Copy the input range into private scratch, with extra bytes after it
 * (8-byte aligned) for results built privately. *in gets the copy, *priv
 * (may be NULL) the extra room.
 */
int op_input(struct op *o, size_t extra, const unsigned char **in,
		    void **priv)
{
	const struct kvp_sqe *q = o->sqe;
	size_t head = ((size_t)q->in_len + 7) & ~(size_t)7;
	unsigned char *buf;

	if (!o->in_base)
		return errbuf_set(o->e, -EINVAL, "%s: the uds request mode carries "
				  "no input; submit it on the ring", o->name);
	/* Overflow-safe, like the result range. */
	if (q->in_len > o->in_cap || q->in_off > o->in_cap - q->in_len)
		return errbuf_set(o->e, -EINVAL, "%s: input range [%" PRIu32 ", +%"
				  PRIu32 ") is outside the %" PRIu32 "-byte arena",
				  o->name, q->in_off, q->in_len, o->in_cap);
	buf = op_scratch_get(o->scr, head + extra + 8);
	if (!buf)
		return errbuf_set(o->e, -ENOMEM, "%s: out of memory for a %" PRIu32
				  "-byte input", o->name, q->in_len);
	memcpy(buf, o->in_base + q->in_off, q->in_len);
	*in = buf;
	if (priv)
		*priv = buf + head;
	return 0;
}

/*
 * op_input() for inputs that start with a fixed header: checks in_len can
 * hold it, copies the input out once and the header out of that copy.
 */
int op_input_header(struct op *o, void *hdr, size_t hsize, size_t extra,
			   const unsigned char **in, void **priv)
{
	int ret;

	if (o->sqe->in_len < hsize)
		return errbuf_set(o->e, -EINVAL, "%s: the input starts with a %zu-byte "
				  "header; in_len is %" PRIu32, o->name, hsize,
				  o->sqe->in_len);
	ret = op_input(o, extra, in, priv);
	if (!ret)
		memcpy(hdr, *in, hsize);
	return ret;
}

/* in_len holds exactly n token ids. */
static int check_tokens(struct op *o, uint32_t n, bool may_be_empty)
{
	const struct kvp_sqe *q = o->sqe;

	if (n > SHARE_MAX_TOKENS)
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " tokens; at most %u "
				  "in one call, split it", o->name, n, SHARE_MAX_TOKENS);
	if (!n && !may_be_empty)
		return errbuf_set(o->e, -EINVAL, "%s: no tokens; give at least one",
				  o->name);
	if (q->in_len % sizeof(uint32_t) || q->in_len / sizeof(uint32_t) != n)
		return errbuf_set(o->e, -EINVAL, "%s: n says %" PRIu32 " tokens but "
				  "in_len is %" PRIu32 " bytes (want %" PRIu64 ")",
				  o->name, n, q->in_len, (uint64_t)n * 4);
	return 0;
}

/* in_len is exactly one chunk id; *id gets the copy. */
int op_input_id(struct op *o, struct kvp_chunk_id *id)
{
	const unsigned char *in = NULL;
	int ret;

	if (o->sqe->in_len != sizeof(*id))
		return errbuf_set(o->e, -EINVAL, "%s: the input is one %zu-byte chunk "
				  "id; in_len is %" PRIu32, o->name, sizeof(*id),
				  o->sqe->in_len);
	ret = op_input(o, 0, &in, NULL);
	if (!ret)
		memcpy(id, in, sizeof(*id));
	return ret;
}

/* Pages a fresh span of n tokens takes. */
uint64_t op_span_pages(struct op *o, uint64_t n)
{
	uint32_t P = o->s->cfg->layout.page_tokens;

	return (n + P - 1) / P;
}

/* The result room a lease of up to pages page-table entries needs at off. */
int op_lease_room(struct op *o, size_t off, uint64_t pages)
{
	const size_t hdr = sizeof(struct kvp_prepare_out);

	if (o->out_len >= off + hdr &&
	    pages <= (o->out_len - off - hdr) / sizeof(int32_t))
		return 0;
	return errbuf_set(o->e, -EMSGSIZE, "%s: the result needs %zu + 4 bytes per "
			  "page for %" PRIu64 " pages but out_len is %" PRIu32
			  "; raise out_len (and arena_bytes)", o->name, off + hdr,
			  pages, o->out_len);
}

/*
 * Write lease l as a kvp_prepare_out and its frames at out + off; call it
 * with the pool locked (l->frames is engine memory). -EMSGSIZE when it does
 * not fit: nothing written, the caller undoes the lease.
 */
int op_put_lease(struct op *o, size_t off, const struct engine_lease *l)
{
	struct kvp_prepare_out po = {
		.lease = l->id, .start = l->start, .len = l->len, .n_new = l->n_new,
		.npages = l->npages, .last_page_len = l->last_page_len,
		.onloaded_pages = l->onloaded_pages,
	};
	int ret = op_lease_room(o, off, l->npages);

	if (ret)
		return ret;
	memcpy(o->out + off, &po, sizeof(po));
	if (l->npages) /* an empty table may be NULL (no view grown yet) */
		memcpy(o->out + off + sizeof(po), l->frames,
		       (size_t)l->npages * sizeof(int32_t));
	o->cqe->out_bytes = (uint32_t)(off + sizeof(po) +
				       (size_t)l->npages * sizeof(int32_t));
	o->cqe->val0 = l->id;
	o->cqe->val1 = l->npages;
	return 0;
}

/*
 * A lease whose pages are still being onloaded (a USER source of
 * SEQ_CREATE): park the completion like a prepare's (ops.c), or, with
 * nowhere to park it, have the caller wait once the pool is unlocked.
 */
static uint64_t lease_fence(struct op *o, struct engine *eng,
			    const struct engine_lease *l)
{
	if (l->fence && o->wait) {
		*o->wait = (struct op_wait){ .eng = eng, .fence = l->fence };
		return 0;
	}
	return l->fence;
}

/* ops_internal.h. The wait is taken whatever ret is, so none recorded by
 * a call that went on to answer otherwise is left for the next. */
bool op_wait_again(struct op *o, int ret)
{
	enum engine_wait why = engine_wait_take();

	if (ret != -EINPROGRESS)
		return false;
	if (o->wait) {
		o->wait->retry = true;
		o->wait->why = why;
		return false;
	}
	/* Nowhere to hold it (every worker path holds; ops.h): answered as
	 * waiting, never slept on here, where a worker would stop serving. */
	errbuf_set(o->e, -EINPROGRESS, "%s waits for %s; try again", o->name,
		   engine_wait_name(why));
	return false;
}

/* ------------------------------------------------------------ prefix cache */

int op_prefix_lookup(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct share_prefix_hit hit;
	struct kvp_prefix_out po;
	const unsigned char *in = NULL;
	struct engine *eng;
	uint64_t room;
	int ret;

	if ((ret = check_tokens(o, q->n, true)))
		return ret;
	/* At most n / P pages can hit: the room is known before the call. */
	room = q->n / o->s->cfg->layout.page_tokens;
	if (o->out_len < sizeof(po) || room > (o->out_len - sizeof(po)) / 4)
		return errbuf_set(o->e, -EMSGSIZE, "%s: the result may need %zu + 4 "
				  "bytes per page for %" PRIu64 " pages; out_len is %"
				  PRIu32, o->name, sizeof(po), room, o->out_len);
	if ((ret = op_input(o, 0, &in, NULL)))
		return ret;
	do {
		eng = op_lock_own(o);
		ret = share_prefix_find(eng, (const uint32_t *)in, q->n, &hit);
		po = (struct kvp_prefix_out){ .tokens = hit.tokens,
					      .npages = hit.npages };
		if (!ret && hit.npages <= room) {
			memcpy(o->out, &po, sizeof(po));
			if (hit.npages) /* none found: frames may be NULL */
				memcpy(o->out + sizeof(po), hit.frames,
				       (size_t)hit.npages * 4);
		}
		op_unlock_own(o);
	} while (op_wait_again(o, ret));
	if (ret)
		return errbuf_set(o->e, ret, "%s: its cached pages are being read "
				  "back from the disk or remote tier", o->name);
	if (hit.npages > room)
		return errbuf_set(o->e, -EPROTO, "%s: the engine reported %" PRIu32
				  " cached pages for %" PRIu32 " tokens", o->name,
				  hit.npages, q->n);
	o->cqe->out_bytes = (uint32_t)(sizeof(po) + (size_t)hit.npages * 4);
	o->cqe->val0 = hit.tokens;
	return (int)hit.tokens;
}

/* ------------------------------------------------------------ sequences */

/* A tensor-parallel pool's sequences are rank 0's: it allocates, creates
 * and extends them, the other ranks join each write lease (engine.h,
 * sequence write leases as group leases), so every rank's slice holds the
 * same frames. */
static int refuse_seq_rank(struct op *o)
{
	if (!o->c->rank)
		return 0;
	return errbuf_set(o->e, -EINVAL, "%s: sequence %" PRIu64 ": rank %" PRIu32
			  " of a tensor-parallel pool: rank 0 allocates, creates "
			  "and extends sequences; join its write lease with "
			  "kvp_lease_join", o->name, o->sqe->arg, o->c->rank);
}

int op_seq_alloc(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	const unsigned char *in = NULL;
	struct engine_lease l;
	struct engine *eng;
	int ret;

	if ((ret = refuse_seq_rank(o)) ||
	    (ret = check_tokens(o, q->n, false)) ||
	    (ret = op_lease_room(o, 0, op_span_pages(o, q->n))) ||
	    (ret = op_input(o, 0, &in, NULL)))
		return ret;
	do {
		eng = op_lock_own(o);
		ret = share_seq_alloc(eng, q->arg, (const uint32_t *)in, q->n,
				      o->c->id, &l, o->e);
		if (!ret && (ret = op_put_lease(o, 0, &l)))
			share_seq_discard(eng, q->arg, o->c->id);
		op_unlock_own(o);
	} while (op_wait_again(o, ret));
	/* Seed 004's line, with the client it came from (log_level=debug).
	 * The seed writes it only with caching on; a hit is 0 without. */
	if (!ret)
		log_debug("kv_cache request=%" PRIu64 " prompt_tokens=%" PRIu32
			  " cached_tokens=%" PRIu64 " new_tokens=%" PRIu32
			  " blocks=%" PRIu32 " client=%" PRIu32 " pid=%" PRIu32,
			  q->arg, q->n, l.len, l.n_new, l.npages, o->c->id,
			  o->c->pid);
	return ret;
}

int op_seq_create(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct kvp_seq_create_in h;
	const struct kvp_seq_src *src;
	const unsigned char *in = NULL;
	struct engine_lease l;
	struct engine *eng;
	uint64_t fence = 0;
	int ret;

	if ((ret = refuse_seq_rank(o)))
		return ret;
	if (q->n > SHARE_MAX_TOKENS)
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " new tokens; at most %u",
				  o->name, q->n, SHARE_MAX_TOKENS);
	if ((ret = op_input_header(o, &h, sizeof(h), 0, &in, NULL)))
		return ret;
	if (h.rsv)
		return errbuf_set(o->e, -EINVAL, "%s: reserved fields must be zero",
				  o->name);
	if (h.nsrc > SHARE_MAX_SOURCES ||
	    q->in_len != sizeof(h) + (uint64_t)h.nsrc * sizeof(*src))
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " sources (at most %u) "
				  "need in_len %" PRIu64 "; it is %" PRIu32, o->name,
				  h.nsrc, SHARE_MAX_SOURCES,
				  sizeof(h) + (uint64_t)h.nsrc * sizeof(*src), q->in_len);
	/* 8-byte aligned: the scratch is malloc'ed and the header is 8 bytes. */
	src = (const struct kvp_seq_src *)(in + sizeof(h));
	for (uint32_t i = 0; i < h.nsrc; i++) {
		if (src[i].kind < KVP_SRC_USER || src[i].kind > KVP_SRC_SEQ)
			return errbuf_set(o->e, -EINVAL, "%s: source %" PRIu32 " has kind "
					  "%" PRIu32 "; use 1 (user), 2 (chunk) or 3 "
					  "(sequence)", o->name, i, src[i].kind);
		if (src[i].rsv)
			return errbuf_set(o->e, -EINVAL, "%s: source %" PRIu32 ": reserved "
					  "fields must be zero", o->name, i);
	}
	do {
		eng = op_lock_own(o);
		ret = share_seq_create(eng, q->arg, src, h.nsrc, q->n, o->c->id, &l,
				       o->e);
		if (!ret && (ret = op_put_lease(o, 0, &l)))
			share_seq_discard(eng, q->arg, o->c->id);
		if (!ret)
			fence = lease_fence(o, eng, &l);
		op_unlock_own(o);
	} while (op_wait_again(o, ret));
	if (fence)
		engine_fence_wait(eng, fence);
	return ret;
}

int op_seq_extend(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	const unsigned char *in = NULL;
	struct engine_lease l;
	struct engine *eng;
	int ret;

	if ((ret = refuse_seq_rank(o)))
		return ret;
	/* The token ids are optional: in_len 0, or exactly n ids. */
	if ((ret = check_tokens(o, q->in_len ? q->n : 0, true)))
		return ret;
	if (q->n > SHARE_MAX_TOKENS)
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " new tokens; at most %u",
				  o->name, q->n, SHARE_MAX_TOKENS);
	if (q->in_len && (ret = op_input(o, 0, &in, NULL)))
		return ret;
	eng = op_lock_own(o);
	ret = share_seq_extend(eng, q->arg, q->n, (const uint32_t *)in, o->c->id,
			       &l, o->e);
	/* Releasing the write lease gives the reserved slots back. */
	if (!ret && (ret = op_put_lease(o, 0, &l)))
		engine_release(eng, l.id, NULL);
	op_unlock_own(o);
	return ret;
}

int op_seq_free(struct op *o)
{
	int ret = share_seq_free(op_lock_own(o), o->sqe->arg, o->c->id, o->e);

	op_unlock_own(o);
	return ret;
}

/*
 * A sequence's state: the row, then its page table from page sqe.user on,
 * as much as fits (the library asks again for the rest).
 */
int op_seq_info(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct share_seq_state st;
	uint64_t n = 0;
	int ret;

	if (o->out_len < sizeof(st.info))
		return errbuf_set(o->e, -EMSGSIZE, "%s: the result needs out_len >= "
				  "%zu bytes; out_len is %" PRIu32, o->name,
				  sizeof(st.info), o->out_len);
	ret = share_seq_info(op_lock_own(o), q->arg, &st, o->e);
	if (!ret) {
		if (q->user < st.info.npages)
			n = st.info.npages - q->user;
		if (n > (o->out_len - sizeof(st.info)) / sizeof(int32_t))
			n = (o->out_len - sizeof(st.info)) / sizeof(int32_t);
		memcpy(o->out, &st.info, sizeof(st.info));
		if (n)
			memcpy(o->out + sizeof(st.info), st.frames + q->user,
			       (size_t)n * sizeof(int32_t));
	}
	op_unlock_own(o);
	if (ret)
		return ret;
	o->cqe->out_bytes = (uint32_t)(sizeof(st.info) + n * sizeof(int32_t));
	o->cqe->val0 = st.info.npages;
	return 0;
}

/* Its token ids from sqe.user on, as many as fit. */
int op_seq_tokens(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct share_seq_state st;
	uint64_t n = 0;
	int ret;

	ret = share_seq_info(op_lock_own(o), q->arg, &st, o->e);
	if (!ret) {
		if (q->user < st.info.ntoken_ids)
			n = st.info.ntoken_ids - q->user;
		if (n > o->out_len / sizeof(uint32_t))
			n = o->out_len / sizeof(uint32_t);
		if (n)
			memcpy(o->out, st.tokens + q->user, (size_t)n * sizeof(uint32_t));
	}
	op_unlock_own(o);
	if (ret)
		return ret;
	o->cqe->out_bytes = (uint32_t)(n * sizeof(uint32_t));
	o->cqe->val0 = st.info.ntoken_ids;
	return (int)n;
}

/* ------------------------------------------------------------ compositions */

/*
 * The composition's tables into the result range (proto.h, COMPOSE
 * result), with the pool locked: the counts of every level, then the
 * arrays level by level. -EMSGSIZE when they do not fit.
 */
static int put_composition(struct op *o, const struct share_composition *sc)
{
	struct kvp_compose_out h = {
		.lease = sc->lease, .nlevels = sc->nlevels,
		.nrequests = sc->nrequests, .tokens = sc->tokens,
		.pages = sc->pages, .bytes = sc->bytes,
	};
	struct kvp_compose_level_out lv[KVP_COMPOSE_MAX_LEVELS];
	uint64_t need = sizeof(h) + (uint64_t)sc->nlevels * sizeof(lv[0]);
	size_t at;

	if (sc->nlevels > KVP_COMPOSE_MAX_LEVELS)
		return errbuf_set(o->e, -EPROTO, "%s: the engine built %" PRIu32
				  " levels", o->name, sc->nlevels);
	for (uint32_t l = 0; l < sc->nlevels; l++) {
		uint32_t g = sc->ngroups[l];

		lv[l].ngroups = g;
		lv[l].nindices = (uint32_t)sc->kv_indptr[l][g];
		need += 4 * ((uint64_t)g * 3 + 2 + lv[l].nindices);
	}
	if (need > o->out_len)
		return errbuf_set(o->e, -EMSGSIZE, "%s: the cascade tables need %"
				  PRIu64 " bytes but out_len is %" PRIu32 "; raise "
				  "out_len (and arena_bytes) or compose fewer requests",
				  o->name, need, o->out_len);
	memcpy(o->out, &h, sizeof(h));
	memcpy(o->out + sizeof(h), lv, (size_t)sc->nlevels * sizeof(lv[0]));
	at = sizeof(h) + (size_t)sc->nlevels * sizeof(lv[0]);
	for (uint32_t l = 0; l < sc->nlevels; l++) {
		size_t g1 = ((size_t)lv[l].ngroups + 1) * 4;

		memcpy(o->out + at, sc->qo_indptr[l], g1);
		at += g1;
		memcpy(o->out + at, sc->kv_indptr[l], g1);
		at += g1;
		memcpy(o->out + at, sc->kv_indices[l], (size_t)lv[l].nindices * 4);
		at += (size_t)lv[l].nindices * 4;
		memcpy(o->out + at, sc->kv_last_page_len[l], g1 - 4);
		at += g1 - 4;
	}
	o->cqe->out_bytes = (uint32_t)at;
	o->cqe->val0 = sc->lease;
	return 0;
}

/* The requests from the input copy; their context pointers point into it. */
static int compose_reqs(struct op *o, const unsigned char *in,
			struct kvp_compose_req *reqs, uint32_t nreq,
			uint32_t nctx)
{
	const struct kvp_chunk_id *ctx = (const struct kvp_chunk_id *)
		(in + sizeof(struct kvp_compose_in) +
		 (size_t)nreq * sizeof(struct kvp_compose_req_in));
	uint64_t used = 0;

	for (uint32_t i = 0; i < nreq; i++) {
		struct kvp_compose_req_in r;

		memcpy(&r, in + sizeof(struct kvp_compose_in) + (size_t)i * sizeof(r),
		       sizeof(r));
		if (r.ncontexts > KVP_COMPOSE_MAX_CONTEXTS)
			return errbuf_set(o->e, -EINVAL, "%s: request %" PRIu32 " has %"
					  PRIu32 " contexts; at most %u", o->name, i,
					  r.ncontexts, KVP_COMPOSE_MAX_CONTEXTS);
		if (r.ncontexts > nctx - used)
			return errbuf_set(o->e, -EINVAL, "%s: request %" PRIu32 "'s %" PRIu32
					  " contexts run past the %" PRIu32 " context ids "
					  "given", o->name, i, r.ncontexts, nctx);
		reqs[i] = (struct kvp_compose_req){
			.system = r.system, .query = r.query, .qo_len = r.qo_len,
			.ncontexts = r.ncontexts,
			.contexts = r.ncontexts ? ctx + used : NULL,
		};
		used += r.ncontexts;
	}
	if (used != nctx)
		return errbuf_set(o->e, -EINVAL, "%s: the requests name %" PRIu64
				  " contexts but nctx is %" PRIu32, o->name, used, nctx);
	return 0;
}

int op_compose(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	const bool preview = q->flags & KVP_SQE_PREVIEW;
	struct share_composition sc;
	struct kvp_compose_req *reqs;
	struct kvp_compose_in h;
	const unsigned char *in = NULL;
	struct engine *eng;
	uint64_t want;
	int ret;

	/* The header decides the scratch size: read it from the one copy. */
	if ((ret = op_input_header(o, &h, sizeof(h), 0, &in, NULL)))
		return ret;
	if (!h.nreq || h.nreq > KVP_COMPOSE_MAX_REQUESTS)
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " requests; compose 1 "
				  "to %u at once", o->name, h.nreq,
				  KVP_COMPOSE_MAX_REQUESTS);
	want = sizeof(h) + (uint64_t)h.nreq * sizeof(struct kvp_compose_req_in) +
	       (uint64_t)h.nctx * sizeof(struct kvp_chunk_id);
	if (q->in_len != want)
		return errbuf_set(o->e, -EINVAL, "%s: %" PRIu32 " requests with %" PRIu32
				  " contexts need in_len %" PRIu64 "; it is %" PRIu32,
				  o->name, h.nreq, h.nctx, want, q->in_len);
	/* Room for the requests after the copy: take the scratch again, which
	 * keeps the copy (op_scratch_get grows by realloc) and does not
	 * re-read the arena. */
	reqs = op_scratch_get(o->scr, ((q->in_len + 7) & ~(size_t)7) +
			      (size_t)h.nreq * sizeof(*reqs));
	if (!reqs)
		return errbuf_set(o->e, -ENOMEM, "%s: out of memory for %" PRIu32
				  " requests", o->name, h.nreq);
	in = (const unsigned char *)reqs;
	reqs = (struct kvp_compose_req *)((unsigned char *)reqs +
					  ((q->in_len + 7) & ~(size_t)7));
	if ((ret = compose_reqs(o, in, reqs, h.nreq, h.nctx)))
		return ret;
	eng = op_lock_own(o);
	ret = share_compose(eng, reqs, h.nreq, preview, o->c->id, op_now_ns(), &sc,
			    o->e);
	if (!ret && (ret = put_composition(o, &sc)) && sc.lease)
		engine_release(eng, sc.lease, NULL);
	op_unlock_own(o);
	return ret;
}
