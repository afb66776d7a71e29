/* SPDX-License-Identifier: MIT */
/*
 * ops_move.c - MOVE: a user's history from one pool (GPU) of the client's
 * tenant to another (engine_move.h; kvctl move).
 *
 * Who may: any client of the tenant, attached to any of its pools, as for
 * evict of one user: a tenant's data is in all its pools.
 *
 * Order. The move takes the shard owning the user in both pools, the lower
 * pool index first. Every other path takes one shard lock, or every shard
 * of one set in index order (shard.h), and holds no lock of another pool
 * meanwhile, so a move waits for them and they wait for it, and two moves
 * (A to B, B to A) cannot each hold what the other wants. The worker holds
 * a move back behind the user's earlier operations (ops_sqe_user), so it
 * lands between them in ring order, like any operation on the user.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "ops_internal.h"
#include "tenant.h"

int op_move(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct tenant *t = o->c->tenant;
	uint32_t np = o->s->tenants.npools, lo, hi, shard[2];
	uint64_t from = q->arg, to = q->n;
	struct engine *eng[2];
	struct shard_set *set[2];
	struct engine_move_out mo;
	int ret;

	if ((from >= np || to >= np) && np == 1)
		return errbuf_set(o->e, -EINVAL, "move: pool %" PRIu64 " does not "
				  "exist; this kvpoold serves pool 0 only (devices)",
				  from >= np ? from : to);
	if (from >= np || to >= np)
		return errbuf_set(o->e, -EINVAL, "move: pool %" PRIu64 " does not "
				  "exist; this kvpoold serves pools 0 to %" PRIu32,
				  from >= np ? from : to, np - 1);
	if (from == to)
		return errbuf_set(o->e, -EINVAL, "move: user %" PRIu64 ": from and "
				  "to are both pool %" PRIu64 "; name two pools",
				  q->user, from);
	lo = from < to ? (uint32_t)from : (uint32_t)to;
	hi = from < to ? (uint32_t)to : (uint32_t)from;
	set[0] = t->pools[lo].set;
	set[1] = t->pools[hi].set;
	for (int i = 0; i < 2; i++) {
		shard[i] = shard_of_user(set[i], q->user);
		eng[i] = shard_lock(set[i], shard[i]);
	}
	ret = from < to ? engine_history_move(eng[0], eng[1], q->user, &mo, o->e) :
			  engine_history_move(eng[1], eng[0], q->user, &mo, o->e);
	for (int i = 1; i >= 0; i--) {
		shard_unlock(set[i], shard[i]);
		shard_reclaim_hint(set[i]);
	}
	if (ret) {
		char why[KVP_ERRLEN];

		memcpy(why, o->e->msg, sizeof(why));
		return errbuf_set(o->e, ret, "move from pool %" PRIu64 " to pool %"
				  PRIu64 ": %s", from, to, why);
	}
	o->cqe->val0 = mo.len;
	o->cqe->val1 = mo.bytes;
	return (int)mo.pages;
}
