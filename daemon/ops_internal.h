/* SPDX-License-Identifier: MIT */
/*
 * ops_internal.h - one operation being executed, shared by ops.c (checks,
 * dispatch, the data operations) and ops_list.c (USERS, CLIENTS).
 */
#ifndef KVPOOLD_OPS_INTERNAL_H
#define KVPOOLD_OPS_INTERNAL_H

#include "client.h"
#include "errbuf.h"
#include "ops.h"
#include "server.h"

/* Rows one USERS or CLIENTS call returns at most; the cursor pages on. */
#define OPS_LIST_MAX_ROWS 65536u

struct op {
	struct server *s;
	struct client *c;
	const struct kvp_sqe *sqe;  /* the private copy */
	unsigned char *out;         /* the checked result range */
	uint32_t out_len;
	struct kvp_cqe *cqe;
	struct op_scratch *scr;
	struct errbuf *e;
	struct op_wait *wait;       /* NULL: wait for an onload here */
	uint32_t t_lo, t_hi;        /* tenants an op spans: [t_lo, t_hi) */
	uint32_t p_lo, p_hi;        /* and pools: the client's, or with
				     * KVP_SQE_ALL every pool */
};

/* Scratch of at least bytes; NULL when memory is out. */
void *op_scratch_get(struct op_scratch *scr, size_t bytes);

/* Rows of row_bytes a list op may write: min(n, out_len / row_bytes, cap);
 * -EINVAL with a message when not even one. */
int op_list_rows(struct op *o, size_t row_bytes, const char *what);

int op_users(struct op *o);
int op_clients(struct op *o);

#endif /* KVPOOLD_OPS_INTERNAL_H */
