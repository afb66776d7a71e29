/* SPDX-License-Identifier: MIT */
/* Past ~800 lines on purpose: the one validation layer, all opcodes' checks. */
/*
 * ops.c - the one validation layer for submissions, and the operations.
 *
 * Everything here works on a private copy of the SQE. The order of checks
 * matters: the result range first (so later errors have somewhere to put
 * their message), then opcode, flags, reserved fields, rights, and only then
 * the operation, which runs under its tenant's mutex. A failed operation
 * changes nothing (the engine guarantees it; the checks here run before it
 * is called) and reports -errno plus the message in the result range.
 *
 * A prepare that onloads returns before the copy has landed (engine.h); its
 * completion then carries the fence out through struct op_wait and the
 * worker publishes it later (worker.c). That (and a SEQ_CREATE whose user
 * source is onloaded) is the only operation whose completion can be late;
 * everything else completes when it returns.
 *
 * The sharing operations live in ops_share.c; their descriptors are here,
 * so every opcode passes the same checks before its function runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "metrics.h"
#include "ops_internal.h"
#include "redis_cluster.h"
#include "reload.h"
#include "remote_tier.h"

#define PREPARE_MAX_NEW (1u << 20)

enum { NEED_TENANT = 1, NEED_ADMIN = 2, TAKES_INPUT = 4 };

struct op_desc {
	const char *name;
	int (*fn)(struct op *o);
	uint8_t flags;          /* KVP_SQE_* valid for the opcode */
	uint8_t need;           /* without KVP_SQE_ALL; TAKES_INPUT: in_off/in_len */
	const char *admin_what; /* what needs an admin, for the message */
};

#define SHARE (NEED_TENANT | TAKES_INPUT)

static int op_nop(struct op *o);
static int op_info(struct op *o);
static int op_prepare(struct op *o);
static int op_commit(struct op *o);
static int op_release(struct op *o);
static int op_lease_join(struct op *o);
static int op_offload(struct op *o);
static int op_evict(struct op *o);
static int op_evict_tenant(struct op *o);
static int op_stats(struct op *o);
static int op_reload(struct op *o);
static int op_latency(struct op *o);
static int op_server_info(struct op *o);
static int op_batch_refuse(struct op *o);
static int op_ring_phases(struct op *o);

static const struct op_desc descs[KVP_OP_MAX] = {
	[KVP_OP_NOP] = { "nop", op_nop, 0, 0, NULL },
	[KVP_OP_INFO] = { "info", op_info, 0, NEED_TENANT, NULL },
	[KVP_OP_PREPARE] = { "prepare", op_prepare, 0, NEED_TENANT, NULL },
	[KVP_OP_COMMIT] = { "commit", op_commit, KVP_SQE_RELEASE, NEED_TENANT, NULL },
	[KVP_OP_RELEASE] = { "release", op_release, 0, NEED_TENANT, NULL },
	[KVP_OP_OFFLOAD] = { "offload", op_offload, KVP_SQE_ALL, NEED_TENANT, "offload --all" },
	[KVP_OP_EVICT] = { "evict", op_evict, KVP_SQE_ALL, NEED_TENANT,
			   "evicting every tenant's users (evict --all; a tenant's "
			   "own users need no admin: kvp_evict_tenant)" },
	[KVP_OP_STATS] = { "stats", op_stats, KVP_SQE_ALL, NEED_TENANT, "stats of all tenants" },
	[KVP_OP_USERS] = { "users", op_users, KVP_SQE_ALL, NEED_TENANT, "users of all tenants" },
	[KVP_OP_CLIENTS] = { "clients", op_clients, KVP_SQE_ALL, NEED_ADMIN, "listing clients" },
	[KVP_OP_PREFIX_LOOKUP] = { "prefix_lookup", op_prefix_lookup, 0, SHARE, NULL },
	[KVP_OP_SEQ_ALLOC] = { "seq_alloc", op_seq_alloc, 0, SHARE, NULL },
	[KVP_OP_SEQ_CREATE] = { "seq_create", op_seq_create, 0, SHARE, NULL },
	[KVP_OP_SEQ_EXTEND] = { "seq_extend", op_seq_extend, 0, SHARE, NULL },
	[KVP_OP_SEQ_FREE] = { "seq_free", op_seq_free, 0, NEED_TENANT, NULL },
	[KVP_OP_CHUNK_REGISTER] = { "chunk_register", op_chunk_register, 0, SHARE, NULL },
	[KVP_OP_CHUNK_SEAL] = { "chunk_seal", op_chunk_seal, 0, NEED_TENANT, NULL },
	[KVP_OP_CHUNK_ACQUIRE] = { "chunk_acquire", op_chunk_acquire, 0, SHARE, NULL },
	[KVP_OP_CHUNK_GET] = { "chunk_get", op_chunk_get, 0, SHARE, NULL },
	[KVP_OP_CHUNK_LIST] = { "chunk_list", op_chunk_list, 0, SHARE, NULL },
	[KVP_OP_CHUNK_DELETE] = { "chunk_delete", op_chunk_delete, 0, SHARE, NULL },
	[KVP_OP_CHUNK_CLEAR] = { "chunk_clear", op_chunk_clear, 0, NEED_TENANT, NULL },
	[KVP_OP_CHUNK_EVICT_UNUSED] = { "chunk_evict_unused", op_chunk_evict_unused,
					0, NEED_TENANT, NULL },
	[KVP_OP_COMPOSE] = { "compose", op_compose, KVP_SQE_PREVIEW, SHARE, NULL },
	[KVP_OP_EVICT_TENANT] = { "evict_tenant", op_evict_tenant, 0, NEED_TENANT, NULL },
	[KVP_OP_CHUNK_LINK] = { "chunk_link", op_chunk_link, 0, SHARE, NULL },
	[KVP_OP_CHUNK_ENTRY] = { "chunk_entry", op_chunk_entry, 0, SHARE, NULL },
	[KVP_OP_CHUNK_ENTRIES] = { "chunk_entries", op_chunk_entries, 0, SHARE, NULL },
	[KVP_OP_CHUNK_CONTENT] = { "chunk_content", op_chunk_content, 0, SHARE, NULL },
	[KVP_OP_CHUNK_TOKENS] = { "chunk_tokens", op_chunk_tokens, 0, SHARE, NULL },
	[KVP_OP_CHUNK_LIMITS] = { "chunk_limits", op_chunk_limits, 0, SHARE, NULL },
	[KVP_OP_RELOAD] = { "reload", op_reload, 0, NEED_ADMIN, "reloading the settings" },
	[KVP_OP_LATENCY] = { "latency", op_latency, 0, NEED_ADMIN, "the daemon's latencies" },
	[KVP_OP_SERVER_INFO] = { "server_info", op_server_info, 0, 0, NULL },
	[KVP_OP_SEQ_INFO] = { "seq_info", op_seq_info, 0, NEED_TENANT, NULL },
	[KVP_OP_SEQ_TOKENS] = { "seq_tokens", op_seq_tokens, 0, NEED_TENANT, NULL },
	[KVP_OP_LEASE_JOIN] = { "lease_join", op_lease_join, 0, NEED_TENANT, NULL },
	[KVP_OP_MOVE] = { "move", op_move, 0, NEED_TENANT, NULL },
	[KVP_OP_CHUNK_COPY] = { "chunk_copy", op_chunk_copy, 0, SHARE, NULL },
	/* Run by the worker through ops_batch_*() (ops_batch.c); here only
	 * what reaches ops_execute: the uds mode, which has no arena. */
	[KVP_OP_BATCH] = { "batch", op_batch_refuse, 0, NEED_TENANT | TAKES_INPUT, NULL },
	[KVP_OP_RING_PHASES] = { "ring_phases", op_ring_phases, 0, NEED_ADMIN,
				 "the daemon's ring phases" },
};

