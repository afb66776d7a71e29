/* SPDX-License-Identifier: MIT */
/*
 * shm.h - a client's shared memory: header, its lanes' ring control, SQ and
 * CQ, arena.
 *
 * One sealed memfd per client, laid out as libclient/proto.h says. The
 * daemon writes the header once, before the fd leaves the process, and
 * never reads it back: the ring geometry it uses is the copy kept here.
 */
#ifndef KVPOOLD_SHM_H
#define KVPOOLD_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool_engine.h"
#include "proto.h"

struct client_shm {
	int fd;                     /* sent to the client; closed after */
	void *base;
	size_t bytes;
	unsigned char *arena;
	uint32_t lanes;             /* daemon-side copies: never re-read */
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint32_t arena_bytes;
	uint64_t ctl_off, sq_off, cq_off, lane_bytes;
};

/* Lane k's parts (proto.h, SHM LAYOUT). */
static inline struct kvp_ring_ctl *shm_lane_ctl(const struct client_shm *s,
						uint32_t k)
{
	return (struct kvp_ring_ctl *)((char *)s->base + s->ctl_off + k * s->lane_bytes);
}

static inline struct kvp_sqe *shm_lane_sqes(const struct client_shm *s, uint32_t k)
{
	return (struct kvp_sqe *)((char *)s->base + s->sq_off + k * s->lane_bytes);
}

static inline struct kvp_cqe *shm_lane_cqes(const struct client_shm *s, uint32_t k)
{
	return (struct kvp_cqe *)((char *)s->base + s->cq_off + k * s->lane_bytes);
}

/*
 * Create, size, seal (grow, shrink, seal) and map the memfd and write its
 * header: lanes ring pairs of sq_entries / cq_entries each. Entries and
 * arena size must already be validated; lanes is 1..KVP_LANES_MAX.
 */
int shm_create(struct client_shm *s, uint32_t client_id, uint32_t lanes,
	       uint32_t sq_entries, uint32_t cq_entries, uint32_t arena_bytes,
	       struct errbuf *e);
void shm_destroy(struct client_shm *s);

/* Drop the daemon's fd once the client has it; the mapping stays. */
void shm_close_fd(struct client_shm *s);

#endif /* KVPOOLD_SHM_H */
