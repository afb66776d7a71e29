/* SPDX-License-Identifier: MIT */
/*
 * clock.h - the one clock helper of the daemon, the library and the tools.
 *
 * CLOCK_MONOTONIC for intervals, deadlines and LRU ticks (it never jumps);
 * CLOCK_REALTIME only for times shown to people (chunk created/last
 * access). Both in nanoseconds as uint64_t: 584 years of range.
 * Header-only: a vDSO call and a multiply, inlined where it is timed.
 */
#ifndef KVPOOL_LIB_CLOCK_H
#define KVPOOL_LIB_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC, ns. */
static inline uint64_t mono_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* CLOCK_MONOTONIC, ms (timeouts counted in milliseconds). */
static inline uint64_t mono_ms(void)
{
	return mono_ns() / 1000000u;
}

/* The CLOCK_MONOTONIC instant ns from now, as the absolute timeout a
 * futex or a CLOCK_MONOTONIC condition variable takes. */
static inline struct timespec mono_deadline(uint64_t ns)
{
	uint64_t t = mono_ns() + ns;

	return (struct timespec){ .tv_sec = (time_t)(t / 1000000000ull),
				  .tv_nsec = (long)(t % 1000000000ull) };
}

/* CLOCK_REALTIME, ns since the epoch. */
static inline uint64_t real_ns(void)
{
	return clock_ns(CLOCK_REALTIME);
}

#endif /* KVPOOL_LIB_CLOCK_H */