_Static_assert(KVP_COMMIT_PENDING == ENGINE_COMMIT_PENDING,
	       "a pending group commit's res is the engine's");

/* ------------------------------------------------------------ helpers */

const char *ops_name(uint32_t opcode)
{
	return opcode < KVP_OP_MAX && descs[opcode].name ? descs[opcode].name : NULL;
}

void *op_scratch_get(struct op_scratch *scr, size_t bytes)
{
	void *p;

	if (bytes <= scr->cap)
		return scr->buf;
	p = realloc(scr->buf, bytes);
	if (!p)
		return NULL;
	scr->buf = p;
	scr->cap = bytes;
	return p;
}

void op_scratch_free(struct op_scratch *scr)
{
	free(scr->buf);
	*scr = (struct op_scratch){ 0 };
}

int op_list_rows(struct op *o, size_t row_bytes, const char *what)
{
	uint32_t n = o->sqe->n;

	if (!n || o->out_len < row_bytes)
		return errbuf_set(o->e, -EINVAL, "%s: give n >= 1 rows and out_len >= "
				  "%zu bytes (one row); out_len is %" PRIu32, what,
				  row_bytes, o->out_len);
	if (n > o->out_len / row_bytes)
		n = (uint32_t)(o->out_len / row_bytes);
	return (int)(n < OPS_LIST_MAX_ROWS ? n : OPS_LIST_MAX_ROWS);
}

static void out_put(struct op *o, const void *p, size_t n)
{
	memcpy(o->out, p, n);
	o->cqe->out_bytes = (uint32_t)n;
}

struct shard_set *op_set(struct op *o)
{
	return o->c->tenant->pools[o->c->pool].set;
}

/*
 * Shard i's lock for o. A batch's items (ops_batch.c) hand in o->hold: the
 * shard whose lock the item before left held, kept when this item wants
 * the same one, let go otherwise; op_unlock_own() then leaves it held for
 * the next item, and the batch lets go at its end.
 */
static struct engine *lock_shard(struct op *o, uint32_t i)
{
	struct shard_set *set = op_set(o);

	o->locked = (int32_t)i;
	if (o->hold) {
		if (*o->hold == (int32_t)i)
			return set->v[i].eng;
		if (*o->hold >= 0) {
			shard_unlock(set, (uint32_t)*o->hold);
			shard_reclaim_hint(set);
		}
		*o->hold = (int32_t)i;
	}
	return shard_lock(set, i);
}

struct engine *op_lock_user(struct op *o, uint64_t user)
{
	return lock_shard(o, shard_of_user(op_set(o), user));
}

struct engine *op_lock_lease(struct op *o, uint64_t lease)
{
	return lock_shard(o, shard_of_lease(op_set(o), lease));
}

/* Let go of a batch's held shard (every-shard locks come next). */
static void drop_hold(struct op *o)
{
	if (o->hold && *o->hold >= 0) {
		shard_unlock(op_set(o), (uint32_t)*o->hold);
		*o->hold = -1;
	}
}

struct engine *op_lock_own(struct op *o)
{
	drop_hold(o);
	o->locked = OP_LOCKED_ALL;
	return shard_lock_all(op_set(o));
}

