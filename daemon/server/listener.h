/* SPDX-License-Identifier: MIT */
/*
 * listener.h - the Unix socket: single-instance startup, accept, the attach
 * handshake, reading "uds" requests, and a client's hang-up. Main thread
 * only. It sits above the clients and the workers (it hands them clients
 * and requests); the workers answer uds requests themselves
 * (worker_uds_reply) and never call back here.
 */
#ifndef KVPOOLD_LISTENER_H
#define KVPOOLD_LISTENER_H

#include <sys/types.h>

#include "kvpool_engine.h"
#include "proto.h"
#include "server.h"

/*
 * Take PATH.lock, refuse if another kvpoold serves PATH (-EADDRINUSE),
 * remove a stale socket, create the parent directory, bind and listen.
 * -errno with a message in e.
 */
int listener_open(struct listener *l, const struct config *cfg,
		  struct errbuf *e);
/* Close; unlink the socket and the lock if they are ours. */
void listener_close(struct listener *l, const struct config *cfg);

/* The listening socket is readable: accept up to a batch of connections;
 * at EMFILE shed the newest pending one (listener.c says how). */
void listener_accept(struct server *s);
/* A client socket is readable: its hello, or a uds request. */
void listener_readable(struct server *s, struct client *c);

/*
 * Timers, at now_ms (log_now_ms()): close the pending connections older
 * than hello_timeout_ms, and accept again after a pause. Returns the ms
 * until the next one is due, or -1 when none is: the loop's epoll timeout.
 */
int listener_tick(struct server *s, uint64_t now_ms);

/*
 * Validate a hello datagram of len bytes (len: its real size, longer than
 * h when it was truncated): 0 and the ring geometry (sq, cq entries, arena
 * bytes) with the defaults applied in geo, or -errno with what is wrong in
 * e. Pure: fuzz/fuzz_hello.c drives it.
 */
int hello_check(const struct config *cfg, const struct kvp_hello *h,
		ssize_t len, uint32_t geo[3], struct errbuf *e);

/* Main thread: the peer hung up or its process exited (a pending client
 * is finalized at once; a live one's workers are kicked to let go). */
void listener_hangup(struct server *s, struct client *c, const char *why);

#endif /* KVPOOLD_LISTENER_H */
