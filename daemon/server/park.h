/* SPDX-License-Identifier: MIT */
/*
 * park.h - completions parked until an onload lands.
 *
 * A prepare that needs an onload returns from the engine with the copy still
 * in flight (engine.h: the lease's fence). Its completion must not reach the
 * client before the bytes are on the device, but the worker must not wait
 * either: other clients' operations keep flowing. So the worker parks the
 * finished CQE here with its fence and publishes it on a later pass, once
 * the fence has landed (worker.c says when it looks, and how a parked user
 * holds back that client's later operations on the same user).
 *
 * One list per client, owned by the worker serving the client (then by the
 * main thread, which waits for the fences of a dead client's parked
 * completions before it releases its leases). Its capacity is fixed when it
 * is first needed, so parking never allocates after that. Pure bookkeeping:
 * whether a fence has landed is the caller's question (a callback), so the
 * unit tests drive it without a backend.
 */
#ifndef KVPOOLD_PARK_H
#define KVPOOLD_PARK_H

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

struct engine;

struct park {
	struct kvp_cqe cqe;      /* the completion, ready to publish */
	struct engine *eng;      /* the engine (backend) the fence is of */
	uint64_t fence;          /* engine_fence_done(eng, fence) publishes it */
	uint64_t user;           /* the user the prepare was for */
	uint64_t since_ns;       /* parked at (mono_ns), for the onload
				  * latency metric; 0 when not recorded */
};

struct park_list {
	struct park *v;          /* [cap], NULL until park_init() */
	uint32_t n;              /* parked now, in the order they were parked */
	uint32_t cap;
};

/* Room for cap entries (cap > 0); 0 or -ENOMEM. */
int park_init(struct park_list *p, uint32_t cap);
void park_fini(struct park_list *p);

/* Park one more; false when the list is full (or was never initialised). */
bool park_add(struct park_list *p, const struct park *e);

/* Whether a completion for user is parked. */
bool park_has_user(const struct park_list *p, uint64_t user);

typedef bool (*park_landed_fn)(void *arg, const struct park *e);
typedef void (*park_emit_fn)(void *arg, const struct kvp_cqe *cqe);

/*
 * Hand the completions whose fence has landed to emit, in the order they
 * were parked, at most max of them; the others stay parked, in order.
 * Returns how many were handed over.
 */
uint32_t park_reap(struct park_list *p, uint32_t max, park_landed_fn landed,
		   park_emit_fn emit, void *arg);

#endif /* KVPOOLD_PARK_H */