struct engine *op_lock_escalate(struct op *o)
{
	struct shard_set *set = op_set(o);
	uint32_t i = (uint32_t)o->locked;

	if (o->hold && *o->hold == o->locked)
		*o->hold = -1; /* unlocked right here */
	shard_unlock(set, i);
	shard_lock_all(set);
	o->locked = OP_LOCKED_ALL;
	return set->v[i].eng;
}

void op_unlock_own(struct op *o)
{
	struct shard_set *set = op_set(o);

	if (o->hold && o->locked >= 0 && o->locked == *o->hold) {
		o->locked = OP_UNLOCKED; /* the next item may want it */
		return;
	}
	if (o->locked == OP_LOCKED_ALL)
		shard_unlock_all(set);
	else if (o->locked >= 0)
		shard_unlock(set, (uint32_t)o->locked);
	o->locked = OP_UNLOCKED;
	shard_reclaim_hint(set);
}

int op_for_each_pool(struct op *o, const char *what, bool name_pool,
		     op_pool_fn fn, void *arg)
{
	for (uint32_t i = o->t_lo; i < o->t_hi; i++) {
		struct tenant *t = &o->s->tenants.v[i];

		for (uint32_t p = o->p_lo; p < o->p_hi; p++) {
			struct tenant_pool *tp = &t->pools[p];
			char why[KVP_ERRLEN], where[64] = "";
			int ret = fn(o, t, p, tp, arg);

			if (ret >= 0)
				continue;
			memcpy(why, o->e->msg, sizeof(why));
			if (name_pool && o->s->tenants.npools > 1)
				snprintf(where, sizeof(where), ", pool %" PRIu32, p);
			return errbuf_set(o->e, ret, "%s%stenant %s%s: %s",
					  what ? what : "", what ? ": " : "",
					  t->name, where, why);
		}
	}
	return 0;
}

/* ------------------------------------------------------------ validation */

static int check_admin(struct op *o, const struct op_desc *d)
{
	const struct kvp_sqe *q = o->sqe;
	uint32_t n = o->s->tenants.n;

	if (!o->c->admin)
		return errbuf_set(o->e, -EPERM, "%s needs an admin uid (admin_uids in "
				  "kvpool.conf); uid %" PRIu32 " is not one",
				  d->admin_what, o->c->uid);
	if (q->tenant > n)
		return errbuf_set(o->e, -EINVAL, "%s: tenant %" PRIu32 " does not "
				  "exist; use 0 for every tenant or 1 to %" PRIu32,
				  d->name, q->tenant, n);
	o->t_lo = q->tenant ? q->tenant - 1 : 0;
	o->t_hi = q->tenant ? q->tenant : n;
	o->p_lo = 0;
	o->p_hi = o->s->tenants.npools;
	return 0;
}

static int op_validate(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	const struct op_desc *d;
	bool all;

	if (q->opcode >= KVP_OP_MAX)
		return errbuf_set(o->e, -EINVAL, "opcode %u is unknown (this kvpoold "
				  "knows 0 to %u); is libkvpool newer than kvpoold?",
				  q->opcode, KVP_OP_MAX - 1);
	d = &descs[q->opcode];
	o->name = d->name;
	if (q->flags & ~d->flags)
		return errbuf_set(o->e, -EINVAL, "%s: flags %#x are not valid for it "
				  "(valid: %#x)", d->name, q->flags, d->flags);
	if (q->rsv0 || q->rsv1)
		return errbuf_set(o->e, -EINVAL, "%s: reserved fields must be zero",
				  d->name);
	if ((q->in_off || q->in_len) && !(d->need & TAKES_INPUT))
		return errbuf_set(o->e, -EINVAL, "%s takes no input; in_off and "
				  "in_len must be zero", d->name);
	if (q->sel && q->opcode != KVP_OP_EVICT && q->opcode != KVP_OP_EVICT_TENANT)
		return errbuf_set(o->e, -EINVAL, "%s: sel is only for EVICT and "
				  "EVICT_TENANT", d->name);
	all = q->flags & KVP_SQE_ALL;
	if (q->tenant && !all)
		return errbuf_set(o->e, -EINVAL, "%s: tenant is only for admin "
				  "operations with KVP_SQE_ALL", d->name);
	/* An admin with no tenant of its own (kvctl run by root) asking for
	 * stats or users means the whole daemon: there is nothing else to mean. */
	if (!all && !o->c->tenant && o->c->admin &&
	    (q->opcode == KVP_OP_STATS || q->opcode == KVP_OP_USERS))
		all = true;
	if (all || (d->need & NEED_ADMIN))
		return check_admin(o, d);
	if ((d->need & NEED_TENANT) && !o->c->tenant &&
	    q->opcode >= KVP_OP_PREFIX_LOOKUP && q->opcode != KVP_OP_EVICT_TENANT &&
	    q->opcode != KVP_OP_MOVE)
		return errbuf_set(o->e, -EPERM, "%s: client %" PRIu32 " (uid %" PRIu32
				  ") has no tenant; chunks, sequences and the prefix "
				  "cache belong to a tenant (run as a tenant's uid, or "
				  "add this uid to a [tenant] section)", d->name,
				  o->c->id, o->c->uid);
	if ((d->need & NEED_TENANT) && !o->c->tenant)
		return errbuf_set(o->e, -EPERM, "%s: client %" PRIu32 " (uid %" PRIu32
				  ") has no tenant; data operations need one (add the "
				  "uid to a [tenant] section)", d->name, o->c->id,
				  o->c->uid);
	if (o->c->tenant) {
		o->t_lo = o->c->tenant->index;
		o->t_hi = o->t_lo + 1;
		o->p_lo = o->c->pool;
		o->p_hi = o->p_lo + 1;
	}
	return 0;
}

