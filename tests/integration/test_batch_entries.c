/* SPDX-License-Identifier: MIT */
/*
 * test_batch_entries - BATCH ring entries (proto.h, BATCH; issue 32) against
 * a real kvpoold with two workers:
 *
 *   1. malformed batches, each written by hand into the ring (count 0, count
 *      over KVP_BATCH_MAX, in_len not 40 per item, an input or result range
 *      past the arena, a result range short of 32 per item, an item of an
 *      opcode a batch does not carry, an item's reserved field or flags, an
 *      item's result range past the arena, flags or a user on the batch
 *      entry itself): each is refused with -EINVAL and a message naming
 *      "batch", and the valid prepare item beside the bad one did not run
 *      (its user holds no lease); over the uds request mode a batch is
 *      refused too;
 *   2. good batches by hand: six prepares answered by one completion with
 *      six item completions (tags, leases, page tables in the items' own
 *      ranges); then one batch that commits, releases and prepares again
 *      in item order (a prepare after its user's commit in the same batch
 *      sees the commit), plus an item that fails alone (a gap, with its
 *      message and failure detail) while the others run;
 *   3. libkvpool's queue / submit / reap: 48 prepares over many users go
 *      out as at most one entry per lane, and come back as 48 completions
 *      with their own tags and leases; their commits and releases likewise;
 *      a failing item's completion carries its message and error info;
 *      with KVPOOL_BATCH=one the same as one entry on one lane, and with
 *      KVPOOL_BATCH=auto (48 <= 64 operations) too; KVPOOL_BATCH=auto:8
 *      sends 8 or fewer to one lane and more to their shards' lanes, but
 *      changes lanes only when every lane it leaves is quiet, and refuses
 *      auto:x at connect;
 *   4. kvp_ring_phases: queue, execute, publish and wake samples of those
 *      prepares.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"

static int g_bad;

#define CHECK(cond, ...) do { if (!(cond)) { h_fail(__VA_ARGS__); g_bad++; } } while (0)

#define IN_OFF 4096u     /* items, and the item completions over them */
#define ITEM_OFF 65536u  /* item i's result range: ITEM_OFF + i * ITEM_LEN */
#define ITEM_LEN 1024u

static uint32_t P; /* page tokens */

static struct kvp_batch_item prep(uint64_t tag, uint64_t user, uint64_t start,
				  uint32_t n, uint32_t i)
{
	return (struct kvp_batch_item){ .tag = tag, .user = user, .arg = start,
					.n = n, .opcode = KVP_OP_PREPARE,
					.out_off = ITEM_OFF + i * ITEM_LEN,
					.out_len = ITEM_LEN };
}

static struct kvp_batch_item end(uint8_t op, uint64_t tag, uint64_t lease,
				 uint32_t n, uint8_t flags, uint32_t i)
{
	return (struct kvp_batch_item){ .tag = tag, .arg = lease, .n = n,
					.opcode = op, .flags = flags,
					.out_off = ITEM_OFF + i * ITEM_LEN,
					.out_len = ITEM_LEN };
}

/* The batch entry for n items at IN_OFF, its results over them. */
static struct kvp_sqe batch_sqe(uint32_t n)
{
	uint32_t out = 32 * n < KVP_ERRLEN ? KVP_ERRLEN : 32 * n;

	return (struct kvp_sqe){ .opcode = KVP_OP_BATCH, .tag = 77, .n = n,
				 .in_off = IN_OFF, .in_len = 40 * n,
				 .out_off = IN_OFF, .out_len = out };
}

/* A pointer to a fresh batch entry of n items (a statement's lifetime). */
#define B(n) (&(struct kvp_sqe[1]){ batch_sqe(n) }[0])

static struct kvp_cqe run(struct h_raw *r, const struct kvp_sqe *e,
			  const struct kvp_batch_item *items, uint32_t n)
{
	struct kvp_cqe cqe = { .res = -ETIMEDOUT };

	if (items && n)
		memcpy(r->arena + IN_OFF, items, n * sizeof(*items));
	if (h_raw_call(r, e, &cqe, 1, 5000))
		cqe.res = -ETIMEDOUT;
	return cqe;
}

