/* SPDX-License-Identifier: MIT */
/*
 * calls.c - the synchronous calls: each is one operation queued, submitted
 * and reaped through the same path as a batch (batch.c), with its results in
 * the arena's sync range (client_internal.h, THE ARENA SPLIT) so that they
 * can be larger than an async slot's slice. A synchronous call refuses to run
 * while asynchronous operations are queued or unreaped (-EBUSY): their
 * completions would come back in between.
 *
 * On failure the daemon's message (from the CQE's result range) becomes the
 * client's last error, and the CQE's failure detail (proto.h) its
 * kvp_last_error_info().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "client_internal.h"

/* One operation to completion (client_internal.h). */
int kvpc_call(struct kvp_client *c, struct kvp_sqe *sqe,
	      struct kvp_cqe *cqe, uint32_t *idx)
{
	int ret;

	ret = kvpc_check_dead(c);
	if (ret)
		return ret;
	if (c->inflight)
		return kvpc_err(c, -EBUSY,
				"%" PRIu32 " asynchronous operations in flight (queued or "
				"unreaped); reap them before a synchronous call",
				c->inflight);
	ret = kvpc_queue(c, sqe, 0, 1);
	if (ret < 0)
		return ret;
	*idx = (uint32_t)ret;
	kvpc_ring_submit(c);
	c->queued = 0;

	ret = kvpc_cq_wait(c, 1);
	if (ret < 0)
		return ret;
	kvpc_cq_take(c, cqe);
	/* Ours is the only slot taken, so a good tag can only name it. */
	ret = kvpc_slot_of(c, cqe);
	if (ret < 0)
		return ret;
	kvpc_slot_put(c, *idx);
	kvpc_cq_release(c);
	if (cqe->res < 0) {
		ret = kvpc_err(c, cqe->res, "%s", kvpc_cqe_message(c, *idx, cqe));
		kvpc_cqe_error_info(cqe, &c->errinfo);
		return ret;
	}
	c->err[0] = '\0';
	return cqe->res;
}

/* An operation whose result is just res. */
static int call_res(struct kvp_client *c, struct kvp_sqe *sqe)
{
	struct kvp_cqe cqe;
	uint32_t idx = 0; /* set by kvpc_call() on success */

	return kvpc_call(c, sqe, &cqe, &idx);
}

/* An operation whose result is one fixed-size struct. */
static int call_fixed(struct kvp_client *c, struct kvp_sqe *sqe, void *out,
		      size_t size, const char *what)
{
	char msg[KVP_ERRLEN];
	struct kvp_cqe cqe;
	uint32_t idx = 0; /* set by kvpc_call() on success */
	int ret;

	if (!out)
		return kvpc_err(c, -EINVAL, "%s: the result pointer is NULL", what);
	ret = kvpc_call(c, sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	if (kvpc_decode_fixed(c, idx, &cqe, out, size, what, msg, sizeof(msg)))
		return kvpc_err(c, -EPROTO, "%s", msg);
	return 0;
}

KVP_PUBLIC
int kvp_info_sz(struct kvp_client *c, uint64_t user, struct kvp_user_info *out,
		size_t size)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_INFO, .user = user };
	struct kvp_user_info u;
	int ret = kvpc_row_size(c, size, KVP_USER_INFO_SIZE_VER0, "kvp_info");

	if (!ret && !out)
		ret = kvpc_err(c, -EINVAL, "user info: the result pointer is NULL");
	if (!ret)
		ret = call_fixed(c, &sqe, &u, sizeof(u), "user info");
	if (!ret)
		kvpc_rows_put(out, size, &u, sizeof(u), 1);
	return ret;
}

