/* SPDX-License-Identifier: MIT */
/*
 * metrics_ops.c - recording operations for the metrics (metrics.h): per
 * worker counters and latency buckets, merged only when scraped.
 *
 * Each struct op_metrics has one writer (its worker), so an increment is a
 * relaxed load and a relaxed store, not a locked add: no other thread ever
 * writes the line, and the relaxed store keeps a scrape's concurrent load
 * from seeing a torn value.
 */
#include <errno.h>

#include "clock.h"
#include "metrics.h"

__thread struct op_metrics *metrics_self;
bool metrics_timing;

/* 1 us to 1 s, about three steps a decade: a prepare served from the
 * pool takes microseconds, one that onloads or evicts for itself
 * milliseconds. */
const uint64_t metrics_bucket_ns[METRICS_BUCKETS] = {
	1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2500000, 5000000, 10000000, 25000000, 50000000, 100000000,
	250000000, 1000000000,
};

const int metrics_err_errno[METRICS_ERR_OTHER] = {
	ENOMEM, EINVAL, ENOENT, EPERM, EACCES, EBUSY, EAGAIN, EEXIST, ESTALE,
	EMSGSIZE, ENOSPC,
};

static inline void bump(uint64_t *p, uint64_t by)
{
	__atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + by,
			 __ATOMIC_RELAXED);
}

uint32_t metrics_bucket(uint64_t ns)
{
	uint32_t i = 0;

	while (i < METRICS_BUCKETS && ns > metrics_bucket_ns[i])
		i++;
	return i;
}

static uint32_t err_kind(int32_t res)
{
	for (uint32_t i = 0; i < METRICS_ERR_OTHER; i++)
		if (-res == metrics_err_errno[i])
			return i;
	return METRICS_ERR_OTHER;
}

uint64_t metrics_op_start(uint32_t opcode)
{
	if (!metrics_self || !__atomic_load_n(&metrics_timing, __ATOMIC_RELAXED))
		return 0;
	switch (opcode) {
	case KVP_OP_PREPARE:
	case KVP_OP_COMMIT:
	case KVP_OP_OFFLOAD:
		return mono_ns();
	default:
		return 0;
	}
}

bool metrics_timed(void)
{
	return metrics_self && __atomic_load_n(&metrics_timing, __ATOMIC_RELAXED);
}

void metrics_lat(enum metrics_lat k, uint64_t ns)
{
	struct op_metrics *m = metrics_self;

	if (!m)
		return;
	bump(&m->lat[k][metrics_bucket(ns)], 1);
	bump(&m->lat_ns[k], ns);
}

void metrics_op_done(uint32_t opcode, int32_t res, uint64_t t0)
{
	struct op_metrics *m = metrics_self;

	if (!m || opcode >= KVP_OP_MAX)
		return; /* an invalid opcode is counted by nothing but its error */
	bump(&m->ops[opcode], 1);
	if (res < 0)
		bump(&m->errors[opcode][err_kind(res)], 1);
	if (!t0)
		return; /* not timed (metrics_timing was off when it began) */
	switch (opcode) {
	case KVP_OP_PREPARE:
		metrics_lat(LAT_PREPARE, mono_ns() - t0);
		break;
	case KVP_OP_COMMIT:
		metrics_lat(LAT_COMMIT, mono_ns() - t0);
		break;
	case KVP_OP_OFFLOAD:
		metrics_lat(LAT_OFFLOAD, mono_ns() - t0);
		break;
	default:
		break;
	}
}