static struct kvp_user_info info(struct h_raw *r, uint64_t user)
{
	struct kvp_sqe e = { .opcode = KVP_OP_INFO, .tag = 5, .user = user,
			     .out_off = 0, .out_len = sizeof(struct kvp_user_info) };
	struct kvp_user_info u = { .leases = 99 };
	struct kvp_cqe cqe;

	if (h_raw_call(r, &e, &cqe, 1, 5000) || cqe.res < 0)
		h_fail("info(%" PRIu64 "): %d", user, cqe.res);
	else
		memcpy(&u, r->arena, sizeof(u));
	return u;
}

/* ------------------------------------------------------------ 1 */

static void refused(struct h_raw *r, const char *what, const struct kvp_sqe *e,
		    const struct kvp_batch_item *items, uint32_t n, uint64_t user)
{
	struct kvp_cqe cqe = run(r, e, items, n);
	const char *msg = (const char *)r->arena + e->out_off;
	struct kvp_user_info u;

	CHECK(cqe.res == -EINVAL, "%s: res %d, want -EINVAL", what, cqe.res);
	if (cqe.res == -EINVAL && e->out_len >= KVP_ERRLEN)
		CHECK(cqe.out_bytes && strstr(msg, "batch"),
		      "%s: the message does not say what was wrong: '%.*s'", what,
		      (int)cqe.out_bytes, msg);
	h_log("%s: %d %.*s", what, cqe.res,
	      e->out_len >= KVP_ERRLEN ? (int)cqe.out_bytes : 0, msg);
	u = info(r, user);
	CHECK(u.leases == 0 && u.len == 0,
	      "%s: the valid item ran anyway (user %" PRIu64 ": %u leases)", what,
	      user, u.leases);
}

static void part_malformed(struct h_raw *r)
{
	const uint32_t A = r->hdr.arena_bytes;
	struct kvp_batch_item it[2];
	struct kvp_sqe e;
	uint64_t u = 1000;

	e = batch_sqe(0);
	e.in_len = 0;
	refused(r, "count 0", &e, NULL, 0, u);

	it[0] = prep(1, ++u, 0, P, 0);
	it[1] = prep(2, u + 500, 0, P, 1);
	e = batch_sqe(2);
	e.n = KVP_BATCH_MAX + 1;
	e.in_len = 40 * e.n;
	refused(r, "count over KVP_BATCH_MAX", &e, it, 2, u);

	it[0] = prep(1, ++u, 0, P, 0);
	e = batch_sqe(2);
	e.in_len = 40;
	refused(r, "in_len short of 40 per item", &e, it, 2, u);
	e.in_len = 88;
	refused(r, "in_len past 40 per item", &e, it, 2, u);

	it[0] = prep(1, ++u, 0, P, 0);
	e = batch_sqe(2);
	e.in_off = A - 40;
	refused(r, "items past the arena", &e, it, 2, u);
	e.in_off = 0xfffffff0u;
	refused(r, "items wrapping 2^32", &e, it, 2, u);

	it[0] = prep(1, ++u, 0, P, 0);
	e = batch_sqe(2);
	e.out_len = 32;
	refused(r, "out_len short of 32 per item", &e, it, 2, u);
	e = batch_sqe(2);
	e.out_off = A - 16;
	e.out_len = 64;
	refused(r, "results past the arena", &e, it, 2, u);

	it[0] = prep(1, ++u, 0, P, 0);
	it[1] = prep(2, u + 500, 0, P, 1);
	it[1].opcode = KVP_OP_EVICT;
	refused(r, "an EVICT item", B(2), it, 2, u);
	it[1].opcode = KVP_OP_BATCH;
	refused(r, "a BATCH item", B(2), it, 2, u);
	it[1].opcode = 200;
	refused(r, "an unknown item opcode", B(2), it, 2, u);

	it[0] = prep(1, ++u, 0, P, 0);
	it[1] = prep(2, u + 500, 0, P, 1);
	it[1].rsv = 1;
	refused(r, "an item's rsv", B(2), it, 2, u);
	it[1] = prep(2, u + 500, 0, P, 1);
	it[1].flags = KVP_SQE_RELEASE;
	refused(r, "RELEASE on a prepare item", B(2), it, 2, u);
	it[1] = end(KVP_OP_COMMIT, 2, 12345, 1, KVP_SQE_ALL, 1);
	refused(r, "ALL on a commit item", B(2), it, 2, u);
	it[1] = prep(2, u + 500, 0, P, 1);
	it[1].out_off = A - 100;
	it[1].out_len = 200;
	refused(r, "an item's results past the arena", B(2),
		it, 2, u);

	it[0] = prep(1, ++u, 0, P, 0);
	it[1] = prep(2, u + 500, 0, P, 1);
	e = batch_sqe(2);
	e.flags = KVP_SQE_RELEASE;
	refused(r, "flags on the batch", &e, it, 2, u);
	e = batch_sqe(2);
	e.user = 5;
	refused(r, "a user on the batch", &e, it, 2, u);
	e = batch_sqe(2);
	e.arg = 5;
	refused(r, "an arg on the batch", &e, it, 2, u);

	/* The uds request mode has no arena. */
	{
		struct kvp_sqe q = batch_sqe(2);
		struct kvp_cqe cqe;
		char out[KVP_ERRLEN];
		int rc = h_uds_call(r->sock, &q, &cqe, out, sizeof(out));

		CHECK(rc == 0 && cqe.res == -EINVAL,
		      "a batch over uds: rc %d res %d", rc, cqe.res);
	}
	/* And the ring still serves. */
	it[0] = prep(1, ++u, 0, P, 0);
	{
		struct kvp_cqe cqe = run(r, B(1), it, 1);

		CHECK(cqe.res == 1, "a good batch after the bad ones: %d", cqe.res);
	}
}

