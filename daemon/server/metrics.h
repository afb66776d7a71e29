/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - what kvpoold counts for Prometheus, and the /metrics endpoint.
 *
 * Two halves. Recording (metrics_ops.c) is on the data path: each worker
 * thread owns one struct op_metrics and is its only writer, so an operation
 * costs two clock reads and a few stores to a line no other thread writes;
 * nothing is shared, nothing is locked. Serving (metrics.c) runs on a
 * thread of its own that drives libmicrohttpd and closes slow
 * connections: a scrape sums every worker's counters (relaxed
 * loads: a scrape may see one worker a few operations later than another,
 * which a monitoring system cannot tell from scrape timing anyway), reads
 * each tenant's pools as `kvctl stats` does (shard_set_stats, each shard's
 * mutex briefly) and writes the text exposition format.
 *
 * The counters are kept with or without --metrics. The latency histograms
 * cost two clock reads per prepare, commit and offload (about 100 ns on
 * the 2-core test machine), so they are kept only once someone looks:
 * from the start with --metrics, else from the first KVP_OP_LATENCY
 * (kvctl top) on (metrics_timing).
 */
#ifndef KVPOOLD_METRICS_H
#define KVPOOLD_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpool_engine.h"
#include "proto.h"

struct server;

/* Operations with a latency histogram. ONLOAD: from the prepare that
 * started the copy to its completion's publication (the copy landed). */
enum metrics_lat {
	LAT_PREPARE,
	LAT_COMMIT,
	LAT_OFFLOAD,
	LAT_ONLOAD,
	/* The phases of a ring prepare (kvpool.h, struct kvp_ring_phases;
	 * worker.c records them), in enum kvp_phase's order. */
	LAT_PH_QUEUE,
	LAT_PH_EXECUTE,
	LAT_PH_PUBLISH,
	LAT_PH_WAKE,
	LAT_KINDS,
};
#define LAT_OPS LAT_PH_QUEUE /* the kinds before the phases */

/* Upper bounds of the histogram buckets, ns; one more bucket is +Inf. */
#define METRICS_BUCKETS 18
extern const uint64_t metrics_bucket_ns[METRICS_BUCKETS];

/* Errors by kind: the errnos a client can act on differently, then
 * everything else (METRICS_ERR_OTHER). */
#define METRICS_ERR_KINDS 12
#define METRICS_ERR_OTHER (METRICS_ERR_KINDS - 1)
extern const int metrics_err_errno[METRICS_ERR_OTHER];

/* One worker's counters: written by that worker only, read by scrapes. */
struct op_metrics {
	uint64_t ops[KVP_OP_MAX];
	uint64_t errors[KVP_OP_MAX][METRICS_ERR_KINDS];
	uint64_t lat[LAT_KINDS][METRICS_BUCKETS + 1];
	uint64_t lat_ns[LAT_KINDS];  /* the histograms' sums */
} __attribute__((aligned(64)));

/* The calling thread's counters; NULL (the default) records nothing. */
extern __thread struct op_metrics *metrics_self;
/* Whether operations are timed for the histograms; only ever turned on. */
extern bool metrics_timing;

/* A timestamp for metrics_op_done: 0 when nothing records or the
 * operation has no histogram (only those read the clock). */
uint64_t metrics_op_start(uint32_t opcode);
/* One finished operation: counted, its error (res < 0) by kind, and for
 * prepare, commit and offload its latency since t0. */
void metrics_op_done(uint32_t opcode, int32_t res, uint64_t t0);
/* One latency of kind k, ns (the onload of a parked prepare). */
void metrics_lat(enum metrics_lat k, uint64_t ns);
/* Whether this thread records latencies now (a worker, timing on). */
bool metrics_timed(void);

/* The bucket an interval falls in (METRICS_BUCKETS: +Inf). */
uint32_t metrics_bucket(uint64_t ns);

/* An opcode's name, NULL for one that is not defined (ops_name). */
typedef const char *metrics_op_name_fn(uint32_t opcode);

/*
 * The per-worker counters (before the workers start: metrics_open), then
 * with cfg->metrics set the HTTP server (after: metrics_serve), which logs
 * where it listens. -errno with e; metrics_close undoes both. op_name
 * names the opcodes in the exposition: the operations record here
 * (ops.c), so the metrics take the names from main rather than include
 * the operations, which would close a circle.
 */
int metrics_open(struct server *s, metrics_op_name_fn *op_name,
		 struct errbuf *e);
int metrics_serve(struct server *s, struct errbuf *e);
void metrics_close(struct server *s);

/*
 * The whole exposition for s, written to f (metrics.c; a scrape's answer).
 * Returns 0 or -errno.
 */
int metrics_write(struct server *s, FILE *f);
/* The process_* families (metrics_process.c): CPU, memory, descriptors,
 * start time, as Prometheus' client libraries name them. */
void metrics_write_process(const struct server *s, FILE *f);

/* The latency histograms summed over the workers (KVP_OP_LATENCY). */
struct kvp_latency;
void metrics_latency(struct server *s, struct kvp_latency *out);
/* The ring phase histograms (kvp_ring_phases); turns timing on too. */
void metrics_phases(struct server *s, struct kvp_ring_phases *out);

/* One line for `systemctl status` (STATUS=): clients and each tier's frames
 * used, over every tenant and pool. */
void metrics_status_line(struct server *s, char *buf, size_t len);

#endif /* KVPOOLD_METRICS_H */
