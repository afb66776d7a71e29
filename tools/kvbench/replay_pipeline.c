/* SPDX-License-Identifier: MIT */
/*
 * replay_pipeline.c - one pipeline's loop (replay.h): batches of its
 * requests, each batch in the HSTU example's phases, every call timed.
 *
 * HIT ACCOUNTING. A request needs trace_tokens(end) tokens; the history the
 * prepare found (lease len) is what was not recomputed, the rest is
 * appended. When the history went between info and prepare (another
 * pipeline's prepare evicted it), the prepare would start a history at the
 * wrong place: that lease is released and the whole request prepared again
 * from position 0 (counted in reprepares).
 *
 * APPENDS are timed per lease, or per batch where the system appends a
 * batch with one call (append_batch: the GPU's one launch).
 *
 * A FULL POOL. When every frame the prepare could take is pinned by leases
 * (this pipeline's batch and the others'), the prepare fails with -ENOMEM:
 * the pipeline finishes the requests of its batch it holds leases for, then
 * tries again, waiting a little while it holds none (the others will
 * release theirs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "replay.h"

#define PINNED_RETRIES 20000   /* x 50 us: a second of a pool all pinned */

struct slot {
	const struct trace_req *q;
	uint64_t key, need, len;
	struct rlease l;
	bool prepared;
	bool redo;      /* batched prepare failed for want of frames, or raced */
};

#define MAX_BATCH 4096u

struct batch {
	struct rpipe *p;
	const struct rsys_ops *ops;
	void *ctx;
	struct slot s[MAX_BATCH];
	int32_t *idx[MAX_BATCH];        /* each slot's page table buffer */
	unsigned char *tail[MAX_BATCH]; /* and partial page buffer (redis) */
	struct rbatch_item it[MAX_BATCH];
	uint32_t n;
};

static int fail(struct rpipe *p, const struct rsys_ops *ops, void *ctx, int rc,
		const char *what, uint64_t key)
{
	snprintf(p->out->err, sizeof(p->out->err), "%s: %s of user %" PRIu64 " date %" PRIu64
		 " failed (%d, %s): %s", ops->name, what, (key >> 32) & 0xffffff,
		 key & 0xffffffff, rc, strerror(-rc), ops->error(ctx));
	p->out->status = rc ? rc : -EIO;
	return p->out->status;
}

static void sample(struct rpipe *p, enum rop op, uint64_t ns)
{
	uint32_t *n = &p->out->nsamples[op];

	if (*n < REPLAY_SAMPLES_CAP)
		p->samples[op][(*n)++] = ns;
}

/* Append, commit and release the prepared slots from first on. */
static int finish(struct batch *b, uint32_t first)
{
	struct rpipe *p = b->p;
	uint64_t t0, t1;
	int rc;

	for (uint32_t i = first; i < b->n; i++) {
		struct slot *s = &b->s[i];

		if (!s->prepared || !s->l.n_new)
			continue;
		t0 = now_ns();
		rc = b->ops->append(b->ctx, &s->l, p->kv);
		t1 = now_ns();
		if (rc)
			return fail(p, b->ops, b->ctx, rc, "append", s->key);
		sample(p, OP_APPEND, t1 - t0);
	}
	for (uint32_t i = first; i < b->n; i++) {
		struct slot *s = &b->s[i];

		if (!s->prepared)
			continue;
		if (!b->ops->commit) {
			s->prepared = false;
			p->out->appended += s->l.n_new;
			continue;
		}
		t0 = now_ns();
		rc = b->ops->commit(b->ctx, &s->l);
		t1 = now_ns();
		if (rc)
			return fail(p, b->ops, b->ctx, rc, "commit", s->key);
		sample(p, OP_COMMIT, t1 - t0);
		s->prepared = false;
		p->out->appended += s->l.n_new;
	}
	return 0;
}

/* A prepare that holds the request's history: time and count it. */
static void prepared(struct rpipe *p, struct slot *s, uint64_t ns)
{
	sample(p, s->l.onloaded_pages ? OP_PREPARE_ONLOAD : OP_PREPARE, ns);
	if (s->l.onloaded_pages) {
		p->out->onload_pages += s->l.onloaded_pages;
		p->out->onload_ns += ns;
	}
	s->prepared = true;
	p->out->hit += s->l.len;
	p->out->needed += s->need;
	if (p->nbuckets) {
		uint64_t bk = s->q->ts_ms > p->t0_ms ? (s->q->ts_ms - p->t0_ms) / p->bucket_ms : 0;

		if (bk >= p->nbuckets)
			bk = p->nbuckets - 1;
		p->bucket_needed[bk] += s->need;
		p->bucket_hit[bk] += s->l.len;
	}
}