/* ------------------------------------------------------------ 2 */

static const struct kvp_cqe *item_cqe(struct h_raw *r, uint32_t i)
{
	return (const struct kvp_cqe *)(r->arena + IN_OFF) + i;
}

static const struct kvp_prepare_out *item_lease(struct h_raw *r, uint32_t i)
{
	return (const struct kvp_prepare_out *)(r->arena + ITEM_OFF + i * ITEM_LEN);
}

static void part_good(struct h_raw *r)
{
	struct kvp_batch_item it[8];
	uint64_t lease[7] = { 0 };
	struct kvp_user_info u;
	struct kvp_cqe cqe;
	const struct kvp_cqe *ic;
	uint64_t first, last;

	for (uint32_t i = 0; i < 6; i++)
		it[i] = prep(100 + i, 1 + i, 0, P, i);
	cqe = run(r, B(6), it, 6);
	CHECK(cqe.res == 6 && cqe.out_bytes == 6 * 32 && cqe.tag == 77 &&
	      cqe.val0 == 0 && cqe.val1 == 1,
	      "six prepares: res %d out_bytes %u tag %" PRIu64, cqe.res,
	      cqe.out_bytes, cqe.tag);
	for (uint32_t i = 0; i < 6 && cqe.res == 6; i++) {
		const struct kvp_prepare_out *po = item_lease(r, i);

		ic = item_cqe(r, i);
		CHECK(ic->tag == 100 + i && ic->res == 0 &&
		      ic->out_bytes == sizeof(*po) + 4 && ic->val0 == po->lease &&
		      po->npages == 1 && po->n_new == P && po->len == 0,
		      "prepare item %u: tag %" PRIu64 " res %d out_bytes %u npages %u",
		      i, ic->tag, ic->res, ic->out_bytes, po->npages);
		lease[i + 1] = po->lease;
	}
	/*
	 * In item order: commit+release users 1..3, release 4, commit 5 (its
	 * lease stays), prepare user 1 at P (sees item 0's commit), user 2 at
	 * 3P (a gap: fails alone), user 7 from 5 (new: any start).
	 */
	it[0] = end(KVP_OP_COMMIT, 200, lease[1], P, KVP_SQE_RELEASE, 0);
	it[1] = end(KVP_OP_COMMIT, 201, lease[2], P, KVP_SQE_RELEASE, 1);
	it[2] = end(KVP_OP_COMMIT, 202, lease[3], P / 2, KVP_SQE_RELEASE, 2);
	it[3] = end(KVP_OP_RELEASE, 203, lease[4], 0, 0, 3);
	it[4] = end(KVP_OP_COMMIT, 204, lease[5], P, 0, 4);
	it[5] = prep(205, 1, P, 2 * P, 5);
	it[6] = prep(206, 2, 3 * P, P, 6);
	it[7] = prep(207, 7, 5, 1, 7);
	cqe = run(r, B(8), it, 8);
	CHECK(cqe.res == 8, "the mixed batch: res %d", cqe.res);
	if (cqe.res != 8)
		return;
	for (uint32_t i = 0; i < 8; i++) {
		ic = item_cqe(r, i);
		CHECK(ic->tag == 200 + i, "item %u: tag %" PRIu64, i, ic->tag);
		CHECK(i == 6 ? ic->res == -EINVAL : ic->res == 0,
		      "item %u: res %d (%.*s)", i, ic->res,
		      ic->res < 0 ? (int)ic->out_bytes : 0,
		      (const char *)item_lease(r, i));
	}
	CHECK(item_lease(r, 5)->start + item_lease(r, 5)->len == P &&
	      item_lease(r, 5)->npages == 3,
	      "the prepare after the commit in the same batch: len %" PRIu64
	      " npages %u", item_lease(r, 5)->len, item_lease(r, 5)->npages);
	ic = item_cqe(r, 6);
	CHECK(strstr((const char *)item_lease(r, 6), "missing tokens") != NULL,
	      "the gap's message: '%.*s'", (int)ic->out_bytes,
	      (const char *)item_lease(r, 6));
	CHECK(kvp_cqe_detail_get(ic, &first, &last) == KVP_ERROR_GAP &&
	      first == P && last == 3 * P - 1,
	      "the gap's detail: %" PRIu64 "..%" PRIu64, first, last);
	u = info(r, 1);
	CHECK(u.len == P && u.leases == 1, "user 1: len %" PRIu64 " leases %u",
	      u.len, u.leases);
	u = info(r, 3);
	CHECK(u.len == P / 2 && u.leases == 0, "user 3: len %" PRIu64 " leases %u",
	      u.len, u.leases);
	u = info(r, 4);
	CHECK(u.len == 0 && u.leases == 0, "user 4: len %" PRIu64 " leases %u",
	      u.len, u.leases);
	u = info(r, 5);
	CHECK(u.len == P && u.leases == 1, "user 5: len %" PRIu64 " leases %u",
	      u.len, u.leases);
	u = info(r, 7);
	CHECK(u.leases == 1, "user 7: leases %u", u.leases);
}

