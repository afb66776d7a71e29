/* SPDX-License-Identifier: MIT */
/*
 * trace.c - the recommender trace in memory: the KuaiRand-1K-like generator,
 * the replay order, per-user statistics. Reading and writing the kvtrace
 * file format is trace_io.c; the HSTU CSV layout is hstu_csv.c.
 *
 * Everything the generator draws comes from splitmix64 streams keyed by the
 * seed and the user (and date and event for items), so a trace is the same
 * on every machine and any user's events can be recomputed without storing
 * them (trace_event()).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace.h"

#define KUAIRAND_ITEMS 4369953u
#define SESSION_EVENTS 24u      /* mean events of a session */
#define GAP_MIN_MS 2000u        /* between two events of a session */
#define GAP_MEAN_MS 10000.0     /* plus an exponential of this mean */

/* ---------------------------------------------------------------- random */

static uint64_t mix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so logs and inverse CDFs stay finite. */
static double unit(uint64_t *state)
{
	return ((double)(mix64(state) >> 11) + 0.5) / 9007199254740992.0;
}

static uint64_t stream(uint64_t seed, uint64_t a, uint64_t b)
{
	uint64_t s = seed ^ (a * 0xd1342543de82ef95ull) ^ (b * 0x9e3779b97f4a7c15ull);

	mix64(&s);
	return s;
}

/* Inverse of the standard normal CDF (Acklam's rational approximation,
 * relative error < 1.2e-9: far below what a 5% statistics check sees). */