/* Prepare slot i, finishing the batch's earlier slots if the pool is full. */
static int prepare(struct batch *b, uint32_t i, uint32_t *finished)
{
	struct rpipe *p = b->p;
	struct slot *s = &b->s[i];
	uint64_t pos = s->len, n_new = s->need - s->len, t0, t1;
	int rc, tries = 0;

	for (;;) {
		t0 = now_ns();
		rc = b->ops->prepare(b->ctx, s->key, pos, (uint32_t)n_new, &s->l);
		t1 = now_ns();
		if (rc == -ENOMEM && *finished < i) {
			rc = finish(b, *finished);
			if (rc)
				return rc;
			*finished = i;
			p->out->pinned_waits++;
			continue;
		}
		if (rc == -ENOMEM && ++tries < PINNED_RETRIES) {
			struct timespec ts = { 0, 50000 };

			p->out->pinned_waits++;
			nanosleep(&ts, NULL);
			continue;
		}
		if (rc)
			return fail(p, b->ops, b->ctx, rc, "prepare", s->key);
		if (s->l.start == 0 && s->l.len + s->l.n_new == s->need)
			break;
		/* The history went (or moved) since info: start it again. */
		rc = b->ops->release(b->ctx, &s->l);
		if (rc)
			return fail(p, b->ops, b->ctx, rc, "release", s->key);
		p->out->reprepares++;
		pos = 0;
		n_new = s->need;
	}
	prepared(p, s, t1 - t0);
	return 0;
}

static int run_batch(struct batch *b)
{
	struct rpipe *p = b->p;
	uint32_t finished = 0;
	uint64_t t0, t1;
	int rc;

	for (uint32_t i = 0; i < b->n; i++) {
		struct slot *s = &b->s[i];

		t0 = now_ns();
		rc = b->ops->info(b->ctx, s->key, &s->len);
		t1 = now_ns();
		if (rc)
			return fail(p, b->ops, b->ctx, rc, "info", s->key);
		sample(p, OP_INFO, t1 - t0);
		if (s->len > s->need) {
			snprintf(p->out->err, sizeof(p->out->err), "%s: user %u on %u holds %" PRIu64
				 " tokens, more than the %" PRIu64 " of its history: is another "
				 "program using these user ids?", b->ops->name, s->q->user,
				 s->q->date, s->len, s->need);
			return p->out->status = -EPROTO;
		}
	}
	for (uint32_t i = 0; i < b->n; i++) {
		rc = prepare(b, i, &finished);
		if (rc)
			return rc;
	}
	return finish(b, finished);
}

/*
 * The same phases with one submission per phase (ops with batch calls).
 * Requests whose prepare failed for want of frames, or found the history
 * gone, are done one by one after the rest of the batch has committed.
 */