/* ------------------------------------------------------------ histories */

static int op_nop(struct op *o)
{
	return 0;
}

static int op_info(struct op *o)
{
	struct engine_user_info in;
	struct kvp_user_info u;

	engine_info(op_lock_user(o, o->sqe->user), o->sqe->user, &in);
	op_unlock_own(o);
	o->cqe->val0 = in.start;
	o->cqe->val1 = in.len;
	if (o->out_len >= sizeof(u)) {
		u = (struct kvp_user_info){
			.user = o->sqe->user, .start = in.start, .len = in.len,
			.pages_device = in.pages_device, .pages_host = in.pages_host,
			.leases = in.leases, .tenant = o->c->tenant->index,
			.pages_disk = in.pages_disk, .tokens_disk = in.tokens_disk,
		};
		out_put(o, &u, sizeof(u));
	}
	return 0;
}

/* The room a prepare result needs, checked before anything changes. */
static int prepare_room(struct op *o, struct engine *eng)
{
	const struct kvp_sqe *q = o->sqe;
	const size_t hdr = sizeof(struct kvp_prepare_out);
	uint64_t pages = engine_prepare_pages(eng, q->user, q->n), need;

	if (o->out_len >= hdr && pages <= (o->out_len - hdr) / sizeof(int32_t))
		return 0;
	if (__builtin_mul_overflow(pages, sizeof(int32_t), &need) ||
	    __builtin_add_overflow(need, hdr, &need))
		need = UINT64_MAX;
	return errbuf_set(o->e, -EMSGSIZE, "user %" PRIu64 ": the result of a "
			  "prepare of %" PRIu32 " tokens needs %" PRIu64 " bytes "
			  "(%zu + 4 per page for %" PRIu64 " pages) but out_len is %"
			  PRIu32 "; raise out_len (and arena_bytes)", q->user, q->n,
			  need, hdr, pages, o->out_len);
}

/* A prepare's (or join's) answer: kvp_prepare_out, then the page table
 * (bytes in all, checked against out_len). */
static void lease_out(struct op *o, const struct engine_lease *l, size_t bytes)
{
	struct kvp_prepare_out po = {
		.lease = l->id, .start = l->start, .len = l->len, .n_new = l->n_new,
		.npages = l->npages, .last_page_len = l->last_page_len,
		.onloaded_pages = l->onloaded_pages,
	};

	memcpy(o->out, &po, sizeof(po));
	/* The engine's page table is valid until its next call: copy it now.
	 * An empty one may be NULL (no view grown yet): nothing to copy. */
	if (l->npages)
		memcpy(o->out + sizeof(po), l->frames,
		       (size_t)l->npages * sizeof(int32_t));
	o->cqe->out_bytes = (uint32_t)bytes;
	o->cqe->val0 = l->id;
	o->cqe->val1 = l->npages;
}

/*
 * A ring prepare may wait for the reclaimer (its worker holds the entry
 * back, worker.c) until RECLAIM_WAIT_NS after its first try; then, or for a
 * uds request, it makes the room itself. The first try counts the stall.
 */
static unsigned prepare_flags(const struct op *o)
{
	/* A ring prepare never waits for the disk or remote thread: held and
	 * retried (op_wait_again). */
	unsigned defer = o->wait ? ENGINE_PREPARE_DEFER : 0;

	if (!o->wait || !o->wait->may_retry)
		return defer | (o->wait && o->wait->retried ? 0 : ENGINE_PREPARE_COUNT);
	return defer | ENGINE_PREPARE_WAIT_RECLAIM |
	       (o->wait->retried ? 0 : ENGINE_PREPARE_COUNT);
}

static int op_prepare(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct engine_lease l;
	struct engine *eng;
	uint64_t fence = 0;
	size_t bytes;
	int ret;

	if (q->n > PREPARE_MAX_NEW)
		return errbuf_set(o->e, -EINVAL, "user %" PRIu64 ": %" PRIu32 " new "
				  "tokens in one prepare; at most %u, split it",
				  q->user, q->n, PREPARE_MAX_NEW);
	if (o->c->rank)
		return errbuf_set(o->e, -EINVAL, "user %" PRIu64 ": rank %" PRIu32
				  " of a tensor-parallel pool: rank 0 prepares; "
				  "join its lease with kvp_lease_join", q->user,
				  o->c->rank);
	eng = op_lock_user(o, q->user);
	ret = prepare_room(o, eng);
	if (!ret)
		ret = engine_prepare_flags(eng, q->user, q->arg, q->n, o->c->id,
					   prepare_flags(o), &l, o->e);
	if (!op_wait_again(o, ret) && ret == -EINPROGRESS)
		goto out; /* held (the reclaimer, the disk or remote tier): the
			   * worker runs it again, serving others meanwhile */
	if (ret == -EAGAIN) {
		/* The user's shard is short of frames: every shard's lock, and
		 * the prepare again, evicting the oldest pages of any shard. */
		eng = op_lock_escalate(o);
		o->e->msg[0] = '\0';
		ret = engine_prepare_flags(eng, q->user, q->arg, q->n, o->c->id,
					   prepare_flags(o) & ENGINE_PREPARE_COUNT,
					   &l, o->e);
	}
	if (ret)
		goto out;
	bytes = sizeof(struct kvp_prepare_out) + (size_t)l.npages * sizeof(int32_t);
	if (bytes > o->out_len) {
		/* prepare_room() promised this cannot happen; undo, not overrun. */
		engine_release(eng, l.id, NULL);
		ret = errbuf_set(o->e, -EMSGSIZE, "user %" PRIu64 ": %zu result bytes "
				 "do not fit out_len %" PRIu32, q->user, bytes, o->out_len);
		goto out;
	}
	lease_out(o, &l, bytes);
	__atomic_add_fetch(&o->c->leases, 1, __ATOMIC_RELAXED);
	/* The page table is written, but its pages are still landing. */
	if (l.fence && o->wait)
		*o->wait = (struct op_wait){ .eng = eng, .fence = l.fence };
	else
		fence = l.fence;
out:
	op_unlock_own(o);
	/* Nowhere to park it: wait here, without holding the pool. */
	if (fence)
		engine_fence_wait(eng, fence);
	return ret;
}