KVP_PUBLIC
int kvp_prepare(struct kvp_client *c, uint64_t user, uint64_t start_pos,
		uint32_t n_new, struct kvp_lease *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_PREPARE, .user = user,
			       .arg = start_pos, .n = n_new };
	char msg[KVP_ERRLEN];
	struct kvp_cqe cqe;
	uint32_t idx = 0; /* set by kvpc_call() on success */
	int ret;

	if (!out)
		return kvpc_err(c, -EINVAL, "kvp_prepare: the lease pointer is NULL");
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	if (kvpc_decode_lease(c, idx, &cqe, out, msg, sizeof(msg)))
		return kvpc_err(c, -EPROTO, "%s", msg);
	return kvpc_lease_add(c, out, KVPC_LEASE_HISTORY, 0);
}

/* A tensor-parallel rank > 0 joins rank 0's lease (kvpool.h, "Group
 * leases"): decoded and recorded as a prepare's, or as a registration's
 * fill lease for a chunk's (a sharing lease id: kvp_chunk_seal seals it). */
KVP_PUBLIC
int kvp_lease_join(struct kvp_client *c, uint64_t lease, struct kvp_lease *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_LEASE_JOIN, .arg = lease };
	char msg[KVP_ERRLEN];
	struct kvp_cqe cqe;
	uint32_t idx = 0; /* set by kvpc_call() on success */
	uint32_t len;
	int ret;

	if (!out)
		return kvpc_err(c, -EINVAL, "kvp_lease_join: the lease pointer is NULL");
	ret = kvpc_call(c, &sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	if (kvpc_decode_lease_at(c, kvpc_slot_out(c, idx, &len), cqe.out_bytes,
				 UINT32_MAX, cqe.val1, out, msg, sizeof(msg)))
		return kvpc_err(c, -EPROTO, "%s", msg);
	if (out->id != lease)
		return kvpc_err(c, -EPROTO, "kvpoold at %s answered the join of lease "
				"%#" PRIx64 " with lease %#" PRIx64, c->path, lease,
				out->id);
	return kvpc_lease_add(c, out, (lease & KVP_LEASE_SHARED) ?
			      KVPC_LEASE_CHUNK_FILL : KVPC_LEASE_HISTORY, 0);
}

/*
 * Commit and release first wait for the lease's appends still in flight on
 * the GPU (cuda.c, COMMIT ORDERING): a commit must not make tokens visible,
 * nor a release hand pages back, before their bytes landed.
 *
 * A commit goes only through a lease this client holds open (lease.c): a
 * released, committed or foreign one is -ESTALE here, before the daemon is
 * asked. Once the daemon has committed, the lease takes no more writes.
 */
KVP_PUBLIC
int kvp_commit(struct kvp_client *c, uint64_t lease, uint32_t n)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_COMMIT, .arg = lease, .n = n };
	struct kvpc_lease *r = NULL;
	int ret;

	if ((ret = kvpc_check_dead(c)) ||
	    (ret = kvpc_lease_open(c, lease, "commit", &r)) ||
	    (ret = kvpc_cuda_wait_lease(c, lease)))
		return ret;
	ret = call_res(c, &sqe);
	if (ret >= 0) {
		r->state = KVPC_LEASE_CLOSED;
		r->committed = n;
	}
	return ret;
}

/*
 * A release is sent for any id (the daemon checks that it is this client's);
 * the lease's record and page table are dropped once the daemon answered.
 */
KVP_PUBLIC
int kvp_release(struct kvp_client *c, uint64_t lease)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_RELEASE, .arg = lease };
	int ret;

	if ((ret = kvpc_check_dead(c)) || (ret = kvpc_cuda_wait_lease(c, lease)))
		return ret;
	ret = call_res(c, &sqe);
	if (kvpc_lease_ended(ret))
		kvpc_lease_drop(c, lease);
	return ret;
}

KVP_PUBLIC
int kvp_offload(struct kvp_client *c, uint64_t user)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_OFFLOAD, .user = user };

	return call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_offload_all(struct kvp_client *c)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_OFFLOAD, .flags = KVP_SQE_ALL };

	return call_res(c, &sqe);
}