static double norm_inv(double p)
{
	static const double a[] = { -3.969683028665376e+01, 2.209460984245205e+02,
		-2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01,
		2.506628277459239e+00 };
	static const double b[] = { -5.447609879822406e+01, 1.615858368580409e+02,
		-1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01 };
	static const double c[] = { -7.784894002430293e-03, -3.223964580411365e-01,
		-2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00,
		2.938163982698783e+00 };
	static const double d[] = { 7.784695709041462e-03, 3.224671290700398e-01,
		2.445134137142996e+00, 3.754408661907416e+00 };
	double q, r;

	if (p < 0.02425) {
		q = sqrt(-2 * log(p));
		return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
		       ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
	}
	if (p > 1 - 0.02425) {
		q = sqrt(-2 * log(1 - p));
		return -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
		       ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
	}
	q = p - 0.5;
	r = q * q;
	return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
	       (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

void trace_event(uint64_t seed, uint32_t user, uint32_t date, uint32_t k,
		 uint32_t *item, uint32_t *action)
{
	static const double p_act[8] = { 0.40, 0.02, 0.004, 0.004, 0.003, 0.002,
					  0.30, 0.02 };
	uint64_t s = stream(seed ^ 0x6974656dull, ((uint64_t)user << 32) | date, k);
	double u = unit(&s);
	uint32_t a = 0;

	/* Popularity skew: low ids are watched far more often. */
	*item = (uint32_t)(KUAIRAND_ITEMS * u * u * u);
	for (int i = 0; i < 8; i++)
		if (unit(&s) < p_act[i])
			a |= 1u << i;
	*action = a;
}

/* ---------------------------------------------------------------- dates */

static int64_t date_to_day(uint32_t date)
{
	struct tm tm = { .tm_year = (int)(date / 10000) - 1900,
			 .tm_mon = (int)(date / 100 % 100) - 1,
			 .tm_mday = (int)(date % 100) };

	return (int64_t)timegm(&tm) / 86400;
}

static uint32_t day_to_date(int64_t day)
{
	time_t t = (time_t)(day * 86400);
	struct tm tm;

	gmtime_r(&t, &tm);
	return (uint32_t)((tm.tm_year + 1900) * 10000 + (tm.tm_mon + 1) * 100 + tm.tm_mday);
}

/* ---------------------------------------------------------------- building */

int trace_push(struct trace *t, uint64_t ts_ms, uint32_t user, uint32_t date,
	       uint32_t end)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 4096;
		struct trace_req *p = realloc(t->req, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		t->req = p;
		t->cap = cap;
	}
	t->req[t->n++] = (struct trace_req){ .ts_ms = ts_ms, .user = user,
					     .date = date, .end = end };
	return 0;
}

void trace_free(struct trace *t)
{
	free(t->req);
	memset(t, 0, sizeof(*t));
}

static int cmp_req(const void *pa, const void *pb)
{
	const struct trace_req *a = pa, *b = pb;

	if (a->date != b->date)
		return a->date < b->date ? -1 : 1;
	if (a->ts_ms != b->ts_ms)
		return a->ts_ms < b->ts_ms ? -1 : 1;
	if (a->user != b->user)
		return a->user < b->user ? -1 : 1;
	return a->end < b->end ? -1 : a->end > b->end;
}

/* Open addressing from a 64-bit key to a dense index. */
struct keymap {
	uint64_t *key;   /* 0: empty (keys are stored + 1) */
	uint32_t *val;
	size_t mask;
};

static int keymap_init(struct keymap *m, size_t n)
{
	size_t cap = 16;

	while (cap < 2 * n)
		cap *= 2;
	m->key = calloc(cap, sizeof(*m->key));
	m->val = calloc(cap, sizeof(*m->val));
	m->mask = cap - 1;
	return m->key && m->val ? 0 : -ENOMEM;
}

static void keymap_free(struct keymap *m)
{
	free(m->key);
	free(m->val);
}

/* The slot of key: found (*found = 1) or where it goes. */
static size_t keymap_slot(const struct keymap *m, uint64_t key, int *found)
{
	uint64_t h = key + 1, s = h;
	size_t i = (size_t)(mix64(&s) & m->mask);

	while (m->key[i] && m->key[i] != h)
		i = (i + 1) & m->mask;
	*found = m->key[i] == h;
	return i;
}

int trace_finish(struct trace *t, char *err, size_t errlen)
{
	struct keymap keys = { 0 }, users = { 0 }, days = { 0 };
	uint32_t *last = NULL;
	int rc = -ENOMEM, found;

	qsort(t->req, t->n, sizeof(*t->req), cmp_req);
	if (keymap_init(&keys, t->n) || keymap_init(&users, t->n) ||
	    keymap_init(&days, t->n) || !(last = calloc(t->n + 1, sizeof(*last)))) {
		snprintf(err, errlen, "out of memory for the keys of %zu requests", t->n);
		goto out;
	}
	t->nkeys = t->users = t->days = 0;
	for (size_t i = 0; i < t->n; i++) {
		struct trace_req *r = &t->req[i];
		size_t s = keymap_slot(&keys, trace_key(r->user, r->date), &found);

		if (!found) {
			keys.key[s] = trace_key(r->user, r->date) + 1;
			keys.val[s] = t->nkeys++;
		}
		r->kid = keys.val[s];
		r->begin = last[r->kid];
		if (r->end <= r->begin) {
			snprintf(err, errlen, "user %u on %u: a request at ts_ms %llu has history "
				 "end %u, not past the previous end %u (each interval adds events)",
				 r->user, r->date, (unsigned long long)r->ts_ms, r->end, r->begin);
			rc = -EINVAL;
			goto out;
		}
		last[r->kid] = r->end;
		s = keymap_slot(&users, r->user, &found);
		if (!found) {
			users.key[s] = (uint64_t)r->user + 1;
			t->users++;
		}
		s = keymap_slot(&days, r->date, &found);
		if (!found) {
			days.key[s] = (uint64_t)r->date + 1;
			t->days++;
		}
	}
	rc = 0;
out:
	keymap_free(&keys);
	keymap_free(&users);
	keymap_free(&days);
	free(last);
	return rc;
}

/* ---------------------------------------------------------------- generator */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Event times (ms into the day) of c events in sessions at random times. */
static void day_times(uint64_t *s, uint32_t c, uint64_t *ms)
{
	uint32_t sessions = 1 + c / SESSION_EVENTS, k = 0;

	for (uint32_t j = 0; j < sessions; j++) {
		uint32_t m = c / sessions + (j < c % sessions);
		uint64_t tms = (uint64_t)(unit(s) * 80000.0) * 1000u;

		for (uint32_t e = 0; e < m; e++, k++) {
			ms[k] = tms;
			tms += GAP_MIN_MS + (uint64_t)(-log(unit(s)) * GAP_MEAN_MS);
		}
	}
	qsort(ms, c, sizeof(*ms), cmp_u64);
}

/* Cut one user-day's events into intervals; one request per interval. */
static int day_requests(struct trace *t, uint32_t user, uint32_t date,
			int64_t day, const uint64_t *ms, uint32_t c)
{
	uint64_t base = (uint64_t)day * 86400000ull, first = ms[0];

	for (uint32_t i = 1; i <= c; i++) {
		if (i < c && ms[i] - first < TRACE_INTERVAL_GAP_MS)
			continue;
		if (trace_push(t, base + ms[i - 1], user, date, i))
			return -ENOMEM;
		if (i < c)
			first = ms[i];
	}
	return 0;
}

int trace_generate(struct trace *t, const struct trace_gen_opts *o, char *err,
		   size_t errlen)
{
	const uint32_t U = o->users, D = o->days;
	double mu = log(TRACE_HIST_MEDIAN);
	uint32_t *hist = NULL, *per_day = NULL;
	double *w = NULL;
	uint64_t *ms = NULL, s;
	int64_t day0;
	int rc = -ENOMEM;

	memset(t, 0, sizeof(*t));
	if (!U || U > TRACE_MAX_USER || !D || D > 3660) {
		snprintf(err, errlen, "a trace needs 1 to %u users and 1 to 3660 days "
			 "(asked for %u users, %u days)", TRACE_MAX_USER, U, D);
		return -EINVAL;
	}
	day0 = date_to_day(o->first_date);
	hist = calloc(U, sizeof(*hist));
	per_day = calloc(D, sizeof(*per_day));
	w = calloc(D, sizeof(*w));
	ms = calloc(TRACE_HIST_MAX, sizeof(*ms));
	if (!hist || !per_day || !w || !ms)
		goto nomem;

	/* One draw per quantile band, then shuffled among the users. */
	s = stream(o->seed, 0x68697374ull, 0);
	for (uint32_t i = 0; i < U; i++) {
		double h = exp(mu + TRACE_HIST_SIGMA * norm_inv((i + unit(&s)) / U));

		h = h < TRACE_HIST_MIN ? TRACE_HIST_MIN : h > TRACE_HIST_MAX ? TRACE_HIST_MAX : h;
		hist[i] = (uint32_t)(h + 0.5);
	}
	for (uint32_t i = U; i > 1; i--) {
		uint32_t j = (uint32_t)(mix64(&s) % i), x = hist[i - 1];

		hist[i - 1] = hist[j];
		hist[j] = x;
	}

	for (uint32_t u = 0; u < U; u++) {
		uint32_t given = 0;
		double sum = 0;

		s = stream(o->seed, 0x75736572ull, u);
		/* Daily weights: exponentials, i.e. a flat Dirichlet share. */
		for (uint32_t d = 0; d < D; d++)
			sum += w[d] = -log(unit(&s));
		for (uint32_t d = 0; d < D; d++)
			given += per_day[d] = (uint32_t)(hist[u] * w[d] / sum);
		while (given < hist[u]) {
			per_day[mix64(&s) % D]++;
			given++;
		}
		for (uint32_t d = 0; d < D; d++) {
			if (!per_day[d])
				continue;
			day_times(&s, per_day[d], ms);
			if (day_requests(t, u, day_to_date(day0 + d), day0 + d, ms, per_day[d]))
				goto nomem;
		}
	}
	rc = trace_finish(t, err, errlen);
	if (rc)
		goto out;
	t->seed = o->seed;
	t->gen_users = U;
	t->gen_days = D;
	t->first_date = o->first_date;
	goto out;
nomem:
	snprintf(err, errlen, "out of memory generating %u users over %u days", U, D);
	rc = -ENOMEM;
out:
	if (rc)
		trace_free(t);
	free(hist);
	free(per_day);
	free(w);
	free(ms);
	return rc;
}

/* ---------------------------------------------------------------- stats */

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int trace_stats(const struct trace *t, struct trace_stats *st)
{
	uint32_t *key_end = calloc(t->nkeys + 1, sizeof(uint32_t));
	uint32_t *key_user = calloc(t->nkeys + 1, sizeof(uint32_t));
	uint32_t *hist = NULL, *ids = NULL, nu = 0;
	uint64_t new_items = 0;

	memset(st, 0, sizeof(*st));
	if (!key_end || !key_user)
		goto nomem;
	for (size_t i = 0; i < t->n; i++) {
		const struct trace_req *r = &t->req[i];
		uint64_t tok = trace_tokens(r->end);

		key_end[r->kid] = r->end;
		key_user[r->kid] = r->user;
		new_items += r->end - r->begin;
		st->tokens_needed += tok;
		if (tok > st->max_request_tokens)
			st->max_request_tokens = tok;
	}
	/* Sum each user's days: sort the keys by user. */
	ids = calloc(t->nkeys + 1, sizeof(*ids));
	hist = calloc(t->nkeys + 1, sizeof(*hist));
	if (!ids || !hist)
		goto nomem;
	{
		uint64_t *pair = calloc(t->nkeys + 1, sizeof(uint64_t));

		if (!pair)
			goto nomem;
		for (uint32_t k = 0; k < t->nkeys; k++)
			pair[k] = ((uint64_t)key_user[k] << 32) | key_end[k];
		qsort(pair, t->nkeys, sizeof(*pair), cmp_u64);
		for (uint32_t k = 0; k < t->nkeys; k++) {
			uint32_t user = (uint32_t)(pair[k] >> 32);

			if (!nu || ids[nu - 1] != user) {
				ids[nu] = user;
				hist[nu++] = 0;
			}
			hist[nu - 1] += (uint32_t)pair[k];
		}
		free(pair);
	}
	st->requests = t->n;
	st->users = nu;
	st->days = t->days;
	st->keys = t->nkeys;
	if (nu) {
		qsort(hist, nu, sizeof(*hist), cmp_u32);
		for (uint32_t i = 0; i < nu; i++)
			st->items += hist[i];
		st->hist_min = hist[0];
		st->hist_max = hist[nu - 1];
		st->hist_median = hist[(nu - 1) / 2];
		st->hist_mean = (double)st->items / nu;
	}
	st->items_per_request = t->n ? (double)new_items / (double)t->n : 0;
	st->requests_per_key = t->nkeys ? (double)t->n / t->nkeys : 0;
	free(key_end);
	free(key_user);
	free(ids);
	free(hist);
	return 0;
nomem:
	free(key_end);
	free(key_user);
	free(ids);
	free(hist);
	return -ENOMEM;
}
