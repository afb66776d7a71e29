/* SPDX-License-Identifier: MIT */
/*
 * batch.c - operations: slots, tags, result ranges, and the asynchronous
 * queue / submit / reap API built on them.
 *
 * Every operation, synchronous or not, takes the same path: kvpc_queue()
 * takes an operation slot (bounding queued + unreaped by sq_entries), tags
 * the SQE with the slot and its generation, points its result range at the
 * slot's arena slice (or the sync range) and pushes it; kvpc_ring_submit()
 * publishes; the completion is matched back to its slot by kvpc_slot_of(),
 * which refuses any tag the client did not hand out. The result bytes are
 * decoded from a range only this client chose, and every length in them is
 * checked against that range before it is used.
 *
 * calls.c runs the synchronous calls through here one at a time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "client_internal.h"

/* ------------------------------------------------------------ slots */

unsigned char *kvpc_slot_out(struct kvp_client *c, uint32_t idx, uint32_t *len)
{
	if (c->slots[idx].sync) {
		*len = c->sync_bytes;
		return c->arena + c->sync_off;
	}
	*len = c->slice_bytes;
	return c->arena + (size_t)idx * c->slice_bytes;
}

void kvpc_slot_put(struct kvp_client *c, uint32_t idx)
{
	/* Only busy is cleared: the result range stays readable (and
	 * kvpc_slot_out() keeps working) until the slot is taken again. */
	c->slots[idx].busy = 0;
	c->free_slots[c->free_tail++ & c->sq_mask] = idx;
	c->inflight--;
}

int kvpc_queue(struct kvp_client *c, struct kvp_sqe *sqe, uint64_t user_tag,
	       int sync)
{
	struct kvpc_slot *s;
	unsigned char *out;
	uint32_t idx, len, lane;
	int ret;

	ret = kvpc_check_dead(c);
	if (ret)
		return ret;
	if (c->inflight >= c->sq_entries)
		return kvpc_err(c, -EBUSY,
				"%" PRIu32 " operations in flight; reap completions first",
				c->inflight);

	idx = c->free_slots[c->free_head++ & c->sq_mask];
	s = &c->slots[idx];
	s->gen = (s->gen + 1) & 0x7fffffff; /* bit 63 of a tag: a batch's */
	s->busy = 1;
	s->sync = (uint8_t)!!sync;
	s->op = sqe->opcode;
	s->user = sqe->user;
	s->n = sqe->n;
	s->lease = sqe->opcode == KVP_OP_COMMIT || sqe->opcode == KVP_OP_RELEASE ?
		   sqe->arg : 0;
	s->user_tag = user_tag;
	/* KVPOOL_BATCH=one: every async operation on one lane (batch_wire.c);
	 * a synchronous call runs with nothing in flight, on its own lane. */
	lane = !sync && c->one_lane >= 0 ? (uint32_t)c->one_lane :
	       kvpc_lane_of(c, sqe);
	s->lane = lane;
	s->pos = c->lanes[lane].sq_tail;
	c->inflight++;

	out = kvpc_slot_out(c, idx, &len);
	sqe->tag = ((uint64_t)s->gen << 32) | idx;
	sqe->out_off = (uint32_t)(out - c->arena);
	sqe->out_len = len;
	s->sqe = *sqe;
	c->queued++;
	if (!sync) {
		/* Pushed at kvp_submit(), with its lane's others as one BATCH
		 * entry (batch_wire.c). */
		kvpc_hold(c, idx);
		return (int)idx;
	}
	s->stage = KVPC_SLOT_PLAIN;
	ret = kvpc_ring_push(c, lane, sqe);
	if (ret) {
		c->queued--;
		kvpc_slot_put(c, idx);
		return ret;
	}
	return (int)idx;
}

int kvpc_slot_of(struct kvp_client *c, const struct kvp_cqe *cqe)
{
	uint32_t idx = (uint32_t)cqe->tag, gen = (uint32_t)(cqe->tag >> 32);
	uint32_t len;
	const struct kvpc_slot *s;
	const struct kvpc_lane *l;

	/* A CQE for a free slot, an old generation, or an SQE we have not
	 * published yet is not ours: the ring can no longer be believed. */
	if (idx >= c->sq_entries || !(s = &c->slots[idx])->busy || s->gen != gen ||
	    s->stage == KVPC_SLOT_HELD || s->stage == KVPC_SLOT_BATCH ||
	    (l = &c->lanes[s->lane],
	     (uint32_t)(s->pos - l->sq_published) < l->sq_tail - l->sq_published))
		return kvpc_fail(c, -EPROTO,
				 "kvpoold at %s completed an operation this client did not "
				 "submit (tag 0x%" PRIx64 "); reconnect", c->path, cqe->tag);
	kvpc_slot_out(c, idx, &len);
	if (cqe->out_bytes > len)
		return kvpc_fail(c, -EPROTO,
				 "kvpoold at %s wrote %" PRIu32 " result bytes into a "
				 "%" PRIu32 "-byte range; reconnect", c->path,
				 cqe->out_bytes, len);
	return (int)idx;
}

