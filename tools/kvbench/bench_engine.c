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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kvbench.h"
#include "kvpool.h"
#include "stats.h"

#define SUB "engine"

#define DEFAULT_META_LAYOUT \
	"layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define DEFAULT_APPEND_LAYOUT \
	"layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32"

/* The untimed pass is timed in this many slices. */
#define SLICES 10

/* The timed pass keeps at most this many steps' samples (3 ops a step). */
#define MAX_TIMED_STEPS (4u * 1000 * 1000)

struct opts {
	uint64_t users;
	uint64_t ops;       /* per pass and scenario; 0 when --seconds is used */
	double seconds;     /* untimed pass length; 0 when --ops is used */
	uint64_t max_pages;
	struct kvp_layout meta;
	struct kvp_layout append;
	uint64_t append_mib;
	uint64_t reps;
	uint64_t seed;
	bool json;
	bool do_meta;
	bool do_append;
	int cpu;
};

/* One scenario of the metadata path. */
struct scenario {
	const char *name;
	uint32_t device_frames;
	uint32_t host_frames;
	uint64_t warm_steps;
	uint64_t steps;          /* untimed pass */
	double seconds;          /* untimed pass */
	uint32_t slices;         /* the untimed pass's slices */
	double rate;             /* ops/s: the median slice's */
	double rate_min, rate_max;
	uint64_t timed_steps;
	double timed_seconds;
	struct summary prepare, commit, release, all;
	struct kvp_stats delta;  /* counters over both measured passes */
	bool check_ok;
	char check_msg[KVP_ERRLEN];
};

/* The copies the append part times, in the order they first run. */
enum copy_kind {
	COPY_APPEND,     /* kvp_append_cpu, pages shuffled: the figure */
	COPY_APPEND_SEQ, /* kvp_append_cpu, pages in frame order */
	COPY_MEMCPY,     /* one memcpy of all the bytes: the reference */
	COPY_ROWS,       /* memcpy one row at a time, in order: no scatter */
	NCOPY,
};

struct append_result {
	uint64_t pages;
	uint64_t tokens;
	uint64_t bytes;
	double gbps[NCOPY];      /* medians */
	double *gbps_all[NCOPY]; /* every repetition, in run order */
	bool verified;
};

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

static double ops_per_s(uint64_t ops, double s)
{
	return s > 0 ? (double)ops / s : 0;
}

static uint64_t phys_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);

	return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX;
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
	struct errbuf e = { "" };
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
	struct errbuf e = { "" };
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

/* ---------------------------------------------------------------- report */

static void json_scenario(struct json *j, const char *key, const struct scenario *sc,
			  const struct opts *o)
{
	const struct kvp_stats *d = &sc->delta;

	json_obj_begin(j, key);
	json_u64(j, "device_frames", sc->device_frames);
	json_u64(j, "host_frames", sc->host_frames);
	json_u64(j, "warmup_ops", 3 * sc->warm_steps);
	json_u64(j, "ops", 3 * sc->steps);
	json_f64(j, "seconds", sc->seconds, 6);
	json_f64(j, "ops_per_s", sc->rate, 0);
	json_f64(j, "ops_per_s_overall", ops_per_s(3 * sc->steps, sc->seconds), 0);
	json_f64(j, "ops_per_s_min", sc->rate_min, 0);
	json_f64(j, "ops_per_s_max", sc->rate_max, 0);
	json_u64(j, "slices", sc->slices);
	json_u64(j, "timed_ops", 3 * sc->timed_steps);
	json_f64(j, "timed_ops_per_s", ops_per_s(3 * sc->timed_steps, sc->timed_seconds), 0);
	json_u64(j, "p50_ns", sc->all.p50);
	json_u64(j, "p99_ns", sc->all.p99);
	json_summary(j, "all", &sc->all);
	json_summary(j, "prepare", &sc->prepare);
	json_summary(j, "commit", &sc->commit);
	json_summary(j, "release", &sc->release);
	json_u64(j, "evicted_users", d->evicted_users);
	json_u64(j, "evicted_pages", d->evicted_pages);
	json_u64(j, "demoted_users", d->demoted_users);
	json_u64(j, "demoted_pages", d->demoted_pages);
	json_u64(j, "onloaded_pages", d->onloaded_pages);
	json_u64(j, "trimmed_pages", d->trimmed_pages);
	json_u64(j, "bytes_d2h", d->bytes_d2h);
	json_u64(j, "bytes_h2d", d->bytes_h2d);
	json_u64(j, "hit_tokens", d->hit_tokens);
	json_u64(j, "prepares", d->prepares);
	json_u64(j, "users_resident", d->users);
	json_str(j, "engine_check", sc->check_msg);
	json_obj_end(j);
	(void)o;
}

