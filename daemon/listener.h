/* SPDX-License-Identifier: MIT */
/*
 * listener.h - the Unix socket: single-instance startup, accept, the attach
 * handshake, and the "uds" request mode. Main thread only.
 */
#ifndef KVPOOLD_LISTENER_H
#define KVPOOLD_LISTENER_H

#include "errbuf.h"
#include "server.h"

/* Result buffer of one uds request (a kvp_sqe's out_len is capped to it). */
#define UDS_RESULT_MAX (64u << 10)

/*
 * Take PATH.lock, refuse if another kvpoold serves PATH (-EADDRINUSE),
 * remove a stale socket, create the parent directory, bind and listen.
 * -errno with a message in e.
 */
int listener_open(struct listener *l, const struct config *cfg,
		  struct errbuf *e);
/* Close; unlink the socket and the lock if they are ours. */
void listener_close(struct listener *l, const struct config *cfg);

/* The listening socket is readable: accept every pending connection. */
void listener_accept(struct server *s);
/* A client socket is readable: its hello, or a uds request. */
void listener_readable(struct server *s, struct client *c);

#endif /* KVPOOLD_LISTENER_H */
