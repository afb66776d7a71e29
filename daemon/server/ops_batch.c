/* SPDX-License-Identifier: MIT */
/*
 * ops_batch.c - BATCH entries (proto.h, BATCH; ops.h says how the worker
 * takes one): the batch checked whole and its items copied once, then each
 * item run as its own entry would run, through the same checks and
 * operations (op_execute_held), its completion written to the batch's
 * result range.
 *
 * Why a batch at all: per entry, the worker copies an SQE, reserves a CQ
 * slot, publishes a completion and may wake the client, and the client
 * polls for it; at a few million operations a second those costs were as
 * large as the operations themselves (issue 32). A batch pays them once.
 * Its items also keep their shard's lock from one to the next while they
 * share the shard (o->hold, ops.c lock_shard), which the engine's shard
 * design makes the common case: libkvpool batches one lane's entries, and
 * a lane is a shard.
 *
 * Validation comes first and is whole: a batch with any malformed item is
 * refused before any item runs, so a refused batch changed nothing. An
 * item's own failure (a gap, an unknown lease) is only that item's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_internal.h"

/* The batch's own result range takes one kvp_cqe per item. */
#define CQE_BYTES ((uint32_t)sizeof(struct kvp_cqe))
#define ITEM_BYTES ((uint32_t)sizeof(struct kvp_batch_item))