static void print_json(const struct opts *o, const struct kvb_machine *m,
		       const struct summary *tov, const struct scenario *sc,
		       const struct append_result *ar)
{
	char meta[256], app[256];
	struct json j;
	uint64_t i;

	kvp_layout_format(&o->meta, meta, sizeof(meta));
	kvp_layout_format(&o->append, app, sizeof(app));
	json_open(&j, stdout);
	json_str(&j, "benchmark", "engine");
	if (o->do_meta) {
		json_f64(&j, "ops_per_s", sc[0].rate, 0);
		json_u64(&j, "p50_ns", sc[0].all.p50);
		json_u64(&j, "p99_ns", sc[0].all.p99);
	} else {
		json_null(&j, "ops_per_s");
		json_null(&j, "p50_ns");
		json_null(&j, "p99_ns");
	}
	if (o->do_append)
		json_f64(&j, "append_ratio_vs_memcpy", ar->gbps[COPY_APPEND] / ar->gbps[COPY_MEMCPY], 4);
	else
		json_null(&j, "append_ratio_vs_memcpy");
	json_obj_begin(&j, "timer");
	json_str(&j, "clock", "CLOCK_MONOTONIC");
	json_u64(&j, "overhead_p50_ns", tov->p50);
	json_u64(&j, "overhead_p99_ns", tov->p99);
	json_f64(&j, "overhead_mean_ns", tov->mean, 1);
	json_obj_end(&j);
	json_obj_begin(&j, "config");
	json_u64(&j, "users", o->users);
	if (o->seconds > 0)
		json_f64(&j, "seconds", o->seconds, 3);
	else
		json_u64(&j, "ops", o->ops);
	json_u64(&j, "max_pages", o->max_pages);
	json_str(&j, "layout", meta);
	json_u64(&j, "page_bytes", o->meta.page_bytes);
	json_str(&j, "append_layout", app);
	json_u64(&j, "append_mib", o->append_mib);
	json_u64(&j, "reps", o->reps);
	json_u64(&j, "seed", o->seed);
	json_obj_end(&j);
	if (o->do_meta) {
		json_scenario(&j, "no_eviction", &sc[0], o);
		json_scenario(&j, "eviction", &sc[1], o);
	}
	if (o->do_append) {
		json_obj_begin(&j, "append");
		json_str(&j, "layout", app);
		json_u64(&j, "bytes", ar->bytes);
		json_u64(&j, "tokens", ar->tokens);
		json_u64(&j, "pages", ar->pages);
		json_u64(&j, "row_bytes", o->append.token_stride);
		json_u64(&j, "reps", o->reps);
		json_f64(&j, "gbps", ar->gbps[COPY_APPEND], 3);
		json_f64(&j, "sequential_gbps", ar->gbps[COPY_APPEND_SEQ], 3);
		json_f64(&j, "memcpy_gbps", ar->gbps[COPY_MEMCPY], 3);
		json_f64(&j, "rows_memcpy_gbps", ar->gbps[COPY_ROWS], 3);
		json_f64(&j, "ratio", ar->gbps[COPY_APPEND] / ar->gbps[COPY_MEMCPY], 4);
		json_bool(&j, "verified", ar->verified);
		json_arr_begin(&j, "gbps_all");
		for (i = 0; i < o->reps; i++)
			json_f64(&j, NULL, ar->gbps_all[COPY_APPEND][i], 3);
		json_arr_end(&j);
		json_arr_begin(&j, "memcpy_gbps_all");
		for (i = 0; i < o->reps; i++)
			json_f64(&j, NULL, ar->gbps_all[COPY_MEMCPY][i], 3);
		json_arr_end(&j);
		json_obj_end(&j);
	}
	json_machine(&j, m);
	json_close(&j);
}