/* ------------------------------------------------------------ results */

const char *kvpc_cqe_message(struct kvp_client *c, uint32_t idx,
			     const struct kvp_cqe *cqe)
{
	uint32_t len;
	char *msg = (char *)kvpc_slot_out(c, idx, &len);

	/* Every range is at least KVPC_MIN_SLICE (>= KVP_ERRLEN) bytes. */
	if (!cqe->out_bytes)
		snprintf(msg, KVP_ERRLEN, "kvpoold: %s", strerror(-cqe->res));
	else
		msg[cqe->out_bytes < len ? cqe->out_bytes : len - 1] = '\0';
	return msg;
}

int kvpc_decode_fixed(struct kvp_client *c, uint32_t idx,
		      const struct kvp_cqe *cqe, void *dst, size_t size,
		      const char *what, char *msg, size_t msglen)
{
	uint32_t len;
	const unsigned char *src = kvpc_slot_out(c, idx, &len);

	if (cqe->out_bytes < size) {
		snprintf(msg, msglen,
			 "kvpoold at %s sent %" PRIu32 " bytes of %s, expected %zu",
			 c->path, cqe->out_bytes, what, size);
		return -EPROTO;
	}
	memcpy(dst, src, size);
	return 0;
}

int kvpc_decode_lease_at(struct kvp_client *c, const unsigned char *src,
			 uint32_t bytes, uint32_t want_n_new, uint64_t user,
			 struct kvp_lease *l, char *msg, size_t msglen)
{
	const uint32_t P = c->layout.page_tokens;
	struct kvp_prepare_out h;
	uint64_t room, tokens;

	if (bytes < sizeof(h)) {
		snprintf(msg, msglen, "kvpoold at %s sent a %" PRIu32 "-byte lease "
			 "result, shorter than its %zu-byte header", c->path,
			 bytes, sizeof(h));
		return -EPROTO;
	}
	memcpy(&h, src, sizeof(h));
	room = (bytes - sizeof(h)) / sizeof(int32_t);
	if (h.npages > room) {
		snprintf(msg, msglen, "kvpoold at %s sent a page table of %" PRIu32
			 " pages in %" PRIu32 " bytes", c->path, h.npages, bytes);
		return -EPROTO;
	}
	/* The pages must cover every position kvp_append() will compute. */
	if ((want_n_new != UINT32_MAX && h.n_new != want_n_new) ||
	    h.len > UINT64_MAX - h.n_new ||
	    (tokens = h.len + h.n_new) > (uint64_t)h.npages * P ||
	    h.last_page_len > P) {
		snprintf(msg, msglen, "kvpoold at %s sent an inconsistent lease "
			 "(%" PRIu64 " + %" PRIu32 " tokens, %" PRIu32 " pages of %"
			 PRIu32 ")", c->path, h.len, h.n_new, h.npages, P);
		return -EPROTO;
	}
	l->id = h.lease;
	l->user = user;
	l->start = h.start;
	l->len = h.len;
	l->n_new = h.n_new;
	l->npages = h.npages;
	l->last_page_len = h.last_page_len;
	l->onloaded_pages = h.onloaded_pages;
	l->indices = (const int32_t *)(src + sizeof(h));
	return 0;
}

int kvpc_decode_lease(struct kvp_client *c, uint32_t idx,
		      const struct kvp_cqe *cqe, struct kvp_lease *l,
		      char *msg, size_t msglen)
{
	const struct kvpc_slot *s = &c->slots[idx];
	uint32_t len;

	return kvpc_decode_lease_at(c, kvpc_slot_out(c, idx, &len), cqe->out_bytes,
				    s->n, s->user, l, msg, msglen);
}

/* ------------------------------------------------------------ async API */

static int queue_async(struct kvp_client *c, struct kvp_sqe *sqe, uint64_t tag)
{
	int ret = kvpc_queue(c, sqe, tag, 0);

	if (ret < 0)
		return ret;
	c->err[0] = '\0';
	return 0;
}