/* Only the client that prepared a lease may end it. */
static int lease_check_owner(struct op *o, struct engine *eng, uint64_t lease)
{
	int64_t owner = engine_lease_owner(eng, lease);

	if (owner < 0)
		return errbuf_set(o->e, -ENOENT, "lease %#" PRIx64 " is not held "
				  "(released already, or never prepared)", lease);
	if ((uint32_t)owner != o->c->id)
		return errbuf_set(o->e, -EPERM, "lease %#" PRIx64 " belongs to client "
				  "%" PRId64 ", not to this client (%" PRIu32 "); only "
				  "the client that prepared a lease may end it", lease,
				  owner, o->c->id);
	return 0;
}

/* A tensor-parallel pool's history leases are group leases (engine.h). */
static bool op_group(const struct op *o, uint64_t lease)
{
	return o->s->tenants.tp > 1 && op_lease_is_history(lease);
}

/* Rank r > 0 joins rank 0's lease: answered as a prepare. */
static int op_lease_join(struct op *o)
{
	const size_t hdr = sizeof(struct kvp_prepare_out);
	const struct kvp_sqe *q = o->sqe;
	struct engine *eng;
	struct engine_lease l;
	uint64_t fence = 0;
	int ret;

	if (o->s->tenants.tp <= 1)
		return errbuf_set(o->e, -EINVAL, "lease %#" PRIx64 ": pool %" PRIu32
				  " is not tensor-parallel (kvpool.conf tp = 1): "
				  "there is nothing to join; prepare instead",
				  q->arg, o->c->pool);
	if (!o->c->rank)
		return errbuf_set(o->e, -EINVAL, "lease %#" PRIx64 ": rank 0 of a "
				  "tensor-parallel pool prepares; ranks 1 to %" PRIu32
				  " join its lease", q->arg, o->s->tenants.tp - 1);
	if (o->out_len < hdr)
		return errbuf_set(o->e, -EMSGSIZE, "lease %#" PRIx64 ": out_len %"
				  PRIu32 " holds no kvp_prepare_out (%zu bytes)",
				  q->arg, o->out_len, hdr);
	eng = op_lock_lease(o, q->arg);
	ret = engine_lease_join(eng, q->arg, o->c->rank, o->c->id,
				(o->out_len - hdr) / sizeof(int32_t), &l, o->e);
	if (!ret && !op_lease_is_history(q->arg)) {
		/* A chunk fill lease: no user, not counted (as a register's). */
		lease_out(o, &l, hdr + (size_t)l.npages * sizeof(int32_t));
		o->cqe->val1 = 0;
	} else if (!ret) {
		lease_out(o, &l, hdr + (size_t)l.npages * sizeof(int32_t));
		engine_lease_user(eng, q->arg, &o->cqe->val1); /* not npages */
		__atomic_add_fetch(&o->c->leases, 1, __ATOMIC_RELAXED);
		/* Rank 0's onload may still be landing in these pages. */
		if (l.fence && o->wait)
			*o->wait = (struct op_wait){ .eng = eng, .fence = l.fence };
		else
			fence = l.fence;
	}
	op_unlock_own(o);
	if (fence)
		engine_fence_wait(eng, fence);
	return ret;
}

static int op_commit_group(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct engine *eng = op_lock_lease(o, q->arg);
	bool left = false;
	int ret;

	ret = engine_commit_rank(eng, q->arg, o->c->rank, o->c->id, q->n,
				 q->flags & KVP_SQE_RELEASE, &left, o->e);
	op_unlock_own(o);
	if (left)
		__atomic_sub_fetch(&o->c->leases, 1, __ATOMIC_RELAXED);
	return ret;
}

static int op_release_group(struct op *o)
{
	struct engine *eng = op_lock_lease(o, o->sqe->arg);
	bool left = false;
	int ret;

	ret = engine_release_rank(eng, o->sqe->arg, o->c->rank, o->c->id, &left,
				  o->e);
	op_unlock_own(o);
	if (left)
		__atomic_sub_fetch(&o->c->leases, 1, __ATOMIC_RELAXED);
	return ret;
}

static int op_commit(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	struct engine *eng;
	bool released = false;
	int ret;

	if (op_group(o, q->arg))
		return op_commit_group(o);
	eng = op_lock_lease(o, q->arg);
	if (o->s->tenants.tp > 1 && engine_lease_grouped(eng, q->arg)) {
		bool left; /* a sharing lease: not counted */

		/* A sequence write lease's group commits as a history's; a
		 * chunk fill lease's takes a commit of all its tokens as this
		 * rank's seal (the lease ends with it). */
		ret = engine_commit_rank(eng, q->arg, o->c->rank, o->c->id, q->n,
					 q->flags & KVP_SQE_RELEASE, &left, o->e);
		op_unlock_own(o);
		return ret;
	}
	ret = lease_check_owner(o, eng, q->arg);

	if (!ret)
		ret = engine_commit(eng, q->arg, q->n, o->e);
	if (!ret && (q->flags & KVP_SQE_RELEASE))
		released = engine_release(eng, q->arg, o->e) == 0;
	op_unlock_own(o);
	if (released && op_lease_is_history(q->arg))
		__atomic_sub_fetch(&o->c->leases, 1, __ATOMIC_RELAXED);
	return ret;
}

