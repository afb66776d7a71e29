/* SPDX-License-Identifier: MIT */
/*
 * shm.h - a client's shared memory: header, ring control, SQ, CQ, arena.
 *
 * One sealed memfd per client, laid out as libclient/proto.h says. The
 * daemon writes the header once, before the fd leaves the process, and
 * never reads it back: the ring geometry it uses is the copy kept here.
 */
#ifndef KVPOOLD_SHM_H
#define KVPOOLD_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "proto.h"

struct client_shm {
	int fd;                     /* sent to the client; closed after */
	void *base;
	size_t bytes;
	struct kvp_ring_ctl *ctl;
	struct kvp_sqe *sqes;
	struct kvp_cqe *cqes;
	unsigned char *arena;
	uint32_t sq_entries;        /* daemon-side copies: never re-read */
	uint32_t cq_entries;
	uint32_t arena_bytes;
};

/*
 * Create, size, seal (grow, shrink, seal) and map the memfd and write its
 * header. Entries and arena size must already be validated.
 */
int shm_create(struct client_shm *s, uint32_t client_id, uint32_t sq_entries,
	       uint32_t cq_entries, uint32_t arena_bytes, struct errbuf *e);
void shm_destroy(struct client_shm *s);

/* Drop the daemon's fd once the client has it; the mapping stays. */
void shm_close_fd(struct client_shm *s);

#endif /* KVPOOLD_SHM_H */
