/* SPDX-License-Identifier: MIT */
/*
 * bench_engine.c - `kvbench engine`: the engine in-process, on one core.
 *
 * Two measurements, both without a daemon, a socket or a ring in the way:
 *
 *  1. The metadata path. Every step is prepare(user, start+len, one page of
 *     tokens) + commit(all of them) + release for the next of --users users
 *     in round-robin order; no K/V bytes are written. Histories are capped at
 *     --max-pages pages (max_tokens_per_user), so after a warm-up every user
 *     holds the cap and every release trims one page from the head. Two
 *     scenarios run one after the other on fresh engines:
 *       - no eviction: the device tier holds users * (max_pages + 1) frames,
 *         room for everyone plus the one page a step adds;
 *       - eviction: the device tier and the host tier each hold a quarter of
 *         the working set (users * max_pages pages). Round-robin order is
 *         the LRU's worst case: the user a step touches is always the oldest
 *         one, so prepares onload, demote and drop all the time.
 *     Each scenario runs an untimed pass (the ops/s figure: one clock read
 *     per pass, none per call) and then a timed pass of as many steps with
 *     one clock read between consecutive calls, into preallocated arrays.
 *
 *  2. The append copy alone. kvp_append_cpu() writes every slot of a device
 *     tier of --append-mib MiB, its pages in shuffled order, from one
 *     contiguous source buffer; a plain memcpy() of the same bytes between
 *     the same two buffers runs in the same repetitions. Both buffers are
 *     faulted in before anything is timed; the median of --reps runs counts.
 *
 * Not measured here: the rings, the daemon's wake-ups, the GPU (later
 * subcommands).
 *
 * This file runs the measurements; engine_report.c parses the options and
 * prints the report (engine_report.h is what the two share).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpool_engine.h"
#include "engine_report.h"
#include "kvp_kernels.h"
#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"

#define SUB "engine"

/* The untimed pass is timed in this many slices. */
#define SLICES 10

/* The timed pass keeps at most this many steps' samples (3 ops a step). */
#define MAX_TIMED_STEPS (4u * 1000 * 1000)

/* The state one scenario's loop works on. */
struct bench {
	struct engine *eng;
	uint32_t users;
	uint32_t cursor;   /* next user, round-robin */
	uint32_t page_tokens;
	uint64_t *id;      /* user ids, scattered like real ones */
	uint64_t *pos;     /* start+len of each user's history */
};

/* ---------------------------------------------------------------- helpers */

/* splitmix64: user ids and shuffles from --seed, same on every machine. */
static uint64_t mix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void shuffle_u32(uint32_t *v, uint32_t n, uint64_t *rng)
{
	uint32_t i;

	for (i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(mix64(rng) % i);
		uint32_t t = v[i - 1];

		v[i - 1] = v[j];
		v[j] = t;
	}
}

static void stats_delta(struct kvp_stats *d, const struct kvp_stats *a,
			const struct kvp_stats *b)
{
#define D(f) d->f = b->f - a->f
	D(prepares); D(commits); D(releases); D(hit_tokens); D(committed_tokens);
	D(evicted_users); D(evicted_pages); D(demoted_users); D(demoted_pages);
	D(offloaded_pages); D(onloaded_pages); D(trimmed_pages);
	D(bytes_d2h); D(bytes_h2d);
#undef D
	memcpy(d->tier, b->tier, sizeof(d->tier));
	d->users = b->users;
	d->leases = b->leases;
}

/* ---------------------------------------------------------------- metadata */

static int step_fail(struct bench *b, const char *what, uint32_t u, int rc,
		     const struct errbuf *e)
{
	fprintf(stderr, "kvbench engine: %s of user %" PRIu64 " at token %" PRIu64
		" failed (%d, %s): %s\n", what, b->id[u], b->pos[u], rc,
		strerror(-rc), e->msg);
	return rc;
}

/* n untimed steps. */
static int run_steps(struct bench *b, uint64_t n, struct errbuf *e)
{
	struct engine_lease lease;
	uint64_t i;
	int rc;

	for (i = 0; i < n; i++) {
		uint32_t u = b->cursor;

		if (++b->cursor == b->users)
			b->cursor = 0;
		rc = engine_prepare(b->eng, b->id[u], b->pos[u], b->page_tokens, 0,
				    &lease, e);
		if (rc < 0)
			return step_fail(b, "prepare", u, rc, e);
		rc = engine_commit(b->eng, lease.id, b->page_tokens, e);
		if (rc < 0)
			return step_fail(b, "commit", u, rc, e);
		rc = engine_release(b->eng, lease.id, e);
		if (rc < 0)
			return step_fail(b, "release", u, rc, e);
		b->pos[u] += b->page_tokens;
	}
	return 0;
}

