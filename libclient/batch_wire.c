/* SPDX-License-Identifier: MIT */
/*
 * batch_wire.c - async operations go out as BATCH entries (proto.h, BATCH;
 * client_internal.h, THE BATCH RECORDS): held at kvp_queue_*(), pushed at
 * kvp_submit() one entry per lane, and a batch's completion expanded into
 * its items' completions before kvp_reap() sees them.
 *
 * Why: per entry the daemon's worker pays a copy, a CQ slot, a completion
 * publish and maybe a wake-up, and this side a completion poll; a batch
 * pays them once per lane (issue 32). Nothing above this file changes: an
 * item keeps its slot, its tag and its result slice, and its completion is
 * reaped by batch.c exactly as a plain entry's.
 *
 * Trust: a batch completion is believed only for a batch of this lane that
 * is in flight and was published, with res and out_bytes what its item
 * count says; each item completion only when its tag names the slot that
 * is item i of that batch. Anything else breaks the client (-EPROTO), as a
 * bad plain completion does (batch.c, kvpc_slot_of).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

#define REC_BYTES ((uint32_t)sizeof(struct kvp_batch_item))
#define CQE_BYTES ((uint32_t)sizeof(struct kvp_cqe))
#define BATCH_TAG (1ull << 63)
#define NONE UINT32_MAX

_Static_assert(sizeof(struct kvp_cqe) <= sizeof(struct kvp_batch_item),
	       "item completions are written over the items");

int kvpc_batch_setup(struct kvp_client *c)
{
	const char *env = getenv("KVPOOL_BATCH");

	c->pend = calloc(c->sq_entries, sizeof(*c->pend));
	if (!c->pend)
		return kvpc_err(c, -ENOMEM, "out of memory for %" PRIu32
				" completions", c->sq_entries);
	/* Two records at least, or every operation goes out plain; as it
	 * does with KVPOOL_BATCH=0 in the environment (kvpool(3): for a
	 * comparison, or a kvpoold that mishandles batches). */
	c->lane_recs = c->sync_bytes / c->nlanes / REC_BYTES;
	if (c->lane_recs < 2 || (env && !strcmp(env, "0")))
		c->lane_recs = 0;
	c->one_lane = env && !strcmp(env, "one") && c->lane_recs ?
		      (int32_t)(c->client_id % c->nlanes) : -1;
	c->one_max = 0;
	if (env && !strncmp(env, "auto", 4) && c->lane_recs && c->nlanes > 1) {
		char *end;
		unsigned long n = KVPC_ONE_MAX;

		if (env[4] == ':') {
			errno = 0;
			n = strtoul(env + 5, &end, 10);
			if (errno || end == env + 5 || *end || !n || n > UINT32_MAX)
				return kvpc_err(c, -EINVAL, "KVPOOL_BATCH=%s: auto:N "
						"needs N a count of operations, 1 or more "
						"(or plain auto: %u)", env, KVPC_ONE_MAX);
		} else if (env[4]) {
			return kvpc_err(c, -EINVAL, "KVPOOL_BATCH=%s: use 0, 1, one, "
					"auto or auto:N", env);
		}
		c->one_max = (uint32_t)n;
	}
	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct kvpc_lane *l = &c->lanes[k];

		l->held_first = l->held_last = NONE;
		l->bats = calloc(KVPC_LANE_BATCHES, sizeof(*l->bats));
		if (!l->bats)
			return kvpc_err(c, -ENOMEM, "out of memory for lane %" PRIu32
					"'s batches", k);
	}
	return 0;
}

void kvpc_batch_free(struct kvp_client *c)
{
	for (uint32_t k = 0; c->lanes && k < c->nlanes; k++) {
		free(c->lanes[k].bats);
		c->lanes[k].bats = NULL;
	}
	free(c->pend);
	c->pend = NULL;
}

void kvpc_hold(struct kvp_client *c, uint32_t idx)
{
	struct kvpc_slot *s = &c->slots[idx];
	struct kvpc_lane *l = &c->lanes[s->lane];

	s->stage = KVPC_SLOT_HELD;
	s->held_next = NONE;
	if (l->held_last == NONE)
		l->held_first = idx;
	else
		c->slots[l->held_last].held_next = idx;
	l->held_last = idx;
	l->nheld++;
}