static void print_scenario_row(const struct scenario *sc)
{
	char frames[32];

	snprintf(frames, sizeof(frames), "%u/%u", sc->device_frames, sc->host_frames);
	printf("%-12s %13s %10" PRIu64 " %11.0f  %6" PRIu64 " %6" PRIu64
	       "  %6" PRIu64 " %6" PRIu64 "  %6" PRIu64 " %6" PRIu64 "  %6" PRIu64 " %6" PRIu64 "\n",
	       sc->name, frames, 3 * sc->steps, sc->rate,
	       sc->all.p50, sc->all.p99, sc->prepare.p50, sc->prepare.p99,
	       sc->commit.p50, sc->commit.p99, sc->release.p50, sc->release.p99);
}

static void print_table(const struct opts *o, const struct kvb_machine *m,
			const struct summary *tov, const struct scenario *sc,
			const struct append_result *ar)
{
	char spec[256];
	int k;

	printf("kvbench engine on %s (%ld CPUs), ", m->cpu_model, m->nproc);
	if (m->cpu >= 0)
		printf("pinned to CPU %d", m->cpu);
	else
		printf("not pinned");
	printf(", clocksource %s\n", m->clocksource[0] ? m->clocksource : "?");
	printf("timer: an empty timed region costs p50 %" PRIu64 " ns, p99 %" PRIu64
	       " ns (included in every latency below)\n", tov->p50, tov->p99);

	if (o->do_meta) {
		kvp_layout_format(&o->meta, spec, sizeof(spec));
		printf("\nmetadata path: %s (%" PRIu64 " B/page)\n", spec, o->meta.page_bytes);
		printf("  users: %" PRIu64 " round-robin; a page (%u tokens) per prepare; "
		       "history cap: %" PRIu64 " pages\n"
		       "  ops/s: the median of %u slices of an untimed pass; latencies: a timed pass\n",
		       o->users, o->meta.page_tokens, o->max_pages, sc[0].slices);
		printf("%-12s %13s %10s %11s  %13s  %13s  %13s  %13s\n", "", "frames", "",
		       "", "all ops, ns", "prepare, ns", "commit, ns", "release, ns");
		printf("%-12s %13s %10s %11s  %6s %6s  %6s %6s  %6s %6s  %6s %6s\n", "scenario",
		       "device/host", "ops", "ops/s", "p50", "p99", "p50", "p99", "p50", "p99",
		       "p50", "p99");
		print_scenario_row(&sc[0]);
		print_scenario_row(&sc[1]);
		for (k = 0; k < 2; k++) {
			const struct kvp_stats *d = &sc[k].delta;
			double steps = (double)(sc[k].steps + sc[k].timed_steps);

			printf("  %s: %" PRIu64 " users evicted (%.3f/prepare), %" PRIu64
			       " demoted (%.3f/prepare), %" PRIu64 " pages onloaded, %" PRIu64
			       " trimmed; engine_check: %s\n", sc[k].name,
			       d->evicted_users, d->evicted_users / steps, d->demoted_users,
			       d->demoted_users / steps, d->onloaded_pages, d->trimmed_pages,
			       sc[k].check_msg);
		}
	}
	if (o->do_append) {
		kvp_layout_format(&o->append, spec, sizeof(spec));
		printf("\nappend: %s\n", spec);
		printf("  %" PRIu64 " tokens into %" PRIu64 " pages (%.1f MiB), rows of %" PRIu64
		       " B, median of %" PRIu64 " run(s); read-back check: %s\n",
		       ar->tokens, ar->pages, ar->bytes / 1048576.0, o->append.token_stride,
		       o->reps, ar->verified ? "ok" : "FAILED");
		printf("  %-36s %8.2f GB/s\n", "kvp_append_cpu, shuffled pages", ar->gbps[COPY_APPEND]);
		printf("  %-36s %8.2f GB/s\n", "kvp_append_cpu, pages in order",
		       ar->gbps[COPY_APPEND_SEQ]);
		printf("  %-36s %8.2f GB/s\n", "memcpy, same bytes and buffers", ar->gbps[COPY_MEMCPY]);
		printf("  %-36s %8.2f GB/s\n", "memcpy, one row at a time", ar->gbps[COPY_ROWS]);
		printf("  %-36s %8.3f\n", "append / memcpy", ar->gbps[COPY_APPEND] / ar->gbps[COPY_MEMCPY]);
	}
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench engine [options]\n"
"\n"
"Measure the engine in-process on one core: the metadata path (prepare +\n"
"commit + release, no data written) without and with eviction pressure, and\n"
"kvp_append_cpu() against memcpy() of the same bytes.\n"
"\n"
"Options:\n"
"  --users N          users served round-robin (default 10000)\n"
"  --ops N            ops per pass and scenario; a step is 3 ops\n"
"                     (default 2M; suffixes k, M, G multiply by 10^3, 10^6, 10^9)\n"
"  --seconds S        run the untimed pass for S seconds instead of --ops\n"
"  --max-pages N      history cap in pages per user (default 4)\n"
"  --layout SPEC      layout of both parts (default for the metadata path:\n"
"                     " DEFAULT_META_LAYOUT ")\n"
"  --append-layout SPEC\n"
"                     layout of the append part only (default, unless --layout:\n"
"                     " DEFAULT_APPEND_LAYOUT ")\n"
"  --append-mib N     device tier the append fills, MiB (default 256)\n"
"  --reps N           append repetitions, the median counts (default 7)\n"
"  --only PART        run only 'metadata' or only 'append'\n"
"  --seed N           seed for user ids and the page shuffle (default 1)\n"
"  --cpu N|none       pin to CPU N (default: the CPU kvbench starts on)\n"
"  --json             print one JSON object on stdout instead of a table\n"
"  -h, --help         this help\n"
"\n"
"A layout SPEC is layers=L,kv_heads=H,head_dim=D,dtype=bf16|fp16|fp8_e4m3|fp32,\n"
"page_tokens=P (all five keys). See kvbench(1).\n");
}