/* n steps with every call timed: one clock read between consecutive calls. */
static int run_steps_timed(struct bench *b, uint64_t n, struct samples *sp,
			   struct samples *sc, struct samples *sr,
			   struct errbuf *e)
{
	struct engine_lease lease;
	uint64_t i, t0, t1, t2, t3;
	int rc;

	for (i = 0; i < n; i++) {
		uint32_t u = b->cursor;

		if (++b->cursor == b->users)
			b->cursor = 0;
		t0 = now_ns();
		rc = engine_prepare(b->eng, b->id[u], b->pos[u], b->page_tokens, 0,
				    &lease, e);
		t1 = now_ns();
		if (rc < 0)
			return step_fail(b, "prepare", u, rc, e);
		rc = engine_commit(b->eng, lease.id, b->page_tokens, e);
		t2 = now_ns();
		if (rc < 0)
			return step_fail(b, "commit", u, rc, e);
		rc = engine_release(b->eng, lease.id, e);
		t3 = now_ns();
		if (rc < 0)
			return step_fail(b, "release", u, rc, e);
		b->pos[u] += b->page_tokens;
		samples_add(sp, t1 - t0);
		samples_add(sc, t2 - t1);
		samples_add(sr, t3 - t2);
	}
	return 0;
}

/*
 * The untimed pass: o->ops ops, or as many as fit in o->seconds, in SLICES
 * equal slices timed on their own. The median slice's rate is the figure
 * reported: a burst of work from another process on a two-core machine
 * spoils one slice, not the result.
 */
static int run_untimed(struct bench *b, const struct opts *o,
		       struct scenario *sc, struct errbuf *e)
{
	uint64_t steps = (o->ops + 2) / 3, t0, ts, te = 0, n, total = 0;
	double rate[SLICES];
	uint32_t k, slices = SLICES;
	int rc;

	if (o->seconds <= 0 && steps < slices)
		slices = (uint32_t)steps;
	t0 = now_ns();
	for (k = 0; k < slices; k++) {
		ts = now_ns();
		if (o->seconds > 0) {
			uint64_t limit = (uint64_t)(o->seconds * 1e9 / slices);

			n = 0;
			do {
				rc = run_steps(b, 256, e);
				if (rc)
					return rc;
				n += 256;
				te = now_ns();
			} while (te - ts < limit);
		} else {
			n = steps / slices + (k < steps % slices);
			rc = run_steps(b, n, e);
			if (rc)
				return rc;
			te = now_ns();
		}
		rate[k] = ops_per_s(3 * n, (double)(te - ts) / 1e9);
		total += n;
	}
	sc->steps = total;
	sc->seconds = (double)(te - t0) / 1e9;
	sc->slices = slices;
	sc->rate_min = sc->rate_max = rate[0];
	for (k = 1; k < slices; k++) {
		if (rate[k] < sc->rate_min)
			sc->rate_min = rate[k];
		if (rate[k] > sc->rate_max)
			sc->rate_max = rate[k];
	}
	sc->rate = median_f64(rate, slices);
	return 0;
}

static int run_timed(struct bench *b, struct scenario *sc, struct errbuf *e)
{
	struct samples sp, sc_, sr, all;
	uint64_t n = sc->steps < MAX_TIMED_STEPS ? sc->steps : MAX_TIMED_STEPS;
	uint64_t t0, t1;
	int rc;

	memset(&sp, 0, sizeof(sp));
	sc_ = sr = all = sp;
	if (samples_init(&sp, n) || samples_init(&sc_, n) || samples_init(&sr, n) ||
	    samples_init(&all, 3 * n)) {
		samples_free(&sp);
		samples_free(&sc_);
		samples_free(&sr);
		samples_free(&all);
		fprintf(stderr, "kvbench engine: no memory for %" PRIu64 " samples\n", 6 * n);
		return -ENOMEM;
	}
	t0 = now_ns();
	rc = run_steps_timed(b, n, &sp, &sc_, &sr, e);
	t1 = now_ns();
	if (rc == 0) {
		sc->timed_steps = n;
		sc->timed_seconds = (double)(t1 - t0) / 1e9;
		samples_append(&all, &sp);
		samples_append(&all, &sc_);
		samples_append(&all, &sr);
		samples_summarize(&sp, &sc->prepare);
		samples_summarize(&sc_, &sc->commit);
		samples_summarize(&sr, &sc->release);
		samples_summarize(&all, &sc->all);
	}
	samples_free(&sp);
	samples_free(&sc_);
	samples_free(&sr);
	samples_free(&all);
	return rc;
}

