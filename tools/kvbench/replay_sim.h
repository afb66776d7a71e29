/* SPDX-License-Identifier: MIT */
/*
 * replay_sim.h - what a cache of a given size could at best have done with a
 * trace: the hit-rate arithmetic `kvbench replay` reports its measurements
 * against. No cache is run here; the trace is walked in its order.
 *
 * TOKEN HIT RATE = tokens not recomputed / tokens needed, summed over the
 * requests. A request of (user, date) with history end h needs
 * trace_tokens(h) tokens; the tokens found cached are hits, the rest is
 * recomputed (and appended).
 *
 * Three references, for a pool of C pages of P tokens (device + host tier:
 * a page onloaded from the host tier is not recomputed):
 *
 *   infinite  nothing is ever evicted: every request hits all the tokens its
 *             (user, date) had before. No cache does better at any size.
 *   best      the UPPER BOUND for C pages: Belady's MIN on tokens with room
 *             for C * P tokens. Every cached token of a key is next needed at
 *             the key's next request, so MIN evicts tokens of the key whose
 *             next request is farthest away (a key's part, when that is
 *             enough). It is optimal for that relaxed cache, which may keep
 *             any subset of tokens, pack pages full and know the future; a
 *             real pool (whole pages, histories kept as prefixes, no
 *             foresight) holds at most C * P tokens, so it can never hit
 *             more. The bound is for the trace's order; pipelines that
 *             reorder requests of different users see nearly the same.
 *   lru       whole-history LRU over C pages (ceil(tokens / P) per key): what
 *             kvpool's policy amounts to when device and host tier are seen
 *             as one LRU. A check on the measured figure, not a bound.
 */
#ifndef KVBENCH_REPLAY_SIM_H
#define KVBENCH_REPLAY_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "trace.h"

enum sim_kind { SIM_INFINITE, SIM_BEST, SIM_LRU, NSIM };

struct sim_result {
	uint64_t needed;            /* tokens needed, all requests */
	uint64_t hit[NSIM];         /* tokens hit */
	/* Per time bucket (optional: NULL arrays are skipped), of nbuckets. */
	uint64_t *bucket_needed;
	uint64_t *bucket_hit[NSIM];
};

/*
 * Walk the first nreq requests of t for a pool of capacity_pages pages of
 * page_tokens tokens. Buckets: request i goes to bucket
 * (ts_ms - t0_ms) / bucket_ms, clamped to nbuckets - 1. Returns 0 or -ENOMEM.
 */
int sim_run(const struct trace *t, size_t nreq, uint32_t page_tokens,
	    uint64_t capacity_pages, uint64_t t0_ms, uint64_t bucket_ms,
	    uint32_t nbuckets, struct sim_result *r);

static inline double sim_rate(uint64_t hit, uint64_t needed)
{
	return needed ? (double)hit / (double)needed : 0;
}

#endif /* KVBENCH_REPLAY_SIM_H */
