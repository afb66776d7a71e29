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

/*
 * BATCH entries (proto.h, BATCH). The worker takes a batch entry in steps,
 * because its items are ordered with the lane's other entries one by one
 * (worker.c, DEFERRAL):
 *
 *	b = ops_batch_open(...);        items validated and copied once
 *	ops_batch_run(...)              every item that may run now, in order
 *	ops_batch_settle(...)           completions of landed items logged
 *	ops_batch_emit(...)             a completion for the items logged
 *	                                since the last one (the last: final)
 *	while not final: hold the entry, run and settle again on later passes
 *	ops_batch_free(b)
 *
 * Each item runs as its own entry would (ops_execute's checks and
 * operations) under its shard's lock, which stays held from one item to
 * the next while they share the shard and is let go whenever
 * ops_batch_run returns. An item's completion goes to the batch's log
 * (proto.h, BATCH) once it ran and its onload, if any, landed.
 */
enum op_item_state {
	OP_ITEM_UNRUN,             /* not run: waits (or was not reached) */
	OP_ITEM_LANDING,           /* ran; its onload is in flight */
	OP_ITEM_LOGGED,            /* its completion is in the log */
};

struct op_batch_slot {
	struct kvp_batch_item it;  /* the private copy */
	uint64_t user;             /* for ordering, when has_user */
	uint64_t since;            /* waits for the reclaimer since (ns); 0 */
	uint64_t retry_at;         /* waits for a lower tier: not tried before */
	struct engine *eng;        /* LANDING: engine_fence_done(eng, fence) */
	uint64_t fence;
	struct kvp_cqe cqe;        /* LANDING: its completion, for the log */
	uint8_t state;             /* enum op_item_state */
	uint8_t why;               /* UNRUN after a try: enum engine_wait */
	bool has_user;             /* false: names no user (an unknown lease) */
	bool user_known;           /* user and has_user were looked up */
};

struct op_batch {
	uint32_t count;            /* items */
	uint32_t first;            /* items before it are all LOGGED */
	uint32_t nlog;             /* completions in the log */
	uint32_t emitted;          /* of them, announced by a completion */
	int32_t hold;              /* shard held between items; -1: none */
	struct op_batch_slot v[];
};

/*
 * Check a batch entry (sqe, a private copy) and copy its items out of
 * in_base once. Returns the batch to run, or NULL: with cqe->res < 0 it was
 * refused, nothing ran, and *cqe (message in its result range) is its
 * completion; with cqe->res == 0 memory is short: take the entry later.
 */
struct op_batch *ops_batch_open(struct server *s, struct client *c,
				const struct kvp_sqe *sqe,
				const unsigned char *in_base, uint32_t in_cap,
				unsigned char *out_base, uint32_t out_cap,
				struct kvp_cqe *cqe);

/* Whether item i must wait behind what its lane holds (the worker's
 * question, asked only while the lane holds anything). */
typedef bool (*op_batch_held_fn)(void *arg, struct op_batch *b, uint32_t i);

/*
 * Run every item not run yet that may run now, in item order: not one
 * held() holds, nor one behind an earlier item of the batch of the same
 * user (or of no single user) that has not run or not landed. A prepare
 * that waits (the reclaimer: up to clk->reclaim_wait_ns from its first
 * try, then it makes its room itself; a lower tier: until the tier
 * answers, tried again every clk->tier_retry_ns) stays unrun, its why
 * noted. Returns the items still unrun; their users
 * are looked up before it returns, for ops_batch_holds.
 */
struct op_batch_clock {
	uint64_t reclaim_wait_ns;  /* the reclaimer's wait, at most */
	uint64_t tier_retry_ns;    /* a lower tier's wait: tried this often */
};

uint32_t ops_batch_run(struct server *s, struct client *c,
		       const struct kvp_sqe *sqe, struct op_batch *b,
		       unsigned char *out_base, uint32_t out_cap,
		       struct op_scratch *scr, op_batch_held_fn held, void *arg,
		       uint64_t now, const struct op_batch_clock *clk);

/* The user item i names (ops_sqe_user's answer for it); looked up once. */
bool ops_batch_user(struct server *s, struct client *c, struct op_batch *b,
		    uint32_t i, uint64_t *user);

/* Whether an entry of user (has_user false: of no single user) must wait
 * behind b: b has an item of its user (or of no single user) that has not
 * run, or not landed. Takes no lock. */
bool ops_batch_holds(const struct op_batch *b, bool has_user, uint64_t user);

/* Log the completions of items whose onload landed. Returns whether every
 * item is logged (the next ops_batch_emit is the final one). */
bool ops_batch_settle(const struct kvp_sqe *sqe, struct op_batch *b,
		      unsigned char *out_base);

/* The completion for the items logged since the last one (proto.h,
 * BATCH: res how many, val0 the first's log index, val1 1 when final).
 * false when there is none to send. */
bool ops_batch_emit(const struct kvp_sqe *sqe, struct op_batch *b,
		    struct kvp_cqe *cqe);

/* Whether one of b's items has opcode (the worker's phase timing). */
bool ops_batch_has(const struct op_batch *b, uint8_t opcode);

void ops_batch_free(struct op_batch *b);
/* A batch that will never complete (its client is gone, the daemon
 * stops): its onloads in flight are waited for, as a parked completion's
 * are before the client's leases go, then it is freed. NULL: nothing. */
void ops_batch_drop(struct op_batch *b);

#endif /* KVPOOLD_OPS_H */