enum {
	OPT_USERS = 256, OPT_OPS, OPT_SECONDS, OPT_MAX_PAGES, OPT_LAYOUT,
	OPT_APPEND_LAYOUT, OPT_APPEND_MIB, OPT_REPS, OPT_ONLY, OPT_SEED, OPT_CPU,
	OPT_JSON,
};

static const struct option long_opts[] = {
	{ "users", required_argument, NULL, OPT_USERS },
	{ "ops", required_argument, NULL, OPT_OPS },
	{ "seconds", required_argument, NULL, OPT_SECONDS },
	{ "max-pages", required_argument, NULL, OPT_MAX_PAGES },
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	{ "append-layout", required_argument, NULL, OPT_APPEND_LAYOUT },
	{ "append-mib", required_argument, NULL, OPT_APPEND_MIB },
	{ "reps", required_argument, NULL, OPT_REPS },
	{ "only", required_argument, NULL, OPT_ONLY },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "cpu", required_argument, NULL, OPT_CPU },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static int parse_layout(const char *opt, const char *arg, struct kvp_layout *l)
{
	char err[KVP_ERRLEN] = "";

	if (kvp_layout_parse(l, arg, err, sizeof(err)) < 0)
		return kvb_usage_error(SUB, "%s: %s", opt, err[0] ? err : "bad layout");
	return 0;
}

