/* SPDX-License-Identifier: MIT */
/*
 * ops.h - the one validation layer for everything a client sends, and the
 * dispatch of a submission to the engine.
 *
 * ops_execute() is the only function that interprets a kvp_sqe. The ring
 * path (worker.c) and the "uds" path (listener.c) both copy the entry out of
 * untrusted memory first and hand over the copy, with the buffer the result
 * goes to: the client's arena for the ring, a local buffer for uds.
 */
#ifndef KVPOOLD_OPS_H
#define KVPOOLD_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

struct server;
struct client;

/* Per-thread working memory for list operations; grows, never shrinks, so
 * steady-state operation allocates nothing. */
struct op_scratch {
	void *buf;
	size_t cap;
};

void op_scratch_free(struct op_scratch *scr);

/*
 * Execute one submission for client c and fill *cqe. sqe is a private copy.
 * Results (or the error message) go to [sqe->out_off, +out_len) of
 * out_base[0, out_cap), after an overflow-safe bounds check. Never fails:
 * anything wrong becomes cqe->res = -errno.
 */
void ops_execute(struct server *s, struct client *c, const struct kvp_sqe *sqe,
		 unsigned char *out_base, uint32_t out_cap,
		 struct op_scratch *scr, struct kvp_cqe *cqe);

#endif /* KVPOOLD_OPS_H */