/* ------------------------------------------------------------ 3 */

#define NQ 48u

static uint32_t entries_published(const struct kvp_client *c)
{
	uint32_t n = 0;

	for (uint32_t k = 0; k < c->nlanes; k++)
		n += c->lanes[k].sq_published;
	return n;
}

static void part_library(const char *sock, const char *mode)
{
	struct kvp_client *c;

	struct kvp_completion cq[NQ];
	uint64_t lease[NQ] = { 0 };
	struct kvp_error_info ei;
	/* this run's users */
	uint64_t ub = !mode ? 5000 : !strcmp(mode, "one") ? 6000 : 8000;
	uint32_t e0, e1, got = 0, max_entries;
	int n;

	if (mode)
		setenv("KVPOOL_BATCH", mode, 1);
	else
		unsetenv("KVPOOL_BATCH"); /* batches, whatever ctest's is */
	c = h_connect_or_fail(sock, "batch-lib", 5000);
	unsetenv("KVPOOL_BATCH");
	if (!c) {
		g_bad++;
		return;
	}
	for (uint32_t i = 0; i < NQ; i++)
		CHECK(kvp_queue_prepare(c, ub + i, 0, P, 1000 + i) == 0,
		      "queue_prepare %u: %s", i, kvp_last_error(c));
	e0 = entries_published(c);
	n = kvp_submit(c);
	e1 = entries_published(c);
	CHECK(n == (int)NQ, "submit: %d", n);
	/* KVPOOL_BATCH=one: a single entry, on one lane. */
	max_entries = mode && (!strcmp(mode, "one") || !strcmp(mode, "auto")) ?
		      1 : c->nlanes;
	CHECK(e1 - e0 <= max_entries,
	      "%u prepares went out as %u entries over %u lanes (%s)", NQ, e1 - e0,
	      c->nlanes, mode ? mode : "default");
	h_log("%u prepares: %u ring entries (%u lanes, %s)", NQ, e1 - e0, c->nlanes,
	      mode ? mode : "default");
	while (got < NQ) {
		n = kvp_reap(c, cq, 7, 1); /* fewer than a batch at a time */
		if (n <= 0) {
			CHECK(0, "reap: %d %s", n, kvp_last_error(c));
			break;
		}
		for (int j = 0; j < n; j++) {
			uint64_t i = cq[j].tag - 1000;

			CHECK(i < NQ && !lease[i] && cq[j].res == 0 &&
			      cq[j].op == KVP_ASYNC_PREPARE && cq[j].lease.user == ub + i &&
			      cq[j].lease.npages == 1,
			      "prepare completion tag %" PRIu64 ": res %d user %" PRIu64,
			      cq[j].tag, cq[j].res, cq[j].lease.user);
			if (i < NQ)
				lease[i] = cq[j].lease.id;
		}
		got += (uint32_t)n;
	}
	for (uint32_t i = 0; i < NQ; i++)
		CHECK(kvp_queue_commit(c, lease[i], P, 1, 2000 + i) == 0,
		      "queue_commit %u: %s", i, kvp_last_error(c));
	/* A gap: fails alone, with its message and detail. */
	CHECK(kvp_queue_prepare(c, ub, 5 * P, 1, 3000) == 0, "queue gap");
	e0 = entries_published(c);
	CHECK(kvp_submit(c) == (int)NQ + 1, "submit commits");
	e1 = entries_published(c);
	CHECK(e1 - e0 <= max_entries, "%u commits: %u entries", NQ + 1, e1 - e0);
	for (got = 0; got < NQ + 1;) {
		n = kvp_reap(c, cq, NQ, 1);
		if (n <= 0) {
			CHECK(0, "reap commits: %d %s", n, kvp_last_error(c));
			break;
		}
		for (int j = 0; j < n; j++) {
			if (cq[j].tag == 3000) {
				CHECK(cq[j].res == -EINVAL && cq[j].error &&
				      strstr(cq[j].error, "missing tokens"),
				      "the gap: %d %s", cq[j].res,
				      cq[j].error ? cq[j].error : "(none)");
				CHECK(kvp_completion_error_info(c, &cq[j], &ei) == 0 &&
				      ei.kind == KVP_ERROR_GAP && ei.first == P,
				      "the gap's error info: kind %u first %" PRIu64,
				      ei.kind, ei.first);
				continue;
			}
			CHECK(cq[j].tag >= 2000 && cq[j].tag < 2000 + NQ && cq[j].res == 0 &&
			      cq[j].op == KVP_ASYNC_COMMIT,
			      "commit completion tag %" PRIu64 ": res %d %s", cq[j].tag,
			      cq[j].res, cq[j].error ? cq[j].error : "");
		}
		got += (uint32_t)n;
	}
	for (uint32_t i = 0; i < NQ; i += 7) {
		struct kvp_user_info u;

		CHECK(kvp_info(c, ub + i, &u) == 0 && u.len == P && u.leases == 0,
		      "user %" PRIu64 ": len %" PRIu64 " leases %u", ub + i, u.len, u.leases);
	}
	kvp_close(c);
}