static int check_sel(struct kvp_client *c, uint32_t sel)
{
	if (!sel || (sel & ~(uint32_t)KVP_SEL_VALID))
		return kvpc_err(c, -EINVAL,
				"evict: tiers 0x%" PRIx32 " are not a set of KVP_SEL_DEVICE "
				"(0x%x) and KVP_SEL_HOST (0x%x), or KVP_SEL_DISK (0x%x) "
				"or KVP_SEL_TO_DISK (0x%x)", sel, KVP_SEL_DEVICE,
				KVP_SEL_HOST, KVP_SEL_DISK, KVP_SEL_TO_DISK);
	return 0;
}

KVP_PUBLIC
int kvp_evict(struct kvp_client *c, uint64_t user, uint32_t sel)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_EVICT, .user = user,
			       .sel = (uint16_t)sel };
	int ret = check_sel(c, sel);

	return ret ? ret : call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_move(struct kvp_client *c, uint64_t user, uint32_t from, uint32_t to)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_MOVE, .user = user, .arg = from,
			       .n = to };

	return call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_evict_all(struct kvp_client *c, uint32_t sel)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_EVICT, .flags = KVP_SQE_ALL,
			       .sel = (uint16_t)sel };
	int ret = check_sel(c, sel);

	return ret ? ret : call_res(c, &sqe);
}

/* The caller's tenant only: no admin needed (kvpool.h). */
KVP_PUBLIC
int kvp_evict_tenant(struct kvp_client *c, uint32_t sel)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_EVICT_TENANT, .sel = (uint16_t)sel };
	int ret = check_sel(c, sel);

	return ret ? ret : call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_reload(struct kvp_client *c)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_RELOAD };

	return call_res(c, &sqe);
}

KVP_PUBLIC
int kvp_server_info(struct kvp_client *c, struct kvp_server_info *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_SERVER_INFO };

	return call_fixed(c, &sqe, out, sizeof(*out), "server info");
}

KVP_PUBLIC
int kvp_latency(struct kvp_client *c, struct kvp_latency *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_LATENCY };

	return call_fixed(c, &sqe, out, sizeof(*out), "latency");
}

_Static_assert(sizeof(struct kvp_ring_phases) == KVP_RING_PHASES_SIZE_VER0,
	       "kvp_ring_phases, version 0");

KVP_PUBLIC
int kvp_ring_phases_sz(struct kvp_client *c, struct kvp_ring_phases *out,
		       size_t size)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_RING_PHASES };
	struct kvp_ring_phases p;
	int ret = kvpc_row_size(c, size, KVP_RING_PHASES_SIZE_VER0, "kvp_ring_phases");

	if (!ret && !out)
		ret = kvpc_err(c, -EINVAL, "kvp_ring_phases: the result pointer is NULL");
	if (!ret)
		ret = call_fixed(c, &sqe, &p, sizeof(p), "ring phases");
	if (!ret)
		kvpc_rows_put(out, size, &p, sizeof(p), 1);
	return ret;
}

/*
 * A struct that grows into reserved words (kvp_stats): a daemon may send
 * fewer bytes (it knows fewer fields; the rest read 0) or more (later
 * fields this library does not know), down to the oldest size it sent.
 */
static int call_growing(struct kvp_client *c, struct kvp_sqe *sqe, void *out,
			size_t size, size_t min, const char *what)
{
	struct kvp_cqe cqe;
	uint32_t idx = 0, len;
	const unsigned char *src;
	int ret;

	if (!out)
		return kvpc_err(c, -EINVAL, "%s: the result pointer is NULL", what);
	ret = kvpc_call(c, sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	src = kvpc_slot_out(c, idx, &len);
	if (cqe.out_bytes < min)
		return kvpc_err(c, -EPROTO, "kvpoold at %s sent %" PRIu32 " bytes of %s, "
				"expected at least %zu", c->path, cqe.out_bytes, what, min);
	memset(out, 0, size);
	memcpy(out, src, cqe.out_bytes < size ? cqe.out_bytes : size);
	return 0;
}

KVP_PUBLIC
int kvp_stats(struct kvp_client *c, int all_tenants, struct kvp_stats *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_STATS,
			       .flags = all_tenants ? KVP_SQE_ALL : 0 };

	/* Protocol 7's kvp_stats, before the reserved words: 40 fields. */
	return call_growing(c, &sqe, out, sizeof(*out),
			    offsetof(struct kvp_stats, shards) + sizeof(uint64_t), "stats");
}

