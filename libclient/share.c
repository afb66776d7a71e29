/* SPDX-License-Identifier: MIT */
/*
 * share.c - the sharing calls (kvpool.h, "Sharing"): prefix lookup,
 * sequences and compositions, and the helpers chunk.c's chunk calls share.
 * All synchronous, through the same path as calls.c (kvpc_call).
 *
 * INPUTS. Token ids, sources, metadata, filters and compose requests are
 * written at the start of the arena's sync range and named by the SQE's
 * in_off / in_len (proto.h, INPUTS). The results come back in the same
 * range: the daemon copies the input out before it writes a result byte.
 * No async operation ever uses the sync range, so writing the input before
 * kvpc_call() checks for operations in flight harms none of them.
 *
 * LEASES. Sequence and chunk leases decode into struct kvp_lease exactly
 * like a prepare's, so the append data ops, kvp_commit and kvp_release take
 * them unchanged; kvp_chunk_seal waits for the lease's GPU appends first,
 * as kvp_commit does (cuda.c, COMMIT ORDERING).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"

/* ------------------------------------------------------------ helpers */

/* Room for bytes of input at the start of the sync range, named in sqe;
 * NULL (last error set) when it does not fit. */
unsigned char *kvpc_input(struct kvp_client *c, struct kvp_sqe *sqe,
			    uint64_t bytes, const char *what)
{
	/* The arena is the parent's memory in a forked child. */
	if (kvpc_check_fork(c))
		return NULL;
	if (bytes > c->sync_bytes) {
		kvpc_err(c, -E2BIG, "%s: the input is %" PRIu64 " bytes but the "
			 "arena's sync range holds %" PRIu32 "; connect with a larger "
			 "arena_bytes (kvp_connect_opts) or split the call", what,
			 bytes, c->sync_bytes);
		return NULL;
	}
	sqe->in_off = c->sync_off;
	sqe->in_len = (uint32_t)bytes;
	return c->arena + c->sync_off;
}

int kvpc_null_arg(struct kvp_client *c, const char *what, const char *arg)
{
	return kvpc_err(c, -EINVAL, "%s: %s is NULL", what, arg);
}

/* Token ids: n of them, NULL only when n is 0. */
static int check_ids(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
		     const char *what)
{
	if (n && !tokens)
		return kvpc_err(c, -EINVAL, "%s: NULL token ids for %" PRIu32
				" tokens", what, n);
	return 0;
}

/* A lease result in the sync range of slot idx, at offset off. */
int kvpc_decode_lease_off(struct kvp_client *c, uint32_t idx,
			const struct kvp_cqe *cqe, size_t off,
			uint32_t want_n_new, uint64_t user, struct kvp_lease *l)
{
	char msg[KVP_ERRLEN];
	uint32_t len;
	const unsigned char *src = kvpc_slot_out(c, idx, &len);

	if (cqe->out_bytes < off ||
	    kvpc_decode_lease_at(c, src + off, cqe->out_bytes - (uint32_t)off,
				 want_n_new, user, l, msg, sizeof(msg)))
		return kvpc_err(c, -EPROTO, "%s", off > cqe->out_bytes ?
				"kvpoold sent a lease result shorter than its header" :
				msg);
	return 0;
}

/* A call that returns a lease with n_new == want (UINT32_MAX: any). */
int kvpc_call_lease(struct kvp_client *c, struct kvp_sqe *sqe,
		      uint32_t want_n_new, uint64_t user, struct kvp_lease *out)
{
	struct kvp_cqe cqe;
	uint32_t idx = 0;
	int ret = kvpc_call(c, sqe, &cqe, &idx);

	if (ret < 0)
		return ret;
	return kvpc_decode_lease_off(c, idx, &cqe, 0, want_n_new, user, out);
}

int kvpc_call_res(struct kvp_client *c, struct kvp_sqe *sqe)
{
	struct kvp_cqe cqe;
	uint32_t idx = 0;

	return kvpc_call(c, sqe, &cqe, &idx);
}

/* A call whose input is one chunk id. */
int kvpc_put_id(struct kvp_client *c, struct kvp_sqe *sqe,
		  const struct kvp_chunk_id *id, const char *what)
{
	unsigned char *in;

	if (!id)
		return kvpc_null_arg(c, what, "the chunk id");
	in = kvpc_input(c, sqe, sizeof(*id), what);
	if (!in)
		return kvpc_input_fail(c);
	memcpy(in, id, sizeof(*id));
	return 0;
}

/* ------------------------------------------------------------ prefix cache */