/*
 * Sizes the engine would reject later with a less direct message, or that
 * this machine cannot hold. Returns -1 to go on, else the exit status.
 */
static int check_sizes(const struct opts *o)
{
	double phys_mib = (double)phys_bytes() / 1048576.0;

	if (o->do_meta) {
		uint64_t frames = o->users * (o->max_pages + 1);
		/* Both tiers of the eviction scenario get written: they must fit. */
		double evict_mib = 2.0 * (double)((o->users * o->max_pages + 3) / 4) *
				   (double)o->meta.page_bytes / 1048576.0;

		if (frames > UINT32_MAX)
			return kvb_usage_error(SUB, "--users %" PRIu64 " x (--max-pages %" PRIu64
					       " + 1) = %" PRIu64 " frames: more than a tier"
					       " holds (2^32 - 1)",
					       o->users, o->max_pages, frames);
		if (evict_mib > phys_mib * 0.75)
			return kvb_usage_error(SUB, "the eviction scenario needs %.0f MiB of tier"
					       " memory (pages of %" PRIu64 " B) and this machine"
					       " has %.0f MiB; lower --users or --max-pages",
					       evict_mib, o->meta.page_bytes, phys_mib);
	}
	if (o->do_append) {
		uint64_t pages = o->append_mib * (1ull << 20) / o->append.page_bytes;

		if (pages == 0)
			return kvb_usage_error(SUB, "--append-mib %" PRIu64 " holds no page of %"
					       PRIu64 " B; raise it",
					       o->append_mib, o->append.page_bytes);
		if (pages * o->append.page_tokens > UINT32_MAX)
			return kvb_usage_error(SUB, "--append-mib %" PRIu64 ": more tokens than one"
					       " append takes (2^32 - 1)", o->append_mib);
		if (2.0 * (double)o->append_mib > phys_mib * 0.75)
			return kvb_usage_error(SUB, "--append-mib %" PRIu64 " needs twice that in"
					       " memory and this machine has %.0f MiB",
					       o->append_mib, phys_mib);
	}
	return -1;
}