static uint32_t held_pop(struct kvp_client *c, struct kvpc_lane *l)
{
	uint32_t idx = l->held_first;

	l->held_first = c->slots[idx].held_next;
	if (l->held_first == NONE)
		l->held_last = NONE;
	l->nheld--;
	return idx;
}

static unsigned char *lane_recs(struct kvp_client *c, uint32_t lane, uint32_t rec)
{
	return c->arena + c->sync_off +
	       ((size_t)lane * c->lane_recs + rec) * REC_BYTES;
}

/* A contiguous run of n records of lane l (a ring), or false. */
static bool recs_take(struct kvp_client *c, struct kvpc_lane *l, uint32_t n,
		      uint32_t *rec)
{
	uint32_t R = c->lane_recs, off, waste;

	if (n > R || l->bat_head - l->bat_tail >= KVPC_LANE_BATCHES)
		return false;
	off = l->rec_head % R;
	waste = off + n > R ? R - off : 0; /* the ring's end is skipped */
	if (l->rec_head - l->rec_tail + waste + n > R)
		return false;
	*rec = (off + waste) % R;
	l->rec_head += waste + n;
	return true;
}

static int push_plain(struct kvp_client *c, uint32_t lane, uint32_t idx)
{
	struct kvpc_slot *s = &c->slots[idx];

	s->stage = KVPC_SLOT_PLAIN;
	s->pos = c->lanes[lane].sq_tail;
	return kvpc_ring_push(c, lane, &s->sqe);
}

/* The shard an operation's user (or lease) belongs to. */
static uint32_t shard_of(const struct kvp_client *c, const struct kvp_sqe *q)
{
	if (q->opcode == KVP_OP_COMMIT || q->opcode == KVP_OP_RELEASE)
		return kvp_lane_of_lease(q->arg, c->shards, c->shards);
	return kvp_lane_of_user(q->user, c->shards, c->shards);
}

/* KVPOOL_BATCH=one: the n slots grouped by shard, stably (one user's
 * operations keep their order; the daemon takes each shard's lock once). */
static void by_shard(const struct kvp_client *c, uint32_t *idx, uint32_t n)
{
	for (uint32_t i = 1; i < n; i++) {
		uint32_t x = idx[i], k = shard_of(c, &c->slots[x].sqe), j = i;

		while (j && shard_of(c, &c->slots[idx[j - 1]].sqe) > k) {
			idx[j] = idx[j - 1];
			j--;
		}
		idx[j] = x;
	}
}

/* The first n held operations of lane as one BATCH entry at rec. */
static int push_batch(struct kvp_client *c, uint32_t lane, uint32_t n,
		      uint32_t rec)
{
	struct kvpc_lane *l = &c->lanes[lane];
	unsigned char *base = lane_recs(c, lane, rec);
	uint32_t seq = l->bat_head, idx[KVP_BATCH_MAX];
	struct kvp_sqe e = {
		.opcode = KVP_OP_BATCH, .n = n,
		.tag = BATCH_TAG | (uint64_t)lane << 40 | seq,
		.in_off = (uint32_t)(base - c->arena), .in_len = n * REC_BYTES,
		.out_off = (uint32_t)(base - c->arena), .out_len = n * REC_BYTES,
	};

	for (uint32_t i = 0; i < n; i++)
		idx[i] = held_pop(c, l);
	if (c->one_lane >= 0 && c->shards > 1)
		by_shard(c, idx, n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvpc_slot *s = &c->slots[idx[i]];
		struct kvp_batch_item it = {
			.tag = s->sqe.tag, .user = s->sqe.user, .arg = s->sqe.arg,
			.n = s->sqe.n, .opcode = s->sqe.opcode, .flags = s->sqe.flags,
			.out_off = s->sqe.out_off, .out_len = s->sqe.out_len,
		};

		memcpy(base + (size_t)i * REC_BYTES, &it, sizeof(it));
		s->stage = KVPC_SLOT_BATCH;
		s->batch_seq = seq;
		s->batch_i = (uint16_t)i;
		s->pos = l->sq_tail;
	}
	l->bats[seq % KVPC_LANE_BATCHES] = (struct kvpc_batch){
		.rec = rec, .rec_end = l->rec_head, .nitems = n, .pos = l->sq_tail,
	};
	l->bat_head++;
	/* Up to one completion per item (proto.h, BATCH): owed until its
	 * final one says how many it sent (expand). */
	l->cq_owed += n - 1;
	return kvpc_ring_push(c, lane, &e);
}