static int run_batch_batched(struct batch *b)
{
	struct rpipe *p = b->p;
	struct rbatch_item *it = b->it;
	uint32_t n = b->n, m = 0;
	int rc;

	for (uint32_t i = 0; i < n; i++)
		it[i] = (struct rbatch_item){ .key = b->s[i].key };
	rc = b->ops->info_batch(b->ctx, it, n);
	for (uint32_t i = 0; i < n && !rc; i++) {
		struct slot *s = &b->s[i];

		if (it[i].rc)
			return fail(p, b->ops, b->ctx, it[i].rc, "info", s->key);
		sample(p, OP_INFO, it[i].lat_ns);
		s->len = it[i].len;
		if (s->len > s->need)
			return fail(p, b->ops, b->ctx, -EPROTO, "info (more tokens cached than "
				    "the history has)", s->key);
		it[i] = (struct rbatch_item){ .key = s->key, .pos = s->len,
					      .n_new = (uint32_t)(s->need - s->len), .l = &s->l };
	}
	if (!rc)
		rc = b->ops->prepare_batch(b->ctx, it, n);
	if (rc)
		return fail(p, b->ops, b->ctx, rc, "batch", b->s[0].key);
	for (uint32_t i = 0; i < n; i++) {
		struct slot *s = &b->s[i];

		if (it[i].rc == -ENOMEM) {
			s->redo = true;
			p->out->pinned_waits++;
		} else if (it[i].rc) {
			return fail(p, b->ops, b->ctx, it[i].rc, "prepare", s->key);
		} else if (s->l.start || s->l.len + s->l.n_new != s->need) {
			s->redo = true;
		} else {
			prepared(p, s, it[i].lat_ns);
		}
	}
	/* One launch for the batch (GPU), before anything else is submitted:
	 * the leases' page tables are the arena's until then. */
	if (b->ops->append_batch) {
		struct rlease *ls[MAX_BATCH];
		uint32_t nl = 0;
		uint64_t t0, t1;

		for (uint32_t i = 0; i < n; i++)
			if (b->s[i].prepared && b->s[i].l.n_new)
				ls[nl++] = &b->s[i].l;
		if (nl) {
			t0 = now_ns();
			rc = b->ops->append_batch(b->ctx, ls, nl);
			t1 = now_ns();
			if (rc)
				return fail(p, b->ops, b->ctx, rc, "append batch", ls[0]->key);
			sample(p, OP_APPEND, t1 - t0);
		}
	}
	/* Raced leases go back before anything else is submitted. */
	for (uint32_t i = 0; i < n; i++) {
		struct slot *s = &b->s[i];

		if (s->redo && it[i].rc == 0) {
			rc = b->ops->release(b->ctx, &s->l);
			if (rc)
				return fail(p, b->ops, b->ctx, rc, "release", s->key);
			p->out->reprepares++;
			s->len = 0;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		struct slot *s = &b->s[i];
		uint64_t t0, t1;

		if (!s->prepared)
			continue;
		if (s->l.n_new && !b->ops->append_batch) {
			t0 = now_ns();
			rc = b->ops->append(b->ctx, &s->l, p->kv);
			t1 = now_ns();
			if (rc)
				return fail(p, b->ops, b->ctx, rc, "append", s->key);
			sample(p, OP_APPEND, t1 - t0);
		}
		it[m++] = (struct rbatch_item){ .key = s->key, .l = &s->l };
	}
	if (m && (rc = b->ops->commit_batch(b->ctx, it, m)))
		return fail(p, b->ops, b->ctx, rc, "commit batch", it[0].key);
	for (uint32_t i = 0; i < m; i++) {
		if (it[i].rc)
			return fail(p, b->ops, b->ctx, it[i].rc, "commit", it[i].key);
		sample(p, OP_COMMIT, it[i].lat_ns);
		p->out->appended += it[i].l->n_new;
	}
	for (uint32_t i = 0; i < n; i++)
		b->s[i].prepared = false;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t finished = i;

		if (!b->s[i].redo)
			continue;
		rc = prepare(b, i, &finished);
		if (!rc)
			rc = finish(b, i);
		if (rc)
			return rc;
	}
	return 0;
}

int rpipe_run(struct rpipe *p, const struct rsys_ops *ops, void *ctx)
{
	static struct batch b; /* one pipeline per process (or one at a time) */
	size_t next = 0;
	int rc = 0;

	memset(&b, 0, sizeof(b));
	b.p = p;
	b.ops = ops;
	b.ctx = ctx;
	if (p->batch > MAX_BATCH)
		p->batch = MAX_BATCH;
	for (uint32_t i = 0; i < p->batch && !rc; i++) {
		b.idx[i] = calloc(p->max_pages + 1, sizeof(int32_t));
		b.tail[i] = malloc(p->page_tokens * p->token_bytes);
		if (!b.idx[i] || !b.tail[i]) {
			snprintf(p->out->err, sizeof(p->out->err), "out of memory for a batch of "
				 "%u page tables of %u pages", p->batch, p->max_pages);
			rc = p->out->status = -ENOMEM;
		}
	}
	p->out->t_start = now_ns();
	while (next < p->nreqs && !rc) {
		b.n = 0;
		while (next < p->nreqs && b.n < p->batch) {
			const struct trace_req *q = &p->t->req[p->reqs[next]];
			uint64_t key = trace_key(q->user, q->date) | p->key_salt;
			bool dup = false;

			for (uint32_t i = 0; i < b.n && !dup; i++)
				dup = b.s[i].key == key;
			if (dup)
				break;
			b.s[b.n] = (struct slot){ .q = q, .key = key, .need = trace_tokens(q->end) };
			b.s[b.n].l.idx = b.idx[b.n];
			b.s[b.n].l.tail = b.tail[b.n];
			b.n++;
			next++;
		}
		rc = ops->prepare_batch ? run_batch_batched(&b) : run_batch(&b);
		p->out->batches++;
		p->out->requests += b.n;
		__atomic_store_n(&p->out->done, p->out->requests, __ATOMIC_RELAXED);
	}
	p->out->t_end = now_ns();
	for (uint32_t i = 0; i < p->batch; i++) {
		free(b.idx[i]);
		free(b.tail[i]);
	}
	return rc;
}