/* ------------------------------------------------------------ 4 */

/*
 * kvp_ring_phases (kvpool.h): after rounds of batched and plain prepares,
 * each phase has samples, and a non-admin cannot read them.
 */
static void part_phases(const char *sock)
{
	struct kvp_client *c = h_connect_or_fail(sock, "batch-phases", 5000);
	struct kvp_ring_phases p0, p1;
	struct kvp_completion cq[8];
	struct kvp_lease l;

	if (!c) {
		g_bad++;
		return;
	}
	CHECK(kvp_ring_phases(c, &p0) == 0, "ring_phases: %s", kvp_last_error(c));
	for (uint32_t r = 0; r < 50; r++) {
		uint32_t got = 0;

		for (uint32_t i = 0; i < 8; i++)
			kvp_queue_prepare(c, 7000 + i, r * P, P, i);
		kvp_submit(c);
		while (got < 8) {
			int n = kvp_reap(c, cq + got, 8 - got, 1);

			if (n <= 0)
				break;
			got += (uint32_t)n;
		}
		for (uint32_t i = 0; i < got; i++)
			kvp_queue_commit(c, cq[i].lease.id, P, 1, i);
		kvp_submit(c);
		for (got = 0; got < 8;) {
			int n = kvp_reap(c, cq, 8, 1);

			if (n <= 0)
				break;
			got += (uint32_t)n;
		}
		if (kvp_prepare(c, 7100, r * P, P, &l) == 0)
			kvp_commit(c, l.id, P), kvp_release(c, l.id);
	}
	CHECK(kvp_ring_phases(c, &p1) == 0, "ring_phases: %s", kvp_last_error(c));
	for (int k = 0; k < KVP_PHASES; k++) {
		uint64_t n = p1.phase[k].count - p0.phase[k].count;

		h_log("phase %d: %" PRIu64 " samples, mean %" PRIu64 " ns", k, n,
		      n ? (p1.phase[k].sum_ns - p0.phase[k].sum_ns) / n : 0);
		CHECK(n >= 20, "phase %d: %" PRIu64 " samples after 100 prepare "
		      "entries", k, n);
	}
	CHECK(p1.bucket_ns[KVP_LAT_BUCKETS - 1] == UINT64_MAX,
	      "the last bucket is not +Inf");
	kvp_close(c);
}

