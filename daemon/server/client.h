/* SPDX-License-Identifier: MIT */
/*
 * client.h - one attached process: its credentials, tenant, shm and rings,
 * and the life cycle that keeps a dead client from being used after free.
 *
 * The clients sit below the listener and the workers, which move them
 * through this life cycle (listener_hangup, worker_kick_client); nothing
 * here calls either.
 *
 * Life cycle (state is atomic; the main thread owns the struct):
 *
 *   HELLO ── hello ok ──▶ LIVE ──┬─ main: hang-up / pidfd ─▶ DETACHING ─┐
 *                                └─ worker: broken ring ───▶ DETACHING ─┤
 *                                                                       ▼
 *   worker drops it from its list, never touches it again, queues it ─▶ RETIRED
 *   main: release its leases (tenant mutex), unmap, close, unregister, free.
 *
 * Only the worker serving a client reads its rings, and it queues the client
 * back only after it has stopped, so the main thread can release the leases
 * knowing no operation of that client is running or will run. Completions
 * the worker had parked (park.h) are never published then; the main thread
 * waits for their onloads to land before it releases the leases.
 */
#ifndef KVPOOLD_CLIENT_H
#define KVPOOLD_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "park.h"
#include "server.h"
#include "shm.h"
#include "tenant.h"

struct op_batch;

/*
 * One ring pair of a client (proto.h, LANES) and what its worker keeps of
 * it. Everything below `worker` is that worker thread's own: the main
 * thread reads it only after every lane was dropped (client_retire).
 */
/* An entry a lane keeps, copied out of the SQ (worker.c, DEFERRAL). */
struct lane_defer {
	struct kvp_sqe sqe;
	uint64_t user;              /* valid when has_user */
	bool has_user;              /* false: no single user (waits for all) */
	uint64_t since;             /* waiting for the reclaimer since
				     * (CLOCK_MONOTONIC ns); 0: not */
	uint64_t retry_at;          /* a lower tier's wait: not tried again
				     * before (ns); 0: every pass */
	struct op_batch *b;         /* a BATCH entry's items (ops.h); NULL:
				     * not a batch */
};

struct lane {
	struct client *c;
	struct worker *worker;
	struct lane *qnext;         /* the worker's incoming queue */
	uint32_t index;
	struct kvp_ring_ctl *ctl;
	struct kvp_sqe *sqes;
	struct kvp_cqe *cqes;
	/* The worker's ring indices: authoritative, never read back. */
	uint32_t sq_head;
	uint32_t cq_tail;
	/* Completions waiting for an onload, and the entries copied out of
	 * the SQ that wait: behind a parked completion or an earlier deferred
	 * entry of their user, or for the reclaimer (worker.c, DEFERRAL). */
	struct park_list park;
	struct lane_defer *dq;      /* cq_entries, allocated on first use */
	uint32_t ndq;
	uint32_t sq_tail_seen;      /* sq_tail as the last ring pass read it */
	uint32_t pub_pos;           /* PHASES (worker.c): cq_tail after the last
				     * timed publish of a prepare, */
	uint64_t pub_ns;            /* and when; 0: none waits for its reap */
} __attribute__((aligned(64)));

enum client_state {
	CLIENT_HELLO,
	CLIENT_LIVE,
	CLIENT_DETACHING,
	CLIENT_RETIRED,
};

/* Result buffer of one uds request (a kvp_sqe's out_len is capped to it). */
#define UDS_RESULT_MAX (64u << 10)

/* The "uds" request of a client (at most one at a time; worker.c). */
enum uds_state {
	UDS_IDLE,       /* the main thread may read the next one */
	UDS_QUEUED,     /* main -> worker: uds_sqe waits for its turn */
	UDS_PARKED,     /* run; its reply waits for an onload (uds_park) */
};

struct client {
	struct watch sock_w;
	struct watch pid_w;
	struct client *prev, *next; /* registry, or the pending list */
	struct client *qnext;       /* a worker's incoming queue, the retired
				     * queue, or the graveyard */
	uint32_t id;                /* 0 until attached; the lease owner */
	uint32_t pid, uid, gid;
	char name[32];
	struct admission adm;       /* decided at accept, answered at hello */
	struct tenant *tenant;      /* NULL: admin-only */
	uint32_t pool;              /* hello.pool: the tenant's engine it uses */
	uint32_t rank;              /* hello.rank: its rank in a tensor-parallel
				     * pool (0 in any other) */
	bool admin;
	int sock;
	int pidfd;                  /* -1 where the kernel has none */
	bool watched;               /* sock (and pidfd) are in the epoll set */
	bool freed;                 /* finalized: ignore events still queued */
	struct client_shm shm;
	struct worker *worker;      /* lane 0's: it serves the uds requests */
	uint32_t state;             /* enum client_state; atomic */
	const char *why;            /* set by whoever moved it to DETACHING */
	uint64_t ops;               /* completed operations; atomic */
	uint64_t leases;            /* held now; atomic */

	/* One per worker (proto.h, LANES): lane k is worker k's. */
	struct lane *lanes;
	uint32_t nlanes;
	uint32_t lanes_live;        /* on a worker's list; atomic. The worker
				     * that drops the last one retires c. */

	/* Pending only (listener.c): when it was accepted (log_now_ms), for
	 * hello_timeout_ms. */
	uint64_t accepted_ms;

	/* The "uds" request mode. The main thread reads one request, stops
	 * reading the socket (EPOLLIN off) and hands it to the worker, which
	 * runs it in the client's order (after its ring entries published
	 * before it, behind its parked completions of the same user), answers
	 * it and turns EPOLLIN back on. */
	uint32_t uds_state;         /* enum uds_state; atomic */
	struct kvp_sqe uds_sqe;     /* main thread's copy of the request */
	unsigned char *uds_out;     /* its result bytes (UDS_RESULT_MAX) */
	/* The worker's own: */
	bool uds_seen;              /* seen QUEUED before this pass's rings */
	struct park uds_park;       /* a parked reply: its user, and the
				     * onload it waits for (eng, fence) */
};

/* Main thread: a connection accepted on sock, not attached yet. */
struct client *client_new(struct server *s, int sock);
/* Main thread: from pending to the registry, with its new id. */
void client_register(struct server *s, struct client *c);

/* Main thread: take c's socket and pidfd out of the epoll set. */
void client_unwatch(struct server *s, struct client *c);
/* Main thread: release, unmap, close, unregister; freed after the batch. */
void client_finalize(struct server *s, struct client *c);
/* Main thread: free what client_finalize() left in the graveyard. */
void client_bury(struct server *s);

/* Main thread, at attach: the lanes over the shm's ring pairs. */
int client_lanes_init(struct client *c);

/* Worker: c is off its list for good; hand it to the main thread. */
void client_retire(struct server *s, struct client *c);
/* Main thread: finalize every client the workers handed back. */
void client_reap_retired(struct server *s);

/* Try LIVE -> DETACHING; true for the caller that moved it. */
bool client_begin_detach(struct client *c, const char *why);

#endif /* KVPOOLD_CLIENT_H */