KVP_PUBLIC
int kvp_queue_info(struct kvp_client *c, uint64_t user, uint64_t tag)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_INFO, .user = user };

	return queue_async(c, &sqe, tag);
}

KVP_PUBLIC
int kvp_queue_prepare(struct kvp_client *c, uint64_t user, uint64_t start_pos,
		      uint32_t n_new, uint64_t tag)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_PREPARE, .user = user,
			       .arg = start_pos, .n = n_new };

	return queue_async(c, &sqe, tag);
}

/*
 * An async commit goes only through a lease this client holds open, like
 * kvp_commit(); from the moment it is queued the lease takes no writes (the
 * daemon may give its slots back before we reap). A failed commit reopens
 * it at reap (reap_lease).
 */
KVP_PUBLIC
int kvp_queue_commit(struct kvp_client *c, uint64_t lease, uint32_t n,
		     int release, uint64_t tag)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_COMMIT, .arg = lease, .n = n,
			       .flags = release ? KVP_SQE_RELEASE : 0 };
	struct kvpc_lease *r = NULL;
	int ret;

	/* The lease's GPU appends land before the commit is even queued
	 * (cuda.c, COMMIT ORDERING). */
	if ((ret = kvpc_check_dead(c)) ||
	    (ret = kvpc_lease_open(c, lease, "queue_commit", &r)) ||
	    (ret = kvpc_cuda_wait_lease(c, lease)) ||
	    (ret = queue_async(c, &sqe, tag)))
		return ret;
	r->state = KVPC_LEASE_COMMITTING;
	r->committed = n;
	r->release_queued = (uint8_t)!!release;
	return 0;
}

KVP_PUBLIC
int kvp_queue_release(struct kvp_client *c, uint64_t lease, uint64_t tag)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_RELEASE, .arg = lease };
	struct kvpc_lease *r = NULL;
	int ret;

	if ((ret = kvpc_check_dead(c)) || (ret = kvpc_cuda_wait_lease(c, lease)) ||
	    (ret = queue_async(c, &sqe, tag)))
		return ret;
	if ((r = kvpc_lease_find(c, lease)) && r->state != KVPC_LEASE_RELEASING) {
		r->state_before = r->state;
		r->state = KVPC_LEASE_RELEASING;
	}
	return 0;
}

KVP_PUBLIC
int kvp_submit(struct kvp_client *c)
{
	int ret = kvpc_check_dead(c);
	uint32_t n;

	if (!ret)
		ret = kvpc_flush(c);
	if (ret)
		return ret;
	kvpc_ring_submit(c);
	n = c->queued;
	c->queued = 0;
	c->err[0] = '\0';
	return (int)n;
}

static uint32_t async_op(uint8_t opcode)
{
	switch (opcode) {
	case KVP_OP_INFO: return KVP_ASYNC_INFO;
	case KVP_OP_PREPARE: return KVP_ASYNC_PREPARE;
	case KVP_OP_COMMIT: return KVP_ASYNC_COMMIT;
	case KVP_OP_RELEASE: return KVP_ASYNC_RELEASE;
	default: return 0;
	}
}

/* Mirror a reaped commit or release in the lease table (lease.c, STATES). */
static void reap_lease(struct kvp_client *c, const struct kvpc_slot *s,
		       int32_t res)
{
	struct kvpc_lease *r = kvpc_lease_find(c, s->lease);

	if (!r)
		return;
	if (s->op == KVP_OP_RELEASE) {
		if (kvpc_lease_ended(res))
			kvpc_lease_drop(c, s->lease);
		else if (r->state == KVPC_LEASE_RELEASING)
			r->state = r->state_before; /* a committed lease stays closed */
	} else if (r->state == KVPC_LEASE_COMMITTING) {
		if (res >= 0 && r->release_queued)
			kvpc_lease_drop(c, s->lease);
		else if (res >= 0)
			r->state = KVPC_LEASE_CLOSED;
		else
			r->state = KVPC_LEASE_OPEN;
	}
}

/* Turn one CQE into a completion and free its slot; -EPROTO for a tag that
 * is not ours (fatal). A malformed result fails only that completion. */
static int reap_one(struct kvp_client *c, const struct kvp_cqe *cqe,
		    struct kvp_completion *out)
{
	struct kvpc_slot *s;
	uint32_t len;
	char *msg;
	int idx, ret = 0;

