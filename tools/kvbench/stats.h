/* SPDX-License-Identifier: MIT */
/*
 * stats.h - timing samples and their summaries, for every kvbench benchmark.
 *
 * A benchmark allocates a sample array before it starts timing (so nothing is
 * allocated inside the measured loop), stores one duration per timed call,
 * and summarises the array once the loop is over. Percentiles are exact:
 * the array is sorted and the nearest-rank sample is reported (p50 of
 * 1..100 is 50, p99 is 99), never interpolated.
 *
 * The clock is CLOCK_MONOTONIC through the vDSO: 15-30 ns a read where the
 * kernel's clocksource is the TSC. timer_overhead() measures what an empty
 * timed region costs on this machine, so results can be read against it.
 */
#ifndef KVBENCH_STATS_H
#define KVBENCH_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "clock.h"

/* Nanoseconds from CLOCK_MONOTONIC (lib/clock.h); inline so a timed region
 * costs one call. */
static inline uint64_t now_ns(void)
{
	return mono_ns();
}

/* A preallocated array of durations (ns). */
struct samples {
	uint64_t *v;
	size_t n;
	size_t cap;
};

/* Allocate room for cap samples and touch it (no page faults while timing).
 * Returns 0 or -ENOMEM. */
int samples_init(struct samples *s, size_t cap);
void samples_free(struct samples *s);

/* Add one sample; past cap the sample is dropped (counted in n only up to cap). */
static inline void samples_add(struct samples *s, uint64_t x)
{
	if (s->n < s->cap)
		s->v[s->n++] = x;
}

/* Append every sample of src to dst (up to dst's cap). */
void samples_append(struct samples *dst, const struct samples *src);

struct summary {
	size_t n;
	double mean;
	uint64_t min;
	uint64_t p50;
	uint64_t p90;
	uint64_t p99;
	uint64_t p999;
	uint64_t max;
};

/* Sort s in place and summarise it; an empty array gives all zeros. */
void samples_summarize(struct samples *s, struct summary *out);

/* Nearest-rank percentile p (0..100] of n sorted values; 0 when n == 0. */
uint64_t percentile_sorted(const uint64_t *v, size_t n, double p);

/* Median of n doubles (sorts v in place); the mean of the middle two when n is
 * even; 0 when n == 0. */
double median_f64(double *v, size_t n);

/*
 * The cost of an empty timed region: n back-to-back now_ns() pairs, summarised
 * into *out. n is capped at 1,000,000. Returns 0 or -ENOMEM.
 */
int timer_overhead(size_t n, struct summary *out);

#endif /* KVBENCH_STATS_H */