/* Reap n completions (leases into lease[], by tag - tag0), or fail. */
static void reap_n(struct kvp_client *c, uint32_t n, uint64_t tag0,
		   uint64_t *lease, const char *what)
{
	struct kvp_completion cq[NQ];

	for (uint32_t got = 0; got < n;) {
		int r = kvp_reap(c, cq, NQ, 1);

		if (r <= 0) {
			CHECK(0, "%s: reap: %d %s", what, r, kvp_last_error(c));
			return;
		}
		for (int j = 0; j < r; j++) {
			CHECK(cq[j].res == 0, "%s: tag %" PRIu64 ": %d %s", what,
			      cq[j].tag, cq[j].res, cq[j].error ? cq[j].error : "");
			if (lease && cq[j].tag - tag0 < NQ)
				lease[cq[j].tag - tag0] = cq[j].lease.id;
		}
		got += (uint32_t)r;
	}
}

/* Queue n prepares of users ub.. (tags tag0..) and submit them; true when
 * each went to the lane the mode says (L: one lane; -1: its shard's). */
static bool submit_on(struct kvp_client *c, uint64_t ub, uint32_t n,
		      uint64_t tag0, int32_t L, const char *what)
{
	uint32_t idx[NQ], e0, e1;
	bool ok = true;

	for (uint32_t i = 0; i < n; i++) {
		int r = kvp_queue_prepare(c, ub + i, 0, P, tag0 + i);

		CHECK(r >= 0, "%s: queue_prepare: %s", what, kvp_last_error(c));
		idx[i] = r >= 0 ? (uint32_t)r : 0;
	}
	e0 = entries_published(c);
	CHECK(kvp_submit(c) == (int)n, "%s: submit", what);
	e1 = entries_published(c);
	for (uint32_t i = 0; i < n; i++) {
		const struct kvpc_slot *s = &c->slots[idx[i]];

		ok &= s->lane == (L >= 0 ? (uint32_t)L :
				   kvp_lane_of_user(s->sqe.user, c->shards, c->nlanes));
	}
	CHECK(ok, "%s: operations went to the wrong lane (mode %d)", what, (int)L);
	CHECK(L < 0 || e1 - e0 == 1, "%s: %u entries on one lane", what, e1 - e0);
	h_log("%s: %u prepares, %u entries, lane %d", what, n, e1 - e0, (int)L);
	return ok;
}