/* Move lane from's held operations, in order, behind lane to's (to < 0:
 * each to its shard's lane). */
static void held_move(struct kvp_client *c, uint32_t from, int32_t to)
{
	struct kvpc_lane *l = &c->lanes[from];

	/* Counted first: one whose shard's lane is from goes back on it. */
	for (uint32_t n = l->nheld; n; n--) {
		uint32_t idx = held_pop(c, l);
		struct kvpc_slot *s = &c->slots[idx];

		s->lane = to >= 0 ? (uint32_t)to : kvpc_lane_of(c, &s->sqe);
		kvpc_hold(c, idx);
	}
}

/*
 * KVPOOL_BATCH=auto: a submit of at most one_max operations goes to one
 * lane (client id % lanes; one worker, one entry: a lone client's small
 * batch is not split into a round trip per worker), a bigger one to its
 * shards' lanes (every worker takes its share). Order (proto.h, LANES):
 * every user's operations in flight must stay on one lane, so the choice
 * changes only when each lane an operation could leave is quiet (every
 * entry published on it seen completing: cq_owed 0). Going to one lane L,
 * the other lanes must be quiet (what L has in flight is its own shard's,
 * and the daemon ran everything of the others); leaving L, every lane must
 * be (L's in flight may be any shard's). Otherwise the submit
 * keeps the current choice, which is always safe.
 */
static void route(struct kvp_client *c)
{
	uint32_t L = c->client_id % c->nlanes, total = 0;
	bool one;

	for (uint32_t k = 0; k < c->nlanes; k++)
		total += c->lanes[k].nheld;
	one = total <= c->one_max;
	if (!total || one == (c->one_lane >= 0))
		return;
	for (uint32_t k = 0; k < c->nlanes; k++)
		if ((!one || k != L) && c->lanes[k].cq_owed)
			return;
	if (one) {
		for (uint32_t k = 0; k < c->nlanes; k++)
			if (k != L)
				held_move(c, k, (int32_t)L);
		c->one_lane = (int32_t)L;
	} else {
		held_move(c, L, -1); /* only L held any */
		c->one_lane = -1;
	}
}