KVP_PUBLIC
int kvp_prefix_lookup(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
		      struct kvp_prefix_hit *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_PREFIX_LOOKUP, .n = n };
	struct kvp_prefix_out h;
	const unsigned char *src;
	unsigned char *in;
	struct kvp_cqe cqe;
	uint32_t idx = 0, len;
	int ret;

	if (!out)
		return kvpc_null_arg(c, "prefix_lookup", "the result pointer");
	if ((ret = check_ids(c, tokens, n, "prefix_lookup")))
		return ret;
	if (!(in = kvpc_input(c, &sqe, (uint64_t)n * 4, "prefix_lookup")))
		return kvpc_input_fail(c);
	if (n)
		memcpy(in, tokens, (size_t)n * 4);
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	src = kvpc_slot_out(c, idx, &len);
	if (cqe.out_bytes < sizeof(h))
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent a %" PRIu32 "-byte "
				"prefix result", c->path, cqe.out_bytes);
	memcpy(&h, src, sizeof(h));
	/* Whole pages, or n - 1 when the pages hold all n (kvpool.h). */
	if (h.npages > (cqe.out_bytes - sizeof(h)) / 4 ||
	    ((uint64_t)h.npages * c->layout.page_tokens != h.tokens &&
	     ((uint64_t)h.npages * c->layout.page_tokens != n || h.tokens != n - 1)) ||
	    (n && h.tokens >= n) || (!n && h.tokens))
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent an inconsistent prefix "
				"hit (%" PRIu32 " tokens, %" PRIu32 " pages for %" PRIu32
				" asked)", c->path, h.tokens, h.npages, n);
	out->tokens = h.tokens;
	out->npages = h.npages;
	out->indices = (const int32_t *)(src + sizeof(h));
	return (int)h.tokens;
}

/* ------------------------------------------------------------ sequences */

KVP_PUBLIC
int kvp_seq_alloc(struct kvp_client *c, uint64_t seq, const uint32_t *tokens,
		  uint32_t n, struct kvp_lease *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_SEQ_ALLOC, .arg = seq, .n = n };
	unsigned char *in;
	int ret;

	if (!out)
		return kvpc_null_arg(c, "seq_alloc", "the lease pointer");
	if ((ret = check_ids(c, tokens, n, "seq_alloc")))
		return ret;
	if (!(in = kvpc_input(c, &sqe, (uint64_t)n * 4, "seq_alloc")))
		return kvpc_input_fail(c);
	if (n)
		memcpy(in, tokens, (size_t)n * 4);
	ret = kvpc_call_lease(c, &sqe, UINT32_MAX, seq, out);
	if (!ret && out->len + out->n_new != n)
		return kvpc_err(c, -EPROTO, "kvpoold at %s returned a lease of %" PRIu64
				" cached + %" PRIu32 " new tokens for %" PRIu32,
				c->path, out->len, out->n_new, n);
	return ret ? ret : kvpc_lease_add(c, out, KVPC_LEASE_SEQ, seq);
}

KVP_PUBLIC
int kvp_seq_create_sz(struct kvp_client *c, uint64_t seq,
		      const struct kvp_seq_src *csrc, size_t size, uint32_t nsrc,
		      uint32_t n_new, struct kvp_lease *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_SEQ_CREATE, .arg = seq, .n = n_new };
	struct kvp_seq_create_in h = { .nsrc = nsrc };
	const struct kvp_seq_src *src;
	unsigned char *in;
	void *tmp;
	int ret;

	if (!out)
		return kvpc_null_arg(c, "seq_create", "the lease pointer");
	if (nsrc && !csrc)
		return kvpc_null_arg(c, "seq_create", "the source array");
	/* At the caller's stride (kvpool.h, GROWING STRUCTS). */
	if ((ret = kvpc_rows_in(c, csrc, size, sizeof(*src), KVP_SEQ_SRC_SIZE_VER0,
				nsrc, (const void **)&src, &tmp, "seq_create")))
		return ret;
	in = kvpc_input(c, &sqe, sizeof(h) + (uint64_t)nsrc * sizeof(*src), "seq_create");
	if (!in) {
		free(tmp);
		return kvpc_input_fail(c);
	}
	memcpy(in, &h, sizeof(h));
	if (nsrc)
		memcpy(in + sizeof(h), src, (size_t)nsrc * sizeof(*src));
	free(tmp);
	ret = kvpc_call_lease(c, &sqe, n_new, seq, out);
	return ret ? ret : kvpc_lease_add(c, out, KVPC_LEASE_SEQ, seq);
}