/* Parse argv into *o; returns -1 to go on, else the exit status. */
static int parse_opts(int argc, char **argv, struct opts *o)
{
	char err[KVP_ERRLEN], layout_err[KVP_ERRLEN] = "";
	bool have_ops = false, have_append_layout = false;
	struct kvp_layout layout;
	uint64_t v;
	int c;

	memset(o, 0, sizeof(*o));
	o->users = 10000;
	o->ops = 2000000;
	o->max_pages = 4;
	o->append_mib = 256;
	o->reps = 7;
	o->seed = 1;
	o->cpu = KVB_CPU_CURRENT;
	o->do_meta = o->do_append = true;
	if (kvp_layout_parse(&o->meta, DEFAULT_META_LAYOUT, layout_err, sizeof(layout_err)) < 0 ||
	    kvp_layout_parse(&o->append, DEFAULT_APPEND_LAYOUT, layout_err, sizeof(layout_err)) < 0) {
		fprintf(stderr, "kvbench engine: the default layout does not parse: %s\n", layout_err);
		return KVB_EXIT_FAIL;
	}

	optind = 0; /* glibc: reinitialise for this argv */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:h", long_opts, NULL)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout);
			return KVB_EXIT_OK;
		case OPT_USERS:
			if (kvb_parse_count("--users", optarg, 1, 1u << 26, &o->users, err, sizeof(err)))
				return kvb_usage_error(SUB, "%s", err);
			break;
		case OPT_OPS:
			if (kvb_parse_count("--ops", optarg, 3, 1ull << 40, &o->ops, err, sizeof(err)))
				return kvb_usage_error(SUB, "%s", err);
			have_ops = true;
			break;
		case OPT_SECONDS:
			if (kvb_parse_seconds("--seconds", optarg, &o->seconds, err, sizeof(err)))
				return kvb_usage_error(SUB, "%s", err);
			break;
		case OPT_MAX_PAGES:
			if (kvb_parse_count("--max-pages", optarg, 1, 1024, &o->max_pages, err, sizeof(err)))
				return kvb_usage_error(SUB, "%s", err);
			break;
		case OPT_LAYOUT:
			if ((c = parse_layout("--layout", optarg, &layout)))
				return c;
			o->meta = layout;
			if (!have_append_layout)
				o->append = layout;
			break;
		case OPT_APPEND_LAYOUT:
			if ((c = parse_layout("--append-layout", optarg, &o->append)))
				return c;
			have_append_layout = true;
			break;
		case OPT_APPEND_MIB:
			if (kvb_parse_count("--append-mib", optarg, 1, 1u << 20, &o->append_mib, err, sizeof(err)))
				return kvb_usage_error(SUB, "%s", err);
			break;
		case OPT_REPS:
			if (kvb_parse_count("--reps", optarg, 1, 1000, &o->reps, err, sizeof(err)))
				return kvb_usage_error(SUB, "%s", err);
			break;
		case OPT_ONLY:
			if (!strcmp(optarg, "metadata")) {
				o->do_append = false;
			} else if (!strcmp(optarg, "append")) {
				o->do_meta = false;
			} else {
				return kvb_usage_error(SUB, "--only: '%s' is not a part; use 'metadata' or 'append'",
						       optarg);
			}
			break;
		case OPT_SEED:
			if (kvb_parse_count("--seed", optarg, 0, UINT64_MAX, &o->seed, err, sizeof(err)))
				return kvb_usage_error(SUB, "%s", err);
			break;
		case OPT_CPU:
			if (!strcmp(optarg, "none")) {
				o->cpu = KVB_CPU_NONE;
			} else {
				if (kvb_parse_count("--cpu", optarg, 0, 65535, &v, err, sizeof(err)))
					return kvb_usage_error(SUB, "--cpu: '%s' is not a CPU number or 'none'",
							       optarg);
				o->cpu = (int)v;
			}
			break;
		case OPT_JSON:
			o->json = true;
			break;
		default:
			return kvb_getopt_error(SUB, c, argc, argv);
		}
	}
	if (optind < argc)
		return kvb_usage_error(SUB, "unexpected argument '%s'", argv[optind]);
	if (have_ops && o->seconds > 0)
		return kvb_usage_error(SUB, "--ops and --seconds both given; pick one");
	if (o->seconds > 0)
		o->ops = 0;

	return check_sizes(o);
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
	char err[KVP_ERRLEN] = "";
	struct opts o;
	int rc, cpu, status = KVB_EXIT_OK;

	rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		return rc;

	cpu = kvb_pin_cpu(o.cpu, err, sizeof(err));
	if (cpu < -1)
		return o.cpu >= 0 ? kvb_usage_error(SUB, "%s", err)
				  : (fprintf(stderr, "kvbench engine: %s\n", err), KVB_EXIT_FAIL);
	kvb_machine_info(&m, cpu);

	if (timer_overhead(1000000, &tov)) {
		fprintf(stderr, "kvbench engine: no memory for the timer samples\n");
		return KVB_EXIT_FAIL;
	}

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
		print_json(&o, &m, &tov, sc, &ar);
	else
		print_table(&o, &m, &tov, sc, &ar);
	for (rc = 0; rc < NCOPY; rc++)
		free(ar.gbps_all[rc]);
	return status;
}