static int op_release(struct op *o)
{
	struct engine *eng;
	int ret;

	if (op_group(o, o->sqe->arg))
		return op_release_group(o);
	eng = op_lock_lease(o, o->sqe->arg);
	if (o->s->tenants.tp > 1 && engine_lease_grouped(eng, o->sqe->arg)) {
		bool left; /* a chunk fill lease: not counted */

		ret = engine_release_rank(eng, o->sqe->arg, o->c->rank, o->c->id,
					  &left, o->e);
		op_unlock_own(o);
		return ret;
	}
	ret = lease_check_owner(o, eng, o->sqe->arg);

	if (!ret)
		ret = engine_release(eng, o->sqe->arg, o->e);
	op_unlock_own(o);
	if (!ret && op_lease_is_history(o->sqe->arg))
		__atomic_sub_fetch(&o->c->leases, 1, __ATOMIC_RELAXED);
	return ret;
}

/* ------------------------------------------------------------ tiers */

static int clamp_res(uint64_t v)
{
	return v > INT32_MAX ? INT32_MAX : (int)v;
}

/* Adds the pages offloaded to *(uint64_t *)arg. */
static int offload_pool(struct op *o, struct tenant *t, uint32_t pool,
			struct tenant_pool *tp, void *arg)
{
	uint64_t *pages = arg;
	int ret = 0;

	/* Every shard locked: free host frames idle in any shard's cache are
	 * the offload's too (evict.c, history_offload). */
	shard_lock_all(tp->set);
	for (uint32_t i = 0; i < tp->set->n && ret >= 0; i++) {
		ret = engine_offload_all(tp->set->v[i].eng, o->e);
		if (ret > 0)
			*pages += (uint64_t)ret;
	}
	shard_unlock_all(tp->set);
	if (ret < 0) {
		char why[KVP_ERRLEN];

		memcpy(why, o->e->msg, sizeof(why));
		return errbuf_set(o->e, ret, "%s (%" PRIu64 " pages offloaded "
				  "before)", why, *pages);
	}
	return 0;
}

static int op_offload(struct op *o)
{
	uint64_t pages = 0;
	int ret;

	if (!(o->sqe->flags & KVP_SQE_ALL)) {
		struct engine *eng = op_lock_user(o, o->sqe->user);

		ret = engine_offload(eng, o->sqe->user, o->e);
		if (ret == -ENOSPC && op_set(o)->n > 1) {
			/* Free host frames may sit in other shards' caches. */
			eng = op_lock_escalate(o);
			o->e->msg[0] = '\0';
			ret = engine_offload(eng, o->sqe->user, o->e);
		}
		op_unlock_own(o);
		return ret;
	}
	ret = op_for_each_pool(o, NULL, true, offload_pool, &pages);
	return ret < 0 ? ret : clamp_res(pages);
}

struct evict_sum {
	uint64_t users, skipped;
};

static int evict_pool(struct op *o, struct tenant *t, uint32_t pool,
		      struct tenant_pool *tp, void *arg)
{
	struct evict_sum *sum = arg;
	for (uint32_t i = 0; i < tp->set->n; i++) {
		uint32_t sk = 0;
		int ret = engine_evict_all(shard_lock(tp->set, i), o->sqe->sel, &sk);

		shard_unlock(tp->set, i);
		if (ret < 0)
			return errbuf_set(o->e, ret, "eviction failed");
		sum->users += (uint64_t)ret;
		sum->skipped += sk;
	}
	return 0;
}

static int check_sel(struct op *o)
{
	if (!o->sqe->sel || (o->sqe->sel & ~KVP_SEL_VALID))
		return errbuf_set(o->e, -EINVAL, "%s: sel %u; use 1 (device: "
				  "demote), 2 (host), 3 (both), 4 (disk) or 8 (push "
				  "to disk)", o->name, o->sqe->sel);
	return 0;
}

/* Every unleased user of the pools in o's range: res users evicted,
 * val0 users passed over because a lease holds them. */
static int evict_range(struct op *o)
{
	struct evict_sum sum = { 0 };
	int ret = op_for_each_pool(o, NULL, true, evict_pool, &sum);

	if (ret < 0)
		return ret;
	o->cqe->val0 = sum.skipped;
	return clamp_res(sum.users);
}

static int op_evict(struct op *o)
{
	const struct kvp_sqe *q = o->sqe;
	int ret = check_sel(o);

	if (ret)
		return ret;
	if (!(q->flags & KVP_SQE_ALL)) {
		ret = engine_evict(op_lock_user(o, q->user), q->user, q->sel, o->e);
		op_unlock_own(o);
		return ret;
	}
	return evict_range(o);
}

/*
 * Seed 002's evict_kv_cache ("evict all the KV data") for any client: every
 * unleased user of its own tenant, in every pool of the tenant (its data is
 * all of them), as evict with KVP_SQE_ALL does over every tenant for an
 * admin. op_validate has set the tenant range to the client's tenant (and
 * refused a client without one).
 */