KVP_PUBLIC
int kvp_seq_extend(struct kvp_client *c, uint64_t seq, uint32_t n_new,
		   const uint32_t *tokens, struct kvp_lease *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_SEQ_EXTEND, .arg = seq, .n = n_new };
	unsigned char *in;
	int ret;

	if (!out)
		return kvpc_null_arg(c, "seq_extend", "the lease pointer");
	if (tokens && n_new) {
		if (!(in = kvpc_input(c, &sqe, (uint64_t)n_new * 4, "seq_extend")))
			return kvpc_input_fail(c);
		memcpy(in, tokens, (size_t)n_new * 4);
	}
	ret = kvpc_call_lease(c, &sqe, n_new, seq, out);
	if (ret)
		return ret;
	/* The daemon ended the previous (committed) write lease with this
	 * one: it takes no writes and its page table goes. */
	kvpc_lease_drop_seq(c, seq, out->id);
	return kvpc_lease_add(c, out, KVPC_LEASE_SEQ, seq);
}

/* Refused (-EBUSY) while the sequence's write lease is held; after a free
 * no lease of it is left to forget, but a stale record would be. */
KVP_PUBLIC
int kvp_seq_free(struct kvp_client *c, uint64_t seq)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_SEQ_FREE, .arg = seq };
	int ret = kvpc_call_res(c, &sqe);

	if (ret >= 0)
		kvpc_lease_drop_seq(c, seq, 0);
	return ret;
}

/* ------------------------------------------------------------ compositions */

/* The requests as proto.h's COMPOSE input. */
static int put_compose(struct kvp_client *c, struct kvp_sqe *sqe,
		       const struct kvp_compose_req *reqs, uint32_t nreq,
		       const char *what)
{
	struct kvp_compose_in h = { .nreq = nreq };
	uint64_t nctx = 0, bytes;
	unsigned char *in, *ctx;

	if (nreq && !reqs)
		return kvpc_null_arg(c, what, "the request array");
	for (uint32_t i = 0; i < nreq; i++) {
		if (reqs[i].ncontexts && !reqs[i].contexts)
			return kvpc_err(c, -EINVAL, "%s: request %" PRIu32 " has %" PRIu32
					" contexts and a NULL context array", what, i,
					reqs[i].ncontexts);
		nctx += reqs[i].ncontexts;
	}
	/* The daemon checks the limits (and names what is wrong); this only
	 * keeps the sizes from overflowing. */
	if (nctx > UINT32_MAX)
		return kvpc_err(c, -EINVAL, "%s: %" PRIu64 " contexts in all; at most %u "
				"per request", what, nctx, KVP_COMPOSE_MAX_CONTEXTS);
	h.nctx = (uint32_t)nctx;
	bytes = sizeof(h) + (uint64_t)nreq * sizeof(struct kvp_compose_req_in) +
		nctx * sizeof(struct kvp_chunk_id);
	if (!(in = kvpc_input(c, sqe, bytes, what)))
		return kvpc_input_fail(c);
	memcpy(in, &h, sizeof(h));
	ctx = in + sizeof(h) + (size_t)nreq * sizeof(struct kvp_compose_req_in);
	for (uint32_t i = 0; i < nreq; i++) {
		struct kvp_compose_req_in r = {
			.system = reqs[i].system, .query = reqs[i].query,
			.ncontexts = reqs[i].ncontexts, .qo_len = reqs[i].qo_len,
		};

		memcpy(in + sizeof(h) + (size_t)i * sizeof(r), &r, sizeof(r));
		if (r.ncontexts)
			memcpy(ctx, reqs[i].contexts,
			       (size_t)r.ncontexts * sizeof(struct kvp_chunk_id));
		ctx += (size_t)r.ncontexts * sizeof(struct kvp_chunk_id);
	}
	return 0;
}

/*
 * The COMPOSE result (proto.h): every count is summed against out_bytes
 * before any array pointer is taken; each level's kv_indptr must end at its
 * index count and every index must be a frame of the device tier.
 */