/*
 * KVPOOL_BATCH=auto:8: a submit of 8 or fewer goes to one lane, a bigger
 * one to its shards' lanes; but the choice changes only when every lane
 * the operations could leave is quiet, so no user is ever in flight on
 * two lanes (proto.h, LANES: order).
 */
static void part_auto(const char *sock)
{
	uint64_t lease[NQ] = { 0 }, ub = 7000;
	struct kvp_client *c;
	int32_t L;

	struct kvp_connect_opts o = { .socket = sock, .name = "batch-auto-bad" };
	char err[KVP_ERRLEN] = "";
	int r;

	setenv("KVPOOL_BATCH", "auto:x", 1);
	r = kvp_connect(&c, &o, err, sizeof(err));
	CHECK(r == -EINVAL && strstr(err, "KVPOOL_BATCH=auto:x"),
	      "KVPOOL_BATCH=auto:x: %d %s", r, err);
	if (!r)
		kvp_close(c);
	setenv("KVPOOL_BATCH", "auto:8", 1);
	c = h_connect_or_fail(sock, "batch-auto", 5000);
	unsetenv("KVPOOL_BATCH");
	if (!c) {
		g_bad++;
		return;
	}
	L = (int32_t)(c->client_id % c->nlanes);
	CHECK(c->one_max == 8 && c->one_lane == -1, "auto:8: one_max %u lane %d",
	      c->one_max, c->one_lane);
	/* Small, all quiet: one lane. */
	submit_on(c, ub, 4, 100, L, "4 of auto:8");
	/* Big, but L is busy: still L. */
	submit_on(c, ub + 4, 20, 104, L, "20 behind 4 in flight");
	reap_n(c, 24, 100, lease, "auto 24");
	for (uint32_t i = 0; i < 24; i++)
		CHECK(kvp_queue_release(c, lease[i], 200 + i) == 0, "release %u", i);
	CHECK(kvp_submit(c) == 24, "auto: submit releases");
	reap_n(c, 24, 200, NULL, "auto releases");
	/* Big, all quiet: every user on its shard's lane. */
	submit_on(c, ub + 100, 20, 300, -1, "20 quiet");
	CHECK(c->one_lane == -1, "auto: still one lane after a big quiet submit");
	/* Small, but other lanes are busy: stays spread. */
	submit_on(c, ub + 120, 3, 320, -1, "3 behind 20 in flight");
	reap_n(c, 23, 300, lease, "auto 23");
	kvp_close(c);
}

int main(int argc, char **argv)
{
	struct h_daemon d;
	char err[KVP_ERRLEN];
	uint64_t t0 = h_now_ms();
	struct h_raw r;

	h_init(argc, argv, "test_batch_entries");
	if (h_daemon_dir(&d, 0) ||
	    h_daemon_start(&d, 10000, "--device_mem=4M", "--host_mem=16M",
			   "--workers=2", (char *)NULL))
		return h_daemon_end(&d, 1);
	if (h_raw_attach(&r, d.sock, 0, 0, err, sizeof(err))) {
		h_fail("raw attach: %s", err);
		return h_daemon_end(&d, 1);
	}
	P = r.w.layout.page_tokens;
	part_malformed(&r);
	part_good(&r);
	h_raw_detach(&r);
	part_library(d.sock, NULL);
	part_library(d.sock, "one");
	part_library(d.sock, "auto");
	part_auto(d.sock);
	part_phases(d.sock);
	return h_daemon_finish(&d, g_bad, t0);
}