static int op_evict_tenant(struct op *o)
{
	int ret = check_sel(o);

	if (ret)
		return ret;
	o->p_lo = 0;
	o->p_hi = o->s->tenants.npools;
	return evict_range(o);
}

static void stats_add(struct kvp_stats *sum, const struct kvp_stats *x)
{
	uint64_t *d = (uint64_t *)sum;
	const uint64_t *v = (const uint64_t *)x;

	_Static_assert(sizeof(*sum) % sizeof(uint64_t) == 0,
		       "kvp_stats is made of uint64_t counters");
	uint64_t last = sum->chunk_last_access_ns > x->chunk_last_access_ns ?
			sum->chunk_last_access_ns : x->chunk_last_access_ns;

	for (size_t i = 0; i < sizeof(*sum) / sizeof(uint64_t); i++)
		d[i] += v[i];
	sum->chunk_last_access_ns = last; /* a time: the latest, not a sum */
}

/* Adds the pool's counters to *(struct kvp_stats *)arg; cannot fail. */
static int stats_pool(struct op *o, struct tenant *t, uint32_t pool,
		      struct tenant_pool *tp, void *arg)
{
	struct kvp_stats one;

	shard_set_stats(tp->set, &one);
	stats_add(arg, &one);
	return 0;
}

static int op_stats(struct op *o)
{
	struct kvp_stats sum = { 0 };
	bool every = o->t_hi - o->t_lo == o->s->tenants.n &&
		     ((o->sqe->flags & KVP_SQE_ALL) || !o->c->tenant);
	uint64_t pool = o->sqe->arg; /* pool + 1, 0: the op's pools */

	if (o->out_len < sizeof(sum))
		return errbuf_set(o->e, -EMSGSIZE, "stats: the result needs out_len >= "
				  "%zu bytes; out_len is %" PRIu32, sizeof(sum),
				  o->out_len);
	/* One pool of the tenants the op spans (kvctl's per-GPU rows): a
	 * tenant's data is in every pool, whichever it attached to. */
	if (pool > o->s->tenants.npools)
		return errbuf_set(o->e, -EINVAL, "stats: pool %" PRIu64 " does not "
				  "exist; this kvpoold serves pools 0 to %" PRIu32,
				  pool - 1, o->s->tenants.npools - 1);
	if (pool) {
		o->p_lo = (uint32_t)pool - 1;
		o->p_hi = (uint32_t)pool;
	}
	op_for_each_pool(o, NULL, true, stats_pool, &sum);
	/* Per tenant, whatever the pools: clients of all of them. */
	for (uint32_t i = o->t_lo; i < o->t_hi; i++) {
		sum.clients += __atomic_load_n(&o->s->tenants.v[i].clients,
					       __ATOMIC_RELAXED);
		sum.tenants++;
	}
	/* Every tenant: admin-only clients count too. */
	if (every)
		sum.clients = __atomic_load_n(&o->s->reg.live, __ATOMIC_RELAXED);
	out_put(o, &sum, sizeof(sum));
	return 0;
}

/*
 * The settings belong to the main thread (reload.c): ask it the way an
 * operator does, with SIGHUP, which every thread blocks and its signalfd
 * reads, and wait for its verdict, so kvctl reload fails naming a bad key
 * or a refused one instead of leaving the reason to a log. An admin-only
 * operation: the wait holds this worker, for a config file's read.
 */
static int op_reload(struct op *o)
{
	char msg[KVP_ERRLEN - 16];
	int ret = reload_request(10000, msg, sizeof(msg));

	if (ret)
		return errbuf_set(o->e, ret, "reload: %s", msg);
	return 0;
}

/*
 * What kvpoold serves (kvp_server_info). Anyone attached may ask: the
 * layout and backend are what every client must match anyway; the disk
 * directory and the store's address only an admin gets.
 */
static int op_server_info(struct op *o)
{
	const struct server *s = o->s;
	const struct config *cfg = s->cfg;
	const struct tenants *ts = &s->tenants;
	struct kvp_server_info si = {
		.version = KVP_VERSION_MAJOR * 1000 + KVP_VERSION_MINOR,
		.proto = KVP_PROTO_VERSION,
		.pid = (uint32_t)getpid(),
		.flags = o->c->admin ? KVP_SERVER_ADMIN : 0,
		.started_ns = s->started_real_ns,
		.uptime_ns = mono_ns() - s->started_mono_ns,
		.workers = s->nworkers,
		.shards = ts->n && ts->npools ? ts->v[0].pools[0].set->n : 0,
		.pools = ts->npools,
		.tenants = ts->n,
	};

	si.flags |= KVP_SERVER_POOL_DEVICES;
	for (uint32_t p = 0; p < ts->npools && p < KVP_POOLS_MAX; p++)
		si.pool_device[p] = ts->pools[p].device;

	if (o->out_len < sizeof(si))
		return errbuf_set(o->e, -EMSGSIZE, "server info: the result needs "
				  "out_len >= %zu bytes; out_len is %" PRIu32,
				  sizeof(si), o->out_len);
	snprintf(si.backend, sizeof(si.backend), "%s", ts->backend ? ts->backend : "");
	kvp_layout_format(&cfg->layout, si.layout, sizeof(si.layout));
	if (ts->disk) {
		si.flags |= KVP_SERVER_DISK;
		si.disk_size = cfg->disk_size;
		snprintf(si.disk_compress, sizeof(si.disk_compress), "%s",
			 cfg->disk_compress ? cfg->disk_compress : "none");
		if (o->c->admin)
			snprintf(si.disk_dir, sizeof(si.disk_dir), "%s", cfg->disk_dir);
	}
	if (ts->remote) {
		struct remote_tier_stats st;
		struct rc_node_stats ns;

		si.flags |= KVP_SERVER_REMOTE;
		remote_tier_stats(ts->remote, &st);
		for (uint32_t k = 0; k < st.nodes; k++)
			if (remote_tier_node_stats(ts->remote, k, &ns)) {
				si.remote_nodes++;
				si.remote_nodes_up += ns.up;
			}
		if (o->c->admin)
			snprintf(si.remote, sizeof(si.remote), "%s", cfg->remote);
	}
	out_put(o, &si, sizeof(si));
	return 0;
}

