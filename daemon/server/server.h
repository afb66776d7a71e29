/* SPDX-License-Identifier: MIT */
/*
 * server.h - the daemon's state, shared by the listener (main thread), the
 * workers and the operations.
 *
 * Threads: the main thread owns the sockets, the epoll loop and every
 * client's life cycle (accept, attach, detach, free). Workers own the rings
 * of the clients assigned to them. Operations run on the worker serving the
 * client, rings and "uds" requests alike (the main thread only reads a uds
 * request and hands it over), and reach shared state only under a lock: a
 * tenant's mutex for its engine, the registry's for the client list.
 */
#ifndef KVPOOLD_SERVER_H
#define KVPOOLD_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "tenant.h"

/* What an epoll event is about; embedded in the object it watches. */
enum watch_kind {
	WATCH_LISTEN,
	WATCH_SIGNAL,
	WATCH_RETIRE,
	WATCH_CLIENT_SOCK,
	WATCH_CLIENT_PID,
};

struct watch {
	enum watch_kind kind;
};

struct client;
struct worker;
struct op_metrics;
struct MHD_Daemon;

/* Attached clients in id order (ids only grow, so appending keeps it). */
struct registry {
	pthread_mutex_t lock;       /* writers: main thread; readers: CLIENTS */
	struct client *head, *tail;
	uint32_t live;              /* attached clients; atomic */
};

struct listener {
	int fd;
	int lock_fd;
	int spare_fd;               /* given up to accept-and-close at EMFILE */
	uint64_t paused_until_ms;   /* not accepting until then (no fd left) */
	char *lock_path;
	bool locked;                /* we hold PATH.lock: ours to unlink */
	bool bound;                 /* the socket file is ours to unlink */
	struct watch w;
};

struct server {
	const struct config *cfg;
	uint64_t started_real_ns;   /* CLOCK_REALTIME at start (server info) */
	uint64_t started_mono_ns;   /* CLOCK_MONOTONIC then: the uptime */
	struct tenants tenants;
	struct registry reg;
	struct worker *workers;
	uint32_t nworkers;
	/* --metrics (metrics.h): one counter block per worker, the server */
	struct op_metrics *opm;
	uint32_t nopm;
	struct metrics_http *http;

	/* main thread only */
	int epfd;
	struct listener lis;
	int sigfd;
	struct watch sig_w;
	struct client *pending;     /* accepted, not attached yet; newest first */
	uint32_t npending;
	struct client *graveyard;   /* finalized; freed after the epoll batch */
	uint32_t next_id;           /* last client id handed out; never reused */
	bool stopping;

	/* workers hand retired clients to the main thread here */
	int retire_fd;              /* eventfd */
	struct watch retire_w;
	pthread_mutex_t retire_lock;
	struct client *retired;
};

#define container_of(p, type, member) \
	((type *)(void *)((char *)(p) - offsetof(type, member)))

#endif /* KVPOOLD_SERVER_H */
