/* SPDX-License-Identifier: MIT */
/*
 * ops_move.c - MOVE: a user's history from one pool (GPU) of the client's
 * tenant to another (engine_move.h; kvctl move); CHUNK_COPY: a chunk entry
 * copied into another pool (kvctl move --chunk).
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
#include <stdio.h>
#include <string.h>

#include "ops_internal.h"
#include "tenant.h"

/* from and to: two pools this kvpoold serves, not the same one; set[0]
 * the lower's set of the client's tenant, set[1] the higher's (the lock
 * order). */
static int pool_pair(struct op *o, uint64_t from, uint64_t to, const char *what,
		     struct shard_set *set[2])
{
	uint32_t np = o->s->tenants.npools;
	struct tenant_pool *pools = o->c->tenant->pools;

	if ((from >= np || to >= np) && np == 1)
		return errbuf_set(o->e, -EINVAL, "%s: pool %" PRIu64 " does not "
				  "exist; this kvpoold serves pool 0 only (devices)",
				  what, from >= np ? from : to);
	if (from >= np || to >= np)
		return errbuf_set(o->e, -EINVAL, "%s: pool %" PRIu64 " does not "
				  "exist; this kvpoold serves pools 0 to %" PRIu32,
				  what, from >= np ? from : to, np - 1);
	if (from == to)
		return errbuf_set(o->e, -EINVAL, "%s: from and to are both pool %"
				  PRIu64 "; name two pools", what, from);
	set[0] = pools[from < to ? from : to].set;
	set[1] = pools[from < to ? to : from].set;
	return 0;
}

/* An engine's error, said with the two pools. */
static int pair_error(struct op *o, int ret, const char *what, uint64_t from,
		      uint64_t to)
{
	char why[KVP_ERRLEN];

	memcpy(why, o->e->msg, sizeof(why));
	return errbuf_set(o->e, ret, "%s from pool %" PRIu64 " to pool %" PRIu64
			  ": %s", what, from, to, why);
}

int op_move(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	uint64_t from = q->arg, to = q->n;
	struct engine_move_out mo;
	struct shard_set *set[2];
	struct engine *eng[2];
	uint32_t shard[2];
	char what[48];
	int ret;

	snprintf(what, sizeof(what), "move: user %" PRIu64, q->user);
	ret = pool_pair(o, from, to, what, set);
	if (ret)
		return ret;
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
	if (ret)
		return pair_error(o, ret, "move", from, to);
	o->cqe->val0 = mo.len;
	o->cqe->val1 = mo.bytes;
	return (int)mo.pages;
}

/*
 * CHUNK_COPY: a chunk entry (and what it hangs under) copied into another
 * pool of the tenant (share_chunk_copy.c). Chunks live in shard 0 and a
 * registration may evict from any shard, so both sets are locked whole
 * (global mode, as every sharing operation), the lower pool first: the
 * order of moves, by pool, then by shard.
 */
int op_chunk_copy(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	uint64_t from = q->arg, to = q->n;
	struct engine_chunk_copy_out co;
	struct shard_set *set[2];
	struct engine *eng[2];
	struct kvp_chunk_id id;
	int ret;

	if ((ret = op_input_id(o, &id)) ||
	    (ret = pool_pair(o, from, to, "chunk_copy", set)))
		return ret;
	for (int i = 0; i < 2; i++)
		eng[i] = shard_lock_all(set[i]);
	ret = from < to ?
	      engine_chunk_copy(eng[0], eng[1], &id, o->c->id, op_now_ns(), &co, o->e) :
	      engine_chunk_copy(eng[1], eng[0], &id, o->c->id, op_now_ns(), &co, o->e);
	for (int i = 1; i >= 0; i--) {
		shard_unlock_all(set[i]);
		shard_reclaim_hint(set[i]);
	}
	if (ret)
		return pair_error(o, ret, "chunk copy", from, to);
	o->cqe->val0 = co.entries;
	o->cqe->val1 = co.bytes;
	return (int)co.pages;
}
