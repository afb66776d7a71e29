/* SPDX-License-Identifier: MIT */
/*
 * stats.c - sample arrays, exact percentiles and the timer's own cost.
 *
 * Sorting is qsort on 64-bit keys: a million samples sort in well under a
 * second, and the sort runs after the timed loop, so a histogram's fixed
 * error is not worth having.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

int samples_init(struct samples *s, size_t cap)
{
	s->n = 0;
	s->cap = cap;
	s->v = NULL;
	if (cap == 0)
		return 0;
	if (cap > SIZE_MAX / sizeof(*s->v))
		return -ENOMEM;
	s->v = malloc(cap * sizeof(*s->v));
	if (!s->v)
		return -ENOMEM;
	/* Fault every page in now, not inside the timed loop. */
	memset(s->v, 0, cap * sizeof(*s->v));
	return 0;
}

void samples_free(struct samples *s)
{
	free(s->v);
	s->v = NULL;
	s->n = s->cap = 0;
}

void samples_append(struct samples *dst, const struct samples *src)
{
	size_t room = dst->cap - dst->n;
	size_t n = src->n < room ? src->n : room;

	if (n) {
		memcpy(dst->v + dst->n, src->v, n * sizeof(*src->v));
		dst->n += n;
	}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

static int cmp_f64(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

uint64_t percentile_sorted(const uint64_t *v, size_t n, double p)
{
	double rank;
	size_t i;

	if (n == 0)
		return 0;
	/* Nearest rank: the smallest value with at least p% of samples <= it. */
	rank = ceil(p / 100.0 * (double)n);
	if (rank < 1)
		rank = 1;
	i = (size_t)rank - 1;
	if (i >= n)
		i = n - 1;
	return v[i];
}

void samples_summarize(struct samples *s, struct summary *out)
{
	long double sum = 0;
	size_t i;

	memset(out, 0, sizeof(*out));
	out->n = s->n;
	if (s->n == 0)
		return;
	qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
	for (i = 0; i < s->n; i++)
		sum += s->v[i];
	out->mean = (double)(sum / s->n);
	out->min = s->v[0];
	out->max = s->v[s->n - 1];
	out->p50 = percentile_sorted(s->v, s->n, 50);
	out->p90 = percentile_sorted(s->v, s->n, 90);
	out->p99 = percentile_sorted(s->v, s->n, 99);
	out->p999 = percentile_sorted(s->v, s->n, 99.9);
}

double median_f64(double *v, size_t n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_f64);
	if (n % 2)
		return v[n / 2];
	return (v[n / 2 - 1] + v[n / 2]) / 2;
}

int timer_overhead(size_t n, struct summary *out)
{
	struct samples s;
	size_t i;
	int rc;

	if (n > 1000000)
		n = 1000000;
	rc = samples_init(&s, n);
	if (rc)
		return rc;
	for (i = 0; i < n; i++) {
		uint64_t t0 = now_ns();
		/* Keep the compiler from merging the two reads. */
		__asm__ __volatile__("" ::: "memory");
		uint64_t t1 = now_ns();

		samples_add(&s, t1 - t0);
	}
	samples_summarize(&s, out);
	samples_free(&s);
	return 0;
}