/* STATS with arg = pool + 1: that pool alone (0: the client's, or every
 * pool with ALL). An older kvpoold ignored arg and would answer the sum:
 * asked only of one that says it knows (KVP_SERVER_POOL_DEVICES). */
KVP_PUBLIC
int kvp_stats_pool(struct kvp_client *c, int all_tenants, uint32_t pool,
		   struct kvp_stats *out)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_STATS,
			       .flags = all_tenants ? KVP_SQE_ALL : 0,
			       .arg = (uint64_t)pool + 1 };
	struct kvp_server_info si;
	int ret = kvp_server_info(c, &si);

	if (ret < 0)
		return ret;
	if (!(si.flags & KVP_SERVER_POOL_DEVICES))
		return kvpc_err(c, -EOPNOTSUPP, "stats of pool %" PRIu32 ": kvpoold at "
				"%s is older than per-pool stats; use kvp_stats",
				pool, c->path);
	return call_growing(c, &sqe, out, sizeof(*out),
			    offsetof(struct kvp_stats, shards) + sizeof(uint64_t), "stats");
}

/* USERS and CLIENTS: rows of size bytes (the wire's) from cursor, written
 * at the caller's stride; res = rows written, cqe.val0 = the next cursor. */
static int call_list(struct kvp_client *c, struct kvp_sqe *sqe, void *rows,
		     size_t size, size_t stride, uint32_t max, uint64_t *next,
		     const char *what)
{
	struct kvp_cqe cqe;
	uint32_t idx = 0, len, fit; /* idx: set by kvpc_call when it succeeds */
	const unsigned char *src;
	int ret;

	if (!rows || !max)
		return kvpc_err(c, -EINVAL, "%s: need room for at least one row", what);
	/* At most what the sync range holds; the cursor pages on. */
	fit = (uint32_t)(c->sync_bytes / size);
	sqe->n = max < fit ? max : fit;
	ret = kvpc_call(c, sqe, &cqe, &idx);
	if (ret < 0)
		return ret;
	if ((uint32_t)ret > sqe->n || (uint64_t)ret * size > cqe.out_bytes)
		return kvpc_err(c, -EPROTO,
				"kvpoold at %s listed %d %s in %" PRIu32 " bytes (asked "
				"for at most %" PRIu32 ")", c->path, ret, what,
				cqe.out_bytes, sqe->n);
	src = kvpc_slot_out(c, idx, &len);
	kvpc_rows_put(rows, stride, src, size, (uint32_t)ret);
	if (next)
		*next = cqe.val0;
	return ret;
}

KVP_PUBLIC
int kvp_users_sz(struct kvp_client *c, uint64_t cursor,
		 struct kvp_user_info *rows, size_t size, uint32_t max,
		 uint64_t *next)
{
	/* Admins see every tenant's users (tenant 0 = all). */
	struct kvp_sqe sqe = { .opcode = KVP_OP_USERS, .arg = cursor,
			       .flags = (c->flags & KVP_WELCOME_ADMIN) ? KVP_SQE_ALL : 0 };
	int ret = kvpc_row_size(c, size, KVP_USER_INFO_SIZE_VER0, "kvp_users");

	return ret ? ret : call_list(c, &sqe, rows, sizeof(*rows), size, max,
				     next, "users");
}

KVP_PUBLIC
int kvp_clients_sz(struct kvp_client *c, uint64_t cursor,
		   struct kvp_client_info *rows, size_t size, uint32_t max,
		   uint64_t *next)
{
	struct kvp_sqe sqe = { .opcode = KVP_OP_CLIENTS, .arg = cursor };
	int ret = kvpc_row_size(c, size, KVP_CLIENT_INFO_SIZE_VER0, "kvp_clients");

	return ret ? ret : call_list(c, &sqe, rows, sizeof(*rows), size, max,
				     next, "clients");
}
