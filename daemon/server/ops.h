/* SPDX-License-Identifier: MIT */
/*
 * ops.h - the one validation layer for everything a client sends, and the
 * dispatch of a submission to the engine.
 *
 * ops_execute() is the only function that interprets a kvp_sqe. Both
 * transports run on the client's worker (worker.c), in one order: a ring
 * entry is copied out of the arena, a "uds" request out of the socket (the
 * listener only reads it and hands it over). Each hands over the copy, with
 * the buffer the result goes to (the client's arena for the ring, the
 * client's uds buffer) and the one inputs are read from (the client's arena
 * for the ring; none for uds).
 */
#ifndef KVPOOLD_OPS_H
#define KVPOOLD_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "tier.h"

struct server;
struct client;
struct engine;

/* Per-thread working memory for list operations; grows, never shrinks, so
 * steady-state operation allocates nothing. */
struct op_scratch {
	void *buf;
	size_t cap;
};

void op_scratch_free(struct op_scratch *scr);

/* An opcode's name ("prepare"), NULL for one that is not defined. */
const char *ops_name(uint32_t opcode);

/* What a finished operation's completion waits for before it is published:
 * an onload into the pages it returns (engine_fence_done(eng, fence)). */
struct op_wait {
	struct engine *eng;
	uint64_t fence;         /* 0: publish at once */
	/* In: the caller can hold the entry back and run it again (a prepare
	 * that waits for the reclaimer). Out: it did; nothing was done, no
	 * completion: run the same entry again later. */
	bool may_retry;
	bool retried;           /* in: this entry was held back before */
	bool retry;
	enum engine_wait why;   /* out, with retry: what it waits for (tier.h) */
};

/*
 * Execute one submission for client c and fill *cqe. sqe is a private copy.
 * Results (or the error message) go to [sqe->out_off, +out_len) of
 * out_base[0, out_cap), after an overflow-safe bounds check. Inputs
 * (proto.h, INPUTS) are [sqe->in_off, +in_len) of in_base[0, in_cap),
 * bounds-checked the same way and copied out once before use; in_base NULL
 * refuses every operation that takes input. Never fails: anything wrong
 * becomes cqe->res = -errno.
 *
 * A prepare whose pages are still being onloaded has taken effect in the
 * engine (later operations on the user see it) but its completion may not
 * be published yet. With wait != NULL (worker.c parks it, ring and uds
 * alike) the fence is returned there and *cqe is published once it lands;
 * with NULL (a caller with nowhere to park; kvpoold has none today)
 * ops_execute waits for the fence itself, without the tenant's mutex,
 * before it returns.
 */
void ops_execute(struct server *s, struct client *c, const struct kvp_sqe *sqe,
		 const unsigned char *in_base, uint32_t in_cap,
		 unsigned char *out_base, uint32_t out_cap,
		 struct op_scratch *scr, struct kvp_cqe *cqe,
		 struct op_wait *wait);

/*
 * The user a submission acts on, for ordering: info, prepare, and offload,
 * evict or move of one user name sqe->user; commit and release name the user of
 * the lease in sqe->arg (looked up under the tenant's mutex). Returns false
 * for anything else (operations on every user or none, a lease that is not
 * held, a client without a tenant, an invalid opcode): those are not held
 * back, and the engine orders them by itself.
 */
bool ops_sqe_user(struct server *s, struct client *c, const struct kvp_sqe *sqe,
		  uint64_t *user);

#endif /* KVPOOLD_OPS_H */
