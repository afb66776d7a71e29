/* SPDX-License-Identifier: MIT */
/*
 * worker.h - the threads that poll client rings.
 *
 * Every attached client has one lane (ring pair) per worker, and worker k
 * serves lane k of every client (proto.h, LANES): entries of one user come
 * on one lane and run in ring order. A worker polls while there is work,
 * spins spin_us when there is none, then sleeps in futex_waitv on its
 * lanes' doorbells and its own control word.
 */
#ifndef KVPOOLD_WORKER_H
#define KVPOOLD_WORKER_H

#include "kvpool_engine.h"
#include "server.h"

/* Start cfg->workers threads; -errno with e. */
int workers_start(struct server *s, struct errbuf *e);
/* Stop and join every worker; clients stay registered for the caller. */
void workers_stop(struct server *s);

/* Main thread: give lane k of an attached client to worker k. */
void worker_assign(struct server *s, struct client *c);
/* Wake a worker to look at its control state (new client, detach, stop). */
void worker_kick(struct worker *w);
/* Main thread: hand c's uds request (c->uds_sqe) to the worker of c's
 * lane 0. It runs after c's entries published there before it and behind
 * c's parked completions of the same user; the worker sends the reply and
 * turns EPOLLIN back on for c's socket. */
void worker_uds_submit(struct client *c);

#endif /* KVPOOLD_WORKER_H */