static int run_scenario(const struct opts *o, struct scenario *sc)
{
	struct engine_config cfg = {
		.layout = o->meta,
		.device_frames = sc->device_frames,
		.host_frames = sc->host_frames,
		.max_tokens_per_user = o->max_pages * o->meta.page_tokens,
	};
	struct kvp_stats s0, s1;
	struct bench b = { 0 };
	struct errbuf e = { .msg = "" };
	uint64_t rng = o->seed, i;
	int rc;

	b.users = (uint32_t)o->users;
	b.page_tokens = o->meta.page_tokens;
	b.id = calloc(b.users, sizeof(*b.id));
	b.pos = calloc(b.users, sizeof(*b.pos));
	if (!b.id || !b.pos) {
		fprintf(stderr, "kvbench engine: no memory for %u users\n", b.users);
		rc = -ENOMEM;
		goto out;
	}
	/* Distinct ids from the seed (a collision would merge two histories). */
	for (i = 0; i < b.users; i++)
		b.id[i] = (mix64(&rng) & ~(uint64_t)0xffffffff) | i;

	rc = engine_create(&b.eng, &cfg, &e);
	if (rc < 0) {
		fprintf(stderr, "kvbench engine: %s: engine_create (%u device, %u host frames): %s\n",
			sc->name, cfg.device_frames, cfg.host_frames, e.msg);
		goto out;
	}
	/*
	 * Where pages are copied between tiers, fault both tiers in first: a
	 * daemon that has run a while has touched its memory, and a first-touch
	 * fault inside a demotion is not what this measures.
	 */
	if (sc->host_frames) {
		enum kvp_tier t;

		for (t = KVP_TIER_DEVICE; t < KVP_TIERS; t++) {
			const struct tier_mem *m = engine_tier(b.eng, t);

			if (m && m->base)
				memset(m->base, 0, m->bytes);
		}
	}
	/* Warm up until every history has reached the cap and been trimmed. */
	sc->warm_steps = (uint64_t)b.users * (o->max_pages + 1);
	rc = run_steps(&b, sc->warm_steps, &e);
	if (rc)
		goto out;

	engine_stats(b.eng, &s0);
	rc = run_untimed(&b, o, sc, &e);
	if (rc)
		goto out;
	rc = run_timed(&b, sc, &e);
	if (rc)
		goto out;
	engine_stats(b.eng, &s1);
	stats_delta(&sc->delta, &s0, &s1);

	errbuf_clear(&e);
	sc->check_ok = engine_check(b.eng, &e) == 0;
	snprintf(sc->check_msg, sizeof(sc->check_msg), "%s", sc->check_ok ? "ok" : e.msg);
	if (sc->delta.prepares != sc->steps + sc->timed_steps ||
	    sc->delta.commits != sc->delta.prepares ||
	    sc->delta.releases != sc->delta.prepares) {
		sc->check_ok = false;
		snprintf(sc->check_msg, sizeof(sc->check_msg),
			 "counters disagree with the calls made: %" PRIu64 " steps, %" PRIu64
			 " prepares, %" PRIu64 " commits, %" PRIu64 " releases",
			 sc->steps + sc->timed_steps, sc->delta.prepares,
			 sc->delta.commits, sc->delta.releases);
	}
out:
	if (b.eng)
		engine_destroy(b.eng);
	free(b.id);
	free(b.pos);
	return rc;
}

/* ---------------------------------------------------------------- append */

/* Median of n values, leaving them in run order for the report. */
static double median_copy(const double *v, uint64_t n)
{
	double *tmp = malloc(n * sizeof(*tmp)), m;

	if (!tmp)
		return 0;
	memcpy(tmp, v, n * sizeof(*tmp));
	m = median_f64(tmp, n);
	free(tmp);
	return m;
}