static void refuse(struct kvp_cqe *cqe, unsigned char *out, uint32_t out_len,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* A refused batch: -EINVAL and the message, as op_fail writes one. */
static void refuse(struct kvp_cqe *cqe, unsigned char *out, uint32_t out_len,
		   const char *fmt, ...)
{
	char msg[KVP_ERRLEN];
	size_t n;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cqe->res = -EINVAL;
	if (!out || !out_len)
		return;
	n = strlen(msg) + 1;
	if (n > out_len)
		n = out_len;
	memcpy(out, msg, n - 1);
	out[n - 1] = '\0';
	cqe->out_bytes = (uint32_t)n;
}

static bool range_ok(uint32_t off, uint32_t len, uint32_t cap)
{
	/* Overflow-safe: off + len could wrap; this cannot. */
	return len <= cap && off <= cap - len;
}

/* Item i's checks (proto.h, BATCH): NULL when it may run, else why not. */
static const char *item_bad(const struct kvp_batch_item *it, uint32_t cap)
{
	switch (it->opcode) {
	case KVP_OP_INFO:
	case KVP_OP_PREPARE:
	case KVP_OP_RELEASE:
		if (it->flags)
			return "has flags; only a commit's KVP_SQE_RELEASE is valid";
		break;
	case KVP_OP_COMMIT:
		if (it->flags & ~KVP_SQE_RELEASE)
			return "has flags other than KVP_SQE_RELEASE";
		break;
	default:
		return "is not INFO, PREPARE, COMMIT or RELEASE (the opcodes a "
		       "batch carries)";
	}
	if (it->rsv)
		return "has a nonzero rsv";
	if (!range_ok(it->out_off, it->out_len, cap))
		return "has a result range outside the arena";
	return NULL;
}

struct op_batch *ops_batch_open(struct server *s, struct client *c,
				const struct kvp_sqe *sqe,
				const unsigned char *in_base, uint32_t in_cap,
				unsigned char *out_base, uint32_t out_cap,
				struct kvp_cqe *cqe)
{
	unsigned char *out = NULL;
	struct op_batch *b;
	uint32_t n = sqe->n;

	(void)s;
	*cqe = (struct kvp_cqe){ .tag = sqe->tag };
	if (!range_ok(sqe->out_off, sqe->out_len, out_cap)) {
		cqe->res = -EINVAL; /* nowhere to put a message */
		return NULL;
	}
	out = out_base + sqe->out_off;
	if (!c->tenant) {
		refuse(cqe, out, sqe->out_len, "batch: client %" PRIu32 " has no "
		       "tenant; data operations need one", c->id);
		cqe->res = -EPERM;
		return NULL;
	}
	if (sqe->flags || sqe->sel || sqe->user || sqe->arg || sqe->tenant ||
	    sqe->rsv0 || sqe->rsv1) {
		refuse(cqe, out, sqe->out_len, "batch: flags, sel, user, arg, "
		       "tenant and the reserved fields of a batch entry must be "
		       "zero (its items carry them)");
		return NULL;
	}
	if (!n || n > KVP_BATCH_MAX) {
		refuse(cqe, out, sqe->out_len, "batch: %" PRIu32 " items; a batch "
		       "carries 1 to %u (KVP_BATCH_MAX), split it", n, KVP_BATCH_MAX);
		return NULL;
	}
	if (sqe->in_len != n * ITEM_BYTES || !in_base ||
	    !range_ok(sqe->in_off, sqe->in_len, in_cap)) {
		refuse(cqe, out, sqe->out_len, "batch: %" PRIu32 " items need in_len "
		       "%" PRIu32 " (40 bytes each) inside the %" PRIu32 "-byte arena; "
		       "in_off %" PRIu32 " in_len %" PRIu32, n, n * ITEM_BYTES, in_cap,
		       sqe->in_off, sqe->in_len);
		return NULL;
	}
	if (sqe->out_len < n * CQE_BYTES) {
		refuse(cqe, out, sqe->out_len, "batch: %" PRIu32 " items need out_len "
		       ">= %" PRIu32 " (a 32-byte completion each); out_len is %" PRIu32,
		       n, n * CQE_BYTES, sqe->out_len);
		return NULL;
	}
	b = malloc(sizeof(*b) + (size_t)n * sizeof(b->v[0]));
	if (!b)
		return NULL; /* res 0: take it later */
	b->count = n;
	b->first = b->nlog = b->emitted = 0;
	b->hold = -1;
	/* The one read of the items: checked and used as copied. */
	for (uint32_t i = 0; i < n; i++) {
		struct op_batch_slot *v = &b->v[i];
		const char *bad;

		memcpy(&v->it, in_base + sqe->in_off + (size_t)i * ITEM_BYTES,
		       ITEM_BYTES);
		v->eng = NULL;
		v->fence = 0;
		v->since = 0;
		v->retry_at = 0;
		v->state = OP_ITEM_UNRUN;
		v->why = ENGINE_DONE;
		/* An info's or a prepare's user is its own; a commit's or a
		 * release's is its lease's, looked up when needed. */
		v->user = v->it.user;
		v->has_user = true;
		v->user_known = v->it.opcode == KVP_OP_INFO ||
				v->it.opcode == KVP_OP_PREPARE;
		if ((bad = item_bad(&v->it, out_cap))) {
			refuse(cqe, out, sqe->out_len, "batch: item %" PRIu32 " (opcode "
			       "%u) %s; nothing in the batch ran", i, v->it.opcode, bad);
			free(b);
			return NULL;
		}
	}
	return b;
}

/* An item as the entry it stands for. */
static void item_sqe(const struct kvp_batch_item *it, struct kvp_sqe *q)
{
	*q = (struct kvp_sqe){ .opcode = it->opcode, .flags = it->flags,
			       .n = it->n, .tag = it->tag, .user = it->user,
			       .arg = it->arg, .out_off = it->out_off,
			       .out_len = it->out_len };
}

static void unhold(struct client *c, struct op_batch *b)
{
	struct shard_set *set;

	if (b->hold < 0)
		return;
	set = c->tenant->pools[c->pool].set;
	shard_unlock(set, (uint32_t)b->hold);
	shard_reclaim_hint(set);
	b->hold = -1;
}

bool ops_batch_user(struct server *s, struct client *c, struct op_batch *b,
		    uint32_t i, uint64_t *user)
{
	struct op_batch_slot *v = &b->v[i];
	struct kvp_sqe q;

	if (!v->user_known) {
		struct shard_set *set = c->tenant->pools[c->pool].set;
		uint32_t k = shard_of_lease(set, v->it.arg);

		/* Under the lease's shard's lock: the one held between items,
		 * or taken (ops_sqe_user) once that is let go. */
		if ((int32_t)k == b->hold) {
			v->has_user = engine_lease_user(set->v[k].eng, v->it.arg,
							&v->user) == 0;
		} else {
			unhold(c, b);
			item_sqe(&v->it, &q);
			v->has_user = ops_sqe_user(s, c, &q, &v->user);
		}
		v->user_known = true;
	}
	*user = v->user;
	return v->has_user;
}

/* An item's completion into the log (proto.h, BATCH): the client's
 * out range may be unaligned, so bytes. */
static void log_put(const struct kvp_sqe *sqe, struct op_batch *b,
		    unsigned char *out_base, const struct kvp_cqe *cqe)
{
	memcpy(out_base + sqe->out_off + (size_t)b->nlog++ * CQE_BYTES, cqe,
	       sizeof(*cqe));
}

/*
 * The users of the items a pass has passed over so far that have not run
 * or not landed: a later item of one of them, or any later item once one
 * of no single user is among them, waits (one user's items take effect,
 * and complete, in item order). A set, so a batch of one user's items
 * costs a pass one comparison per item, not one per earlier item.
 */
struct blockers {
	bool all;                  /* an item of no single user */
	uint32_t n;
	uint64_t user[KVP_BATCH_MAX];
};

static void block(struct blockers *k, const struct op_batch_slot *v)
{
	if (!v->has_user) {
		k->all = true;
		return;
	}
	for (uint32_t j = 0; j < k->n; j++)
		if (k->user[j] == v->user)
			return;
	k->user[k->n++] = v->user;
}

static bool blocked(const struct blockers *k, bool has, uint64_t user)
{
	if (k->all || (k->n && !has))
		return true;
	for (uint32_t j = 0; j < k->n; j++)
		if (k->user[j] == user)
			return true;
	return false;
}

uint32_t ops_batch_run(struct server *s, struct client *c,
		       const struct kvp_sqe *sqe, struct op_batch *b,
		       unsigned char *out_base, uint32_t out_cap,
		       struct op_scratch *scr, op_batch_held_fn held, void *arg,
		       uint64_t now, const struct op_batch_clock *clk)
{
	struct blockers k = { .all = false, .n = 0 };
	uint32_t unrun = 0;
	uint64_t u;

	for (uint32_t i = b->first; i < b->count; i++) {
		struct op_batch_slot *v = &b->v[i];
		struct op_wait wt = { 0 };
		struct kvp_sqe q;
		struct kvp_cqe cqe;
		bool has;

		if (v->state == OP_ITEM_LOGGED)
			continue;
		if (v->state == OP_ITEM_LANDING) {
			block(&k, v);
			continue;
		}
		has = (k.all || k.n) ? ops_batch_user(s, c, b, i, &u) : false;
		if ((k.all || k.n) && blocked(&k, has, u)) {
			block(&k, v);
			continue;
		}
		if ((held && held(arg, b, i)) || (v->retry_at && now < v->retry_at)) {
			ops_batch_user(s, c, b, i, &u); /* for ops_batch_holds */
			block(&k, v);
			continue;
		}
		/* A reclaimer's wait is bounded; a lower tier's is the tier's
		 * own (it answers, or fails the read), tried every so often. */
		wt.retried = v->since != 0;
		wt.may_retry = !wt.retried || now - v->since < clk->reclaim_wait_ns;
		item_sqe(&v->it, &q);
		op_execute_held(s, c, &q, NULL, 0, out_base, out_cap, scr, &cqe,
				&wt, &b->hold);
		if (wt.retry) {
			v->retry_at = 0;
			if (wt.why == ENGINE_WAIT_DISK || wt.why == ENGINE_WAIT_REMOTE)
				v->retry_at = now + clk->tier_retry_ns;
			else if (!v->since)
				v->since = now; /* the reclaimer's clock: its wait only */
			v->why = (uint8_t)wt.why;
			ops_batch_user(s, c, b, i, &u);
			block(&k, v);
			continue;
		}
		v->state = OP_ITEM_LOGGED;
		if (wt.fence) {
			v->state = OP_ITEM_LANDING;
			v->eng = wt.eng;
			v->fence = wt.fence;
			v->cqe = cqe;
			block(&k, v);
		} else {
			log_put(sqe, b, out_base, &cqe);
		}
	}
	unhold(c, b);
	/* Users may have been looked up under the hold, or not at all. */
	for (uint32_t i = b->first; i < b->count; i++)
		if (b->v[i].state == OP_ITEM_UNRUN) {
			ops_batch_user(s, c, b, i, &u);
			unrun++;
		}
	return unrun;
}

bool ops_batch_holds(const struct op_batch *b, bool has_user, uint64_t user)
{
	for (uint32_t i = b->first; i < b->count; i++) {
		const struct op_batch_slot *v = &b->v[i];

		/* An item not run, or run with its onload in flight (as a
		 * parked completion), holds its user. */
		if (v->state == OP_ITEM_LOGGED)
			continue;
		if (!has_user || !v->has_user || v->user == user)
			return true;
	}
	return false;
}

bool ops_batch_settle(const struct kvp_sqe *sqe, struct op_batch *b,
		      unsigned char *out_base)
{
	for (uint32_t i = b->first; i < b->count; i++) {
		struct op_batch_slot *v = &b->v[i];

		if (v->state == OP_ITEM_LANDING &&
		    engine_fence_done(v->eng, v->fence)) {
			v->state = OP_ITEM_LOGGED;
			v->fence = 0;
			log_put(sqe, b, out_base, &v->cqe);
		}
		if (v->state == OP_ITEM_LOGGED && i == b->first)
			b->first++;
	}
	return b->first == b->count;
}

bool ops_batch_emit(const struct kvp_sqe *sqe, struct op_batch *b,
		    struct kvp_cqe *cqe)
{
	uint32_t n = b->nlog - b->emitted;

	if (!n && b->nlog != b->count)
		return false;
	*cqe = (struct kvp_cqe){ .tag = sqe->tag, .res = (int32_t)n,
				 .out_bytes = n * CQE_BYTES, .val0 = b->emitted,
				 .val1 = b->nlog == b->count };
	b->emitted = b->nlog;
	return true;
}

void ops_batch_free(struct op_batch *b)
{
	free(b);
}

void ops_batch_drop(struct op_batch *b)
{
	if (!b)
		return;
	for (uint32_t i = 0; i < b->count; i++)
		if (b->v[i].state == OP_ITEM_LANDING)
			engine_fence_wait(b->v[i].eng, b->v[i].fence);
	free(b);
}

bool ops_batch_has(const struct op_batch *b, uint8_t opcode)
{
	for (uint32_t i = 0; i < b->count; i++)
		if (b->v[i].it.opcode == opcode)
			return true;
	return false;
}
