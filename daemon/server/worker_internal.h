/* SPDX-License-Identifier: MIT */
/*
 * worker_internal.h - a worker's state, shared by worker.c (lanes, rings,
 * passes, sleeping) and worker_uds.c (requests on the attach socket).
 */
#ifndef KVPOOLD_WORKER_INTERNAL_H
#define KVPOOLD_WORKER_INTERNAL_H

#include <linux/futex.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ops.h"
#include "worker.h"

#define WAITV_CLIENTS (FUTEX_WAITV_MAX - 1)
#define POLL_NS 1000000L
#define PARK_POLL_NS 20000L /* idle worker with parked completions */
/* How long a prepare waits for the reclaimer before it evicts for itself
 * (a few of the reclaimer's rounds: up to 128 pages each, shard.c). */
#define RECLAIM_WAIT_NS 5000000ull
/* How often an entry waiting for a lower tier (the disk or remote thread
 * reads) is tried again. It waits until the tier answers, however long
 * (the tier bounds it: a read completes or fails, remote_timeout_ms); a
 * try takes its shard's lock, so not on every pass of a busy worker. */
#define TIER_RETRY_NS 20000ull
/* Operations one lane's pass takes at most (a batch entry counts its
 * items): with batches of KVP_BATCH_MAX a full ring is 256 x sq_entries
 * operations, which would hold the worker's other clients for that long.
 * The rest waits in the ring for the next pass, after the other lanes;
 * but not in a pass with uds requests, which go after every ring entry
 * published before them (worker.c: uds requests). */
#define PASS_BUDGET 1024u

struct worker {
	struct server *s;
	pthread_t thread;
	uint32_t index;
	uint32_t ctl;               /* private futex; bumped by worker_kick */
	uint32_t stop;              /* atomic */
	pthread_mutex_t lock;       /* guards incoming */
	struct lane *incoming;

	/* the worker thread's own: lane `index` of every client */
	struct lane **lanes;
	uint32_t n, cap;
	struct op_scratch scratch;
	uint32_t parked;            /* completions parked, all clients */
	uint32_t uds_gen;           /* atomic: bumped by worker_uds_submit */
	uint32_t uds_gen_seen;
	uint32_t uds_busy;          /* clients whose uds request waits or parks */
	bool uds_rescan;            /* lanes came in: look at every one */
	bool no_waitv;              /* kernel before 5.16 */
	struct futex_waitv waitv[FUTEX_WAITV_MAX];
};

/* worker.c: lane i is done with (why: logged; NULL: the client is going). */
void drop_lane(struct worker *w, uint32_t i, const char *why);

/* worker_uds.c: before any ring of a pass, which clients have a request
 * handed over; after the rings, serve them (requests answered). */
bool uds_note(struct worker *w);
uint32_t uds_pass(struct worker *w);

#endif /* KVPOOLD_WORKER_INTERNAL_H */
