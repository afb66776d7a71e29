/* SPDX-License-Identifier: MIT */
/*
 * worker.h - the threads that poll client rings.
 *
 * Every attached client has one lane (ring pair) per worker, and worker k
 * serves lane k of every client (proto.h, LANES): entries of one user come
 * on one lane and run in ring order. A worker polls while there is work,
 * spins spin_us after its last work, then sleeps in futex_waitv on its
 * lanes' doorbells and its own control word; a wake-up that brings no work
 * does not spin again (worker.c, SLEEPING).
 *
 * The workers sit below the listener (which hands them clients and uds
 * requests) and above the clients and the operations: nothing they call
 * calls back into worker*.c.
 */
#ifndef KVPOOLD_WORKER_H
#define KVPOOLD_WORKER_H

#include "kvpool_engine.h"
#include "proto.h"
#include "server.h"

/* Start cfg->workers threads; -errno with e. */
int workers_start(struct server *s, struct errbuf *e);
/* Stop and join every worker; clients stay registered for the caller. */
void workers_stop(struct server *s);

/* Main thread: give lane k of an attached client to worker k. */
void worker_assign(struct server *s, struct client *c);
/* Wake a worker to look at its control state (new client, detach, stop). */
void worker_kick(struct worker *w);
/* Kick the worker of every lane of c (it should look at c's state). */
void worker_kick_client(struct client *c);
/* Main thread: hand c's uds request (c->uds_sqe) to the worker of c's
 * lane 0. It runs after c's entries published there before it and behind
 * c's parked completions of the same user; the worker sends the reply and
 * turns EPOLLIN back on for c's socket. */
void worker_uds_submit(struct client *c);
/* Send a uds reply: cqe, then cqe->out_bytes of out, in one message,
 * without blocking. 0 or -errno (-EAGAIN: the client does not read). The
 * workers answer requests with it, the listener refusals. */
int worker_uds_reply(int sock, const struct kvp_cqe *cqe, const void *out);

#endif /* KVPOOLD_WORKER_H */