/* Element of token t (layer, kv, head 0, dim 0) in the source and the tier. */
static bool check_token_rows(const struct kvp_layout *l, const uint8_t *base,
			     const uint8_t *src, struct kvp_slot s, uint64_t t)
{
	uint32_t layer, kv;

	for (layer = 0; layer < l->layers; layer++) {
		for (kv = 0; kv < 2; kv++) {
			const uint8_t *want = src + t * l->token_bytes +
				((uint64_t)layer * 2 + kv) * l->token_stride;
			const uint8_t *got = base + (uint64_t)s.frame * l->page_bytes +
				layer * l->layer_stride + kv * l->kv_stride +
				(uint64_t)s.slot * l->token_stride;

			if (memcmp(want, got, l->token_stride))
				return false;
		}
	}
	return true;
}

/* Read every token back with kvp_read_cpu and spot-check the layout by hand. */
static bool verify_append(const struct kvp_layout *l, const uint8_t *base,
			  const struct kvp_slot *slots, uint32_t n,
			  const uint8_t *src)
{
	uint32_t chunk = 64, i, k;
	uint8_t *out = malloc((size_t)chunk * l->token_bytes);
	bool ok = out != NULL;

	for (i = 0; ok && i < n; i += chunk) {
		k = n - i < chunk ? n - i : chunk;
		kvp_read_cpu(l, base, slots + i, k, out);
		ok = memcmp(out, src + (uint64_t)i * l->token_bytes,
			    (size_t)k * l->token_bytes) == 0;
	}
	for (i = 0; ok && i < n; i += 997)
		ok = check_token_rows(l, base, src, slots[i], i);
	free(out);
	return ok;
}

/* One timed copy of kind k of the whole tier; returns GB/s. */
static double time_copy(enum copy_kind k, const struct kvp_layout *l, void *base,
			const struct kvp_slot *slots, const struct kvp_slot *seq,
			uint32_t n, const void *src, uint64_t bytes)
{
	uint64_t t0, t1, off;

	t0 = now_ns();
	switch (k) {
	case COPY_APPEND:
		kvp_append_cpu(l, base, slots, n, src);
		break;
	case COPY_APPEND_SEQ:
		kvp_append_cpu(l, base, seq, n, src);
		break;
	case COPY_MEMCPY:
		memcpy(base, src, bytes);
		break;
	default:
		/* The append's copies without the scatter: one row at a time,
		 * both sides in order, with whatever stores memcpy() picks for a
		 * row (ordinary ones below glibc's non-temporal threshold). */
		for (off = 0; off < bytes; off += l->token_stride)
			memcpy((uint8_t *)base + off, (const uint8_t *)src + off,
			       l->token_stride);
		break;
	}
	t1 = now_ns();
	return (double)bytes / (double)(t1 - t0);
}

static int run_append(const struct opts *o, struct append_result *r)
{
	const struct kvp_layout *l = &o->append;
	struct engine_config cfg = { .layout = *l };
	const struct tier_mem *tier;
	struct kvp_slot *slots = NULL, *seq = NULL;
	struct engine *eng = NULL;
	struct errbuf e = { .msg = "" };
	uint32_t *perm = NULL, n, i, k;
	uint64_t rng = o->seed ^ 0xa99e4d, rep, w, *src = NULL;
	bool nomem = false;
	int rc;

	r->pages = o->append_mib * (1ull << 20) / l->page_bytes;
	r->tokens = r->pages * l->page_tokens;
	r->bytes = r->pages * l->page_bytes;
	n = (uint32_t)r->tokens;
	cfg.device_frames = (uint32_t)r->pages;

	rc = engine_create(&eng, &cfg, &e);
	if (rc < 0) {
		fprintf(stderr, "kvbench engine: append: engine_create (%" PRIu64 " frames): %s\n",
			r->pages, e.msg);
		return rc;
	}
	tier = engine_tier(eng, KVP_TIER_DEVICE);
	if (!tier || !tier->base || tier->bytes < r->bytes) {
		fprintf(stderr, "kvbench engine: append: the device tier is not mapped in this process\n");
		rc = -EINVAL;
		goto out;
	}
	src = aligned_alloc(4096, (r->bytes + 4095) & ~4095ull);
	slots = malloc((size_t)n * sizeof(*slots));
	seq = malloc((size_t)n * sizeof(*seq));
	perm = malloc(r->pages * sizeof(*perm));
	for (k = 0; k < NCOPY; k++) {
		r->gbps_all[k] = calloc(o->reps, sizeof(double));
		nomem |= !r->gbps_all[k];
	}
	if (nomem || !src || !slots || !seq || !perm) {
		fprintf(stderr, "kvbench engine: append: no memory for %" PRIu64 " MiB of source\n",
			r->bytes >> 20);
		rc = -ENOMEM;
		goto out;
	}
	/* Fault both buffers in: a pattern in the source, zeros in the tier. */
	for (w = 0; w < r->bytes / 8; w++)
		src[w] = mix64(&rng);
	memset(tier->base, 0, r->bytes);

	for (i = 0; i < r->pages; i++)
		perm[i] = i;
	shuffle_u32(perm, (uint32_t)r->pages, &rng);
	for (i = 0; i < n; i++) {
		slots[i] = (struct kvp_slot){ perm[i / l->page_tokens], i % l->page_tokens };
		seq[i] = (struct kvp_slot){ i / l->page_tokens, i % l->page_tokens };
	}

	/* One untimed round of each, then check the append put every byte where
	 * the layout says. */
	for (k = 0; k < NCOPY; k++)
		time_copy(k, l, tier->base, slots, seq, n, src, r->bytes);
	kvp_append_cpu(l, tier->base, slots, n, src);
	r->verified = verify_append(l, tier->base, slots, n, (const uint8_t *)src);

	/* Rotate which copy goes first so drift (turbo, neighbours) hits all. */
	for (rep = 0; rep < o->reps; rep++) {
		for (i = 0; i < NCOPY; i++) {
			k = (uint32_t)((i + rep) % NCOPY);
			r->gbps_all[k][rep] = time_copy(k, l, tier->base, slots, seq, n,
							src, r->bytes);
		}
	}
	for (k = 0; k < NCOPY; k++)
		r->gbps[k] = median_copy(r->gbps_all[k], o->reps);
	rc = 0;
out:
	free(src);
	free(slots);
	free(seq);
	free(perm);
	if (eng)
		engine_destroy(eng);
	return rc;
}