static int op_latency(struct op *o)
{
	struct kvp_latency l;

	if (o->out_len < sizeof(l))
		return errbuf_set(o->e, -EMSGSIZE, "latency: the result needs out_len "
				  ">= %zu bytes; out_len is %" PRIu32, sizeof(l),
				  o->out_len);
	metrics_latency(o->s, &l);
	out_put(o, &l, sizeof(l));
	return 0;
}

static int op_ring_phases(struct op *o)
{
	struct kvp_ring_phases p;

	if (o->out_len < sizeof(p))
		return errbuf_set(o->e, -EMSGSIZE, "ring phases: the result needs "
				  "out_len >= %zu bytes; out_len is %" PRIu32,
				  sizeof(p), o->out_len);
	metrics_phases(o->s, &p);
	out_put(o, &p, sizeof(p));
	return 0;
}

static int op_batch_refuse(struct op *o)
{
	return errbuf_set(o->e, -EINVAL, "batch: its items are in the arena, so "
			  "a batch goes through the ring only (the uds mode takes "
			  "one operation per request)");
}

/* ------------------------------------------------------------ dispatch */

static void op_fail(struct op *o, int ret)
{
	const char *msg = o->e->msg[0] ? o->e->msg : strerror(-ret);
	size_t n = strlen(msg) + 1;

	o->cqe->res = ret;
	kvp_cqe_detail_put(o->cqe, o->e->kind, o->e->first, o->e->last);
	if (!o->out_len) {
		o->cqe->out_bytes = 0;
		return;
	}
	if (n > o->out_len)
		n = o->out_len;
	memcpy(o->out, msg, n - 1);
	o->out[n - 1] = '\0';
	o->cqe->out_bytes = (uint32_t)n;
}

void op_execute_held(struct server *s, struct client *c, const struct kvp_sqe *sqe,
		     const unsigned char *in_base, uint32_t in_cap,
		     unsigned char *out_base, uint32_t out_cap,
		     struct op_scratch *scr, struct kvp_cqe *cqe,
		     struct op_wait *wait, int32_t *hold)
{
	struct errbuf e = { .msg = "" };
	struct op o = { .s = s, .c = c, .sqe = sqe, .cqe = cqe, .scr = scr,
			.e = &e, .wait = wait, .name = "?", .in_base = in_base,
			.in_cap = in_cap, .locked = OP_UNLOCKED, .hold = hold };
	uint64_t t0 = metrics_op_start(sqe->opcode);
	int ret;

	*cqe = (struct kvp_cqe){ .tag = sqe->tag };
	if (wait)
		*wait = (struct op_wait){ .may_retry = wait->may_retry,
					  .retried = wait->retried };
	/* Overflow-safe: out_off + out_len could wrap; this cannot. */
	if (sqe->out_len > out_cap || sqe->out_off > out_cap - sqe->out_len) {
		cqe->res = -EINVAL; /* nowhere to put a message */
		goto done;
	}
	o.out = out_base + sqe->out_off;
	o.out_len = sqe->out_len;
	ret = op_validate(&o);
	if (!ret)
		ret = descs[sqe->opcode].fn(&o);
	if (wait && wait->retry)
		return; /* not executed: the caller runs the entry again */
	if (ret < 0)
		op_fail(&o, ret);
	else
		cqe->res = ret;
done:
	__atomic_add_fetch(&c->ops, 1, __ATOMIC_RELAXED);
	metrics_op_done(sqe->opcode, cqe->res, t0);
}

void ops_execute(struct server *s, struct client *c, const struct kvp_sqe *sqe,
		 const unsigned char *in_base, uint32_t in_cap,
		 unsigned char *out_base, uint32_t out_cap,
		 struct op_scratch *scr, struct kvp_cqe *cqe,
		 struct op_wait *wait)
{
	op_execute_held(s, c, sqe, in_base, in_cap, out_base, out_cap, scr, cqe,
			wait, NULL);
}

bool ops_sqe_user(struct server *s, struct client *c, const struct kvp_sqe *sqe,
		  uint64_t *user)
{
	struct shard_set *set;
	uint32_t i;
	int ret;

	if (!c->tenant || (sqe->flags & KVP_SQE_ALL))
		return false;
	switch (sqe->opcode) {
	case KVP_OP_INFO:
	case KVP_OP_PREPARE:
	case KVP_OP_OFFLOAD:
	case KVP_OP_EVICT:
	case KVP_OP_MOVE:
		*user = sqe->user;
		return true;
	case KVP_OP_COMMIT:
	case KVP_OP_RELEASE:
		set = c->tenant->pools[c->pool].set;
		i = shard_of_lease(set, sqe->arg);
		ret = engine_lease_user(shard_lock(set, i), sqe->arg, user);
		shard_unlock(set, i);
		return ret == 0;
	default:
		return false;
	}
}