	idx = kvpc_slot_of(c, cqe);
	if (idx < 0)
		return idx;
	s = &c->slots[idx];
	memset(out, 0, sizeof(*out));
	out->tag = s->user_tag;
	out->op = async_op(s->op);
	out->res = cqe->res;
	msg = (char *)kvpc_slot_out(c, (uint32_t)idx, &len);
	kvpc_cqe_error_info(cqe, &s->err); /* all zero unless it failed */
	if (cqe->res < 0) {
		out->error = kvpc_cqe_message(c, (uint32_t)idx, cqe);
	} else if (s->op == KVP_OP_INFO) {
		ret = kvpc_decode_fixed(c, (uint32_t)idx, cqe, &out->info,
					sizeof(out->info), "user info", msg,
					KVP_ERRLEN);
	} else if (s->op == KVP_OP_PREPARE) {
		char tmp[KVP_ERRLEN];

		ret = kvpc_decode_lease(c, (uint32_t)idx, cqe, &out->lease, tmp,
					sizeof(tmp));
		if (!ret && (ret = kvpc_lease_add(c, &out->lease, KVPC_LEASE_HISTORY, 0)))
			snprintf(tmp, sizeof(tmp), "%s", c->err);
		if (ret)
			memcpy(msg, tmp, sizeof(tmp));
	}
	if (s->op == KVP_OP_COMMIT || s->op == KVP_OP_RELEASE)
		reap_lease(c, s, cqe->res);
	if (ret) {
		/* The message was written into the slot's own slice. */
		memset(&out->lease, 0, sizeof(out->lease));
		memset(&out->info, 0, sizeof(out->info));
		out->res = ret;
		out->error = msg;
		memset(&s->err, 0, sizeof(s->err)); /* the library's: no detail */
	}
	kvpc_slot_put(c, (uint32_t)idx);
	return 0;
}

KVP_PUBLIC
int kvp_completion_error_info_sz(const struct kvp_client *c,
				 const struct kvp_completion *cq,
				 struct kvp_error_info *out, size_t size)
{
	uintptr_t at, base;
	size_t idx;

	if (!c || !cq || !cq->error || !out || size < KVP_ERROR_INFO_SIZE_VER0 ||
	    size % 8 || size > UINT32_MAX)
		return -EINVAL;
	/* A failed completion's message is its slot's result range
	 * (reap_one), whose slot keeps the detail until it is taken again. */
	at = (uintptr_t)cq->error;
	base = (uintptr_t)c->arena;
	if (at < base || (at - base) % c->slice_bytes)
		return -EINVAL;
	idx = (at - base) / c->slice_bytes;
	if (idx >= c->sq_entries)
		return -EINVAL;
	kvpc_rows_put(out, size, &c->slots[idx].err, sizeof(*out), 1);
	return 0;
}

KVP_PUBLIC
int kvp_reap_sz(struct kvp_client *c, struct kvp_completion *out, size_t size,
		uint32_t max, uint32_t min_complete)
{
	uint32_t submitted, i;
	int ret;

	ret = kvpc_check_dead(c);
	if (!ret)
		ret = kvpc_completion_size(c, size);
	if (ret)
		return ret;
	if ((!out && max) || min_complete > max)
		return kvpc_err(c, -EINVAL,
				"kvp_reap: min_complete %" PRIu32 " is more than max %"
				PRIu32 " (or out is NULL)", min_complete, max);
	submitted = c->inflight - c->queued;
	if (min_complete > submitted)
		return kvpc_err(c, -EINVAL,
				"kvp_reap: waiting for %" PRIu32 " completions but only %"
				PRIu32 " operations are submitted%s", min_complete,
				submitted, c->queued ? " (call kvp_submit first)" : "");
	if (!max) {
		c->err[0] = '\0';
		return 0;
	}
	for (i = 0; i < max; i++) {
		struct kvp_completion k;
		struct kvp_cqe cqe;

		/* Plain completions and a batch's items, queued in the order
		 * they were taken (batch_wire.c). */
		if (c->pend_head == c->pend_tail) {
			ret = kvpc_pend_fill(c, i < min_complete);
			if (ret < 0)
				return ret;
			if (!ret)
				break;
		}
		cqe = c->pend[c->pend_head++ % c->sq_entries];
		ret = reap_one(c, &cqe, &k);
		if (ret < 0)
			return ret; /* the client is broken now */
		/* At the caller's stride, in its layout (GROWING STRUCTS). */
		kvpc_completion_put((unsigned char *)out + (size_t)i * size, size, &k);
	}
	kvpc_cq_release(c);
	c->err[0] = '\0';
	return (int)i;
}