/* ---------------------------------------------------------------- main */

int cmd_engine(int argc, char **argv)
{
	struct scenario sc[2] = {
		{ .name = "no eviction" },
		{ .name = "eviction" },
	};
	struct append_result ar = { 0 };
	struct kvb_machine m;
	struct summary tov;
	struct opts o;
	int rc, status = KVB_EXIT_OK;

	rc = engine_parse_opts(argc, argv, &o);
	if (rc < 0)
		rc = kvb_begin_run(SUB, o.cpu, &m, &tov);
	if (rc >= 0)
		return rc;

	if (o.do_meta) {
		uint64_t ws = o.users * o.max_pages;

		sc[0].device_frames = (uint32_t)(o.users * (o.max_pages + 1));
		sc[0].host_frames = 0;
		/* A quarter of the working set each, never less than one history. */
		sc[1].device_frames = (uint32_t)((ws + 3) / 4);
		if (sc[1].device_frames < o.max_pages + 1)
			sc[1].device_frames = (uint32_t)o.max_pages + 1;
		sc[1].host_frames = (uint32_t)((ws + 3) / 4);
		if (run_scenario(&o, &sc[0]) || run_scenario(&o, &sc[1]))
			return KVB_EXIT_FAIL;
		if (!sc[0].check_ok || !sc[1].check_ok)
			status = KVB_EXIT_FAIL;
		if (sc[0].delta.evicted_users || sc[0].delta.demoted_users) {
			fprintf(stderr, "kvbench engine: the no-eviction scenario evicted %" PRIu64
				" and demoted %" PRIu64 " users with room for every history\n",
				sc[0].delta.evicted_users, sc[0].delta.demoted_users);
			status = KVB_EXIT_FAIL;
		}
	}
	if (o.do_append) {
		if (run_append(&o, &ar))
			return KVB_EXIT_FAIL;
		if (!ar.verified) {
			fprintf(stderr, "kvbench engine: kvp_append_cpu wrote bytes where the layout "
				"does not put them (read-back check failed)\n");
			status = KVB_EXIT_FAIL;
		}
	}
	for (rc = 0; rc < 2 && o.do_meta; rc++)
		if (!sc[rc].check_ok)
			fprintf(stderr, "kvbench engine: %s: engine_check: %s\n", sc[rc].name,
				sc[rc].check_msg);

	if (o.json)
		engine_print_json(&o, &m, &tov, sc, &ar);
	else
		engine_print_table(&o, &m, &tov, sc, &ar);
	for (rc = 0; rc < NCOPY; rc++)
		free(ar.gbps_all[rc]);
	return status;
}