int kvpc_flush(struct kvp_client *c)
{
	if (c->one_max)
		route(c);
	for (uint32_t k = 0; k < c->nlanes; k++) {
		struct kvpc_lane *l = &c->lanes[k];

		while (l->nheld) {
			uint32_t n = l->nheld < KVP_BATCH_MAX ? l->nheld : KVP_BATCH_MAX;
			uint32_t rec;

			if (n > c->lane_recs)
				n = c->lane_recs; /* a small arena's lane */
			int ret;

			if (n >= 2 && recs_take(c, l, n, &rec))
				ret = push_batch(c, k, n, rec);
			else
				ret = push_plain(c, k, held_pop(c, l));
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* ------------------------------------------------------------ completions */

static int pend_put(struct kvp_client *c, const struct kvp_cqe *cqe)
{
	if (c->pend_tail - c->pend_head >= c->sq_entries)
		return kvpc_fail(c, -EPROTO, "kvpoold at %s sent more completions "
				 "than operations are in flight; reconnect", c->path);
	c->pend[c->pend_tail++ % c->sq_entries] = *cqe;
	return 0;
}

static int bad_batch(struct kvp_client *c, const char *what, uint64_t tag)
{
	return kvpc_fail(c, -EPROTO, "kvpoold at %s sent a batch completion "
			 "(tag 0x%" PRIx64 ") %s; reconnect", c->path, tag, what);
}

/* Batch b failed whole (the daemon refused it; libkvpool sends none it
 * should): each item fails with its message. */
static int fail_items(struct kvp_client *c, uint32_t lane, uint32_t seq,
		      const struct kvp_cqe *cqe, const unsigned char *base)
{
	char msg[KVP_ERRLEN];
	uint32_t n = cqe->out_bytes < sizeof(msg) ? cqe->out_bytes : sizeof(msg) - 1;

	memcpy(msg, base, n);
	msg[n] = '\0';
	for (uint32_t idx = 0; idx < c->sq_entries; idx++) {
		struct kvpc_slot *s = &c->slots[idx];
		struct kvp_cqe it = { .res = cqe->res };
		uint32_t len;
		char *out;
		int ret;

		if (!s->busy || s->stage != KVPC_SLOT_BATCH || s->lane != lane ||
		    s->batch_seq != seq)
			continue;
		out = (char *)kvpc_slot_out(c, idx, &len);
		snprintf(out, len, "%s", msg);
		it.tag = s->sqe.tag;
		it.out_bytes = (uint32_t)strlen(out) + 1;
		s->stage = KVPC_SLOT_EXPANDED;
		if ((ret = pend_put(c, &it)))
			return ret;
	}
	return 0;
}

/* A BATCH completion taken from lane: its items' completions queued. */
static int expand(struct kvp_client *c, uint32_t lane, const struct kvp_cqe *cqe)
{
	struct kvpc_lane *l = &c->lanes[lane];
	uint32_t seq = (uint32_t)cqe->tag, n;
	struct kvpc_batch *b;
	const unsigned char *base;
	int ret = 0;

	if (((cqe->tag >> 40) & 0x7fffff) != lane || (cqe->tag >> 32 & 0xff) ||
	    seq - l->bat_tail >= l->bat_head - l->bat_tail)
		return bad_batch(c, "for no batch in flight on its lane", cqe->tag);
	b = &l->bats[seq % KVPC_LANE_BATCHES];
	if (b->done || (uint32_t)(b->pos - l->sq_published) <
		       l->sq_tail - l->sq_published)
		return bad_batch(c, "after its final one, or before it was sent",
				 cqe->tag);
	base = lane_recs(c, lane, b->rec);
	if (cqe->res < 0 && !b->answered &&
	    cqe->out_bytes <= b->nitems * REC_BYTES) {
		ret = fail_items(c, lane, seq, cqe, base);
		n = b->nitems;
	} else {
		/* res items from log index val0; val1: the final one. */
		n = cqe->res < 0 ? UINT32_MAX : (uint32_t)cqe->res;
		if (n > b->nitems - b->answered || cqe->val0 != b->answered ||
		    cqe->out_bytes != n * CQE_BYTES ||
		    cqe->val1 != (b->answered + n == b->nitems) || (!n && !cqe->val1))
			return bad_batch(c, "that does not follow its last one",
					 cqe->tag);
	}
	for (uint32_t i = 0; cqe->res >= 0 && i < n && !ret; i++) {
		struct kvp_cqe it;
		uint32_t idx;
		struct kvpc_slot *s;

		/* Copied out once; only the copy is looked at. */
		memcpy(&it, base + (size_t)(b->answered + i) * CQE_BYTES, sizeof(it));
		idx = (uint32_t)it.tag;
		if (idx >= c->sq_entries || !(s = &c->slots[idx])->busy ||
		    s->sqe.tag != it.tag || s->stage != KVPC_SLOT_BATCH ||
		    s->lane != lane || s->batch_seq != seq)
			return bad_batch(c, "with an item it did not carry", cqe->tag);
		s->stage = KVPC_SLOT_EXPANDED;
		ret = pend_put(c, &it);
	}
	if (ret)
		return ret;
	b->answered += n;
	b->ncqes++;
	if (b->answered < b->nitems)
		return 0;
	/* The last: what it did not send is owed no more, and its records
	 * come back once every batch sent before it is done. */
	l->cq_owed -= b->nitems - b->ncqes;
	b->done = 1;
	while (l->bat_tail != l->bat_head &&
	       l->bats[l->bat_tail % KVPC_LANE_BATCHES].done) {
		b = &l->bats[l->bat_tail++ % KVPC_LANE_BATCHES];
		l->rec_tail = b->rec_end;
		*b = (struct kvpc_batch){ 0 };
	}
	return 0;
}

int kvpc_pend_fill(struct kvp_client *c, int wait)
{
	int ready = wait ? kvpc_cq_wait(c, 1) : kvpc_cq_ready(c);

	for (int i = 0; i < ready; i++) {
		struct kvp_cqe cqe;
		uint32_t lane;
		int ret;

		kvpc_cq_take_lane(c, &cqe, &lane);
		ret = cqe.tag & BATCH_TAG ? expand(c, lane, &cqe) : pend_put(c, &cqe);
		if (ret)
			return ret;
	}
	return ready < 0 ? ready : (int)(c->pend_tail - c->pend_head);
}
