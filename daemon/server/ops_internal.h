/* SPDX-License-Identifier: MIT */
/*
 * ops_internal.h - one operation being executed, shared by ops.c (checks,
 * dispatch, the data operations), ops_list.c (USERS, CLIENTS) and
 * ops_share.c (prefix cache, sequences, compositions) and ops_chunk.c.
 */
#ifndef KVPOOLD_OPS_INTERNAL_H
#define KVPOOLD_OPS_INTERNAL_H

#include "client.h"
#include "kvpool_engine.h"
#include "ops.h"
#include "server.h"

/* Rows one USERS or CLIENTS call returns at most; the cursor pages on. */
#define OPS_LIST_MAX_ROWS 65536u

struct op {
	struct server *s;
	struct client *c;
	const struct kvp_sqe *sqe;  /* the private copy */
	const char *name;           /* the opcode's, for messages */
	const unsigned char *in_base; /* where inputs are read from (the
				     * client's arena, untrusted); NULL: none */
	uint32_t in_cap;
	unsigned char *out;         /* the checked result range */
	uint32_t out_len;
	struct kvp_cqe *cqe;
	struct op_scratch *scr;
	struct errbuf *e;
	struct op_wait *wait;       /* NULL: wait for an onload here */
	uint32_t t_lo, t_hi;        /* tenants an op spans: [t_lo, t_hi) */
	uint32_t p_lo, p_hi;        /* and pools: the client's, or with
				     * KVP_SQE_ALL every pool */
	int32_t locked;             /* OP_UNLOCKED, OP_LOCKED_ALL or a shard */
	int32_t *hold;              /* a batch's item: the shard held from one
				     * item to the next (-1: none); NULL: none */
};

#define OP_UNLOCKED (-1)
#define OP_LOCKED_ALL (-2)

/* ops_execute() for one item of a batch (ops_batch.c): *hold is the shard
 * whose lock the batch holds between items (lock_shard in ops.c). */
void op_execute_held(struct server *s, struct client *c, const struct kvp_sqe *sqe,
		     const unsigned char *in_base, uint32_t in_cap,
		     unsigned char *out_base, uint32_t out_cap,
		     struct op_scratch *scr, struct kvp_cqe *cqe,
		     struct op_wait *wait, int32_t *hold);

/* Scratch of at least bytes; NULL when memory is out. */
void *op_scratch_get(struct op_scratch *scr, size_t bytes);

/* Rows of row_bytes a list op may write: min(n, out_len / row_bytes, cap);
 * -EINVAL with a message when not even one. */
int op_list_rows(struct op *o, size_t row_bytes, const char *what);

/*
 * fn for each pool of each tenant the op spans ([t_lo, t_hi) x [p_lo, p_hi)),
 * tenant by tenant (fn takes the shard locks it needs, shard.h); the first
 * failure (fn < 0) stops
 * the walk. Returns 0 or that failure, with fn's message (o->e) put after
 * where it happened: "[what: ]tenant NAME[, pool P]: ", the pool named only
 * when name_pool is set and the daemon has several.
 */
typedef int (*op_pool_fn)(struct op *o, struct tenant *t, uint32_t pool,
			  struct tenant_pool *tp, void *arg);
int op_for_each_pool(struct op *o, const char *what, bool name_pool,
		     op_pool_fn fn, void *arg);

int op_users(struct op *o);
int op_clients(struct op *o);
/* ops_move.c: a history from one pool of the tenant to another. */
int op_move(struct op *o);
int op_chunk_copy(struct op *o);

/* The client's tenant's shards in the client's pool (shard.h). */
struct shard_set *op_set(struct op *o);
/* The shard owning user, locked; its engine. */
struct engine *op_lock_user(struct op *o, uint64_t user);
/* The shard a lease id names, locked; its engine. */
struct engine *op_lock_lease(struct op *o, uint64_t lease);
/* Every shard, in order (the sharing opcodes: their state is shard 0's,
 * and sequences pin other shards' histories); shard 0's engine. */
struct engine *op_lock_own(struct op *o);
/* From one shard's lock to every shard's (a prepare the shard could not
 * serve alone); the same shard's engine. */
struct engine *op_lock_escalate(struct op *o);
/* Drop whatever op_lock_* took. */
void op_unlock_own(struct op *o);

/*
 * Leases of sequences and chunks share the engine's lease id space and are
 * told apart by bit 31 of the low word (share.h, LEASE HANDLES). Only
 * history leases count in a client's `leases` (kvctl clients): the others
 * also end implicitly (a seal, a seq_free), so a count of them could not be
 * kept exact here; the engine's stats count sequences and chunks.
 */
static inline bool op_lease_is_history(uint64_t lease)
{
	return !(lease & (1ull << 31));
}

/* ops_share.c: the helpers of the sharing opcodes (ops_share.c's top
 * comment says how they are used). */
uint64_t op_now_ns(void);                 /* CLOCK_REALTIME */
/* Copy the input range once into scratch, extra bytes after it in *priv. */
int op_input(struct op *o, size_t extra, const unsigned char **in, void **priv);
/* op_input() of an input that starts with a header of hsize, copied to hdr. */
int op_input_header(struct op *o, void *hdr, size_t hsize, size_t extra,
		    const unsigned char **in, void **priv);
/* in_len is exactly one chunk id: *id gets the copy. */
int op_input_id(struct op *o, struct kvp_chunk_id *id);
/*
 * The one retry helper, called unlocked after an engine call made under
 * the own lock: true when that call answered a typed wait (tier.h: the
 * reclaimer, the disk or the remote tier) and must be made again now.
 * A ring or uds entry (o->wait) is held by its worker instead and run
 * again later, others served meanwhile (retry and why set; false: return
 * ret): a reclaimer's wait up to RECLAIM_WAIT_NS, a lower tier's until the
 * tier answers (worker.c). With nowhere to hold it, the wait is the answer
 * (-EINPROGRESS, "try again"); nothing here sleeps. Every
 * engine call that may wait is written
 *
 *	do {
 *		eng = op_lock_own(o);
 *		ret = share_...(eng, ...);
 *		op_unlock_own(o);
 *	} while (op_wait_again(o, ret));
 */
bool op_wait_again(struct op *o, int ret);
uint64_t op_span_pages(struct op *o, uint64_t n);  /* pages of n tokens */
/* The result room a lease of pages needs at off: -EMSGSIZE when short. */
int op_lease_room(struct op *o, size_t off, uint64_t pages);
/* A lease as kvp_prepare_out + frames at off (pool locked). */
int op_put_lease(struct op *o, size_t off, const struct engine_lease *l);

/* ops_share.c and ops_chunk.c: one function per sharing opcode. */
int op_prefix_lookup(struct op *o);
int op_seq_alloc(struct op *o);
int op_seq_create(struct op *o);
int op_seq_extend(struct op *o);
int op_seq_free(struct op *o);
int op_seq_info(struct op *o);
int op_seq_tokens(struct op *o);
int op_chunk_register(struct op *o);
int op_chunk_seal(struct op *o);
int op_chunk_acquire(struct op *o);
int op_chunk_get(struct op *o);
int op_chunk_list(struct op *o);
int op_chunk_delete(struct op *o);
int op_chunk_clear(struct op *o);
int op_chunk_evict_unused(struct op *o);
int op_chunk_link(struct op *o);
int op_chunk_entry(struct op *o);
int op_chunk_entries(struct op *o);
int op_chunk_content(struct op *o);
int op_chunk_tokens(struct op *o);
int op_chunk_limits(struct op *o);
int op_compose(struct op *o);

#endif /* KVPOOLD_OPS_INTERNAL_H */