static int decode_composition(struct kvp_client *c, const unsigned char *src,
			      uint32_t bytes, struct kvp_composition *out)
{
	const uint32_t frames = c->tier_frames[KVP_TIER_DEVICE];
	struct kvp_compose_level_out lv[KVP_COMPOSE_MAX_LEVELS];
	struct kvp_compose_out h;
	uint64_t need;
	size_t at;

	if (bytes < sizeof(h))
		goto bad;
	memcpy(&h, src, sizeof(h));
	need = sizeof(h) + (uint64_t)h.nlevels * sizeof(lv[0]);
	if (h.nlevels > KVP_COMPOSE_MAX_LEVELS || need > bytes)
		goto bad;
	memcpy(lv, src + sizeof(h), (size_t)h.nlevels * sizeof(lv[0]));
	for (uint32_t l = 0; l < h.nlevels; l++)
		need += 4 * ((uint64_t)lv[l].ngroups * 3 + 2 + lv[l].nindices);
	if (need > bytes)
		goto bad;
	memset(out, 0, sizeof(*out));
	out->lease = h.lease;
	out->nlevels = h.nlevels;
	out->nrequests = h.nrequests;
	out->tokens = h.tokens;
	out->pages = h.pages;
	out->bytes = h.bytes;
	at = sizeof(h) + (size_t)h.nlevels * sizeof(lv[0]);
	for (uint32_t l = 0; l < h.nlevels; l++) {
		struct kvp_cascade_level *cl = &out->level[l];
		const uint32_t g = lv[l].ngroups;

		cl->ngroups = g;
		cl->qo_indptr = (const int32_t *)(src + at);
		at += ((size_t)g + 1) * 4;
		cl->kv_indptr = (const int32_t *)(src + at);
		at += ((size_t)g + 1) * 4;
		cl->kv_indices = (const int32_t *)(src + at);
		at += (size_t)lv[l].nindices * 4;
		cl->kv_last_page_len = (const int32_t *)(src + at);
		at += (size_t)g * 4;
		if (cl->kv_indptr[0] != 0 || (uint32_t)cl->kv_indptr[g] != lv[l].nindices)
			goto bad;
		for (uint32_t i = 0; i < lv[l].nindices; i++)
			if (cl->kv_indices[i] < 0 || (uint32_t)cl->kv_indices[i] >= frames)
				goto bad;
	}
	return 0;
bad:
	return kvpc_err(c, -EPROTO, "kvpoold at %s sent a malformed composition "
			"(%" PRIu32 " bytes)", c->path, bytes);
}

static int compose(struct kvp_client *c, const struct kvp_compose_req *creqs,
		   size_t size, uint32_t nreq, int preview,
		   struct kvp_composition *out)
{
	const char *what = preview ? "compose_preview" : "compose";
	struct kvp_sqe sqe = { .opcode = KVP_OP_COMPOSE,
			       .flags = preview ? KVP_SQE_PREVIEW : 0 };
	const struct kvp_compose_req *reqs;
	struct kvp_cqe cqe;
	uint32_t idx = 0, len;
	const unsigned char *src;
	void *tmp;
	int ret;

	if (!out)
		return kvpc_null_arg(c, what, "the result pointer");
	/* At the caller's stride (kvpool.h, GROWING STRUCTS). */
	if ((ret = kvpc_rows_in(c, creqs, size, sizeof(*reqs),
				KVP_COMPOSE_REQ_SIZE_VER0, nreq,
				(const void **)&reqs, &tmp, what)))
		return ret;
	ret = put_compose(c, &sqe, reqs, nreq, what);
	free(tmp);
	if (ret)
		return ret;
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	src = kvpc_slot_out(c, idx, &len);
	/* A held composition's tables live as long as its lease: decode them
	 * from a copy the lease table keeps until kvp_release(). */
	if (!preview && cqe.val0 &&
	    (ret = kvpc_lease_add_blob(c, cqe.val0, src, cqe.out_bytes, &src))) {
		struct kvp_sqe rel = { .opcode = KVP_OP_RELEASE, .arg = cqe.val0 };

		kvpc_call_res(c, &rel);
		return kvpc_err(c, -ENOMEM, "compose: out of memory for the page "
				"tables of %" PRIu32 " bytes; the composition was "
				"released", cqe.out_bytes);
	}
	ret = decode_composition(c, src, cqe.out_bytes, out);
	if (ret && !preview && cqe.val0) {
		/* Malformed but held: let the chunks go rather than leak them. */
		struct kvp_sqe rel = { .opcode = KVP_OP_RELEASE, .arg = cqe.val0 };

		kvpc_call_res(c, &rel);
		kvpc_lease_drop(c, cqe.val0);
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent a malformed "
				"composition; it was released", c->path);
	}
	return ret;
}

KVP_PUBLIC
int kvp_compose_sz(struct kvp_client *c, const struct kvp_compose_req *reqs,
		   size_t size, uint32_t nreq, struct kvp_composition *out)
{
	return compose(c, reqs, size, nreq, 0, out);
}

KVP_PUBLIC
int kvp_compose_preview_sz(struct kvp_client *c,
			   const struct kvp_compose_req *reqs, size_t size,
			   uint32_t nreq, struct kvp_composition *out)
{
	return compose(c, reqs, size, nreq, 1, out);
}
