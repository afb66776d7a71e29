/* SPDX-License-Identifier: MIT */
/*
 * engine_share.h - what the engine core (engine.c, evict.c, engine_query.c,
 * engine_check.c) calls into sharing (share*.c: the prefix cache, chunks,
 * sequences), and nothing else.
 *
 * The core owns histories, leases and the LRU lists; sharing owns device
 * frames it took from the core's allocator. The core reaches them only
 * here: to create and destroy the shared world with the engine, to count,
 * date and evict its evictable frames as one more LRU class, to settle a
 * dead client's holdings, for statistics and for engine_check(). Sharing
 * in turn uses engine_internal.h (histories, frames, the LRU clock); the
 * arrows point one way: share*.c -> engine_internal.h, engine core ->
 * this header, never the core -> share_internal.h.
 */
#ifndef KVPOOL_ENGINE_SHARE_H
#define KVPOOL_ENGINE_SHARE_H

#include <stdint.h>

#include "engine.h"

/* The shared world of eng, sized by its device tier (-ENOMEM). */
int share_create(struct engine *eng, struct errbuf *e);
/* Everything sharing holds goes; first in engine_destroy (sequences pin
 * histories). */
void share_destroy(struct engine *eng);

/* Eviction: the shared world is one LRU class beside the history lists. */
/* Frames eviction can free from it: unheld chunks, idle prefix pages. */
uint64_t share_evictable(const struct engine *eng);
/* Tick (engine_tick) of its oldest evictable item (UINT64_MAX: none). */
uint64_t share_oldest_tick(const struct engine *eng);
/* Evict that item; returns device frames freed. */
uint32_t share_evict_oldest(struct engine *eng);

/* A client is gone: its sequences (its leases went first); how many. */
uint32_t share_release_owner(struct engine *eng, uint32_t owner);
/* Sharing's fields of the statistics (prefix, chunks, sequences). */
void share_stats(const struct engine *eng, struct kvp_stats *st);
/* engine_check(): owner has one byte per device frame, set for frames
 * histories hold; adds the shared world's and chunks' frames to it and
 * to *frames_held. */
int share_check(struct engine *eng, uint8_t *owner, uint64_t *frames_held,
		struct errbuf *e);

/*
 * Sharing's leases (sequence writes, chunk fills and reads, compositions)
 * are slots of the engine's one lease table (engine_internal.h, lease.c);
 * their ids carry SHARE_LEASE_BIT. The engine looks an id up once and
 * hands a sharing lease's slots and commit here, with its id for
 * messages; lease_release() calls share_lease_end() and then frees the
 * slot.
 */
#define SHARE_LEASE_BIT (1ull << 31)
struct lease;
int share_lease_slots(struct engine *eng, struct lease *l, uint64_t id,
		      uint32_t first, uint32_t n, struct kvp_slot *out,
		      struct errbuf *e);
int share_lease_commit(struct engine *eng, struct lease *l, uint64_t id,
		       uint32_t n, struct errbuf *e);
/* Let go of what l holds (the slot is the engine's to free). */
void share_lease_end(struct engine *eng, struct lease *l);
/* A rank > 0 joins chunk fill lease l (lease_group.c, which checked the
 * page table's size and reserved eng->view for it): *out as the
 * registration's lease, the entry's page table in eng->view. */
void share_chunk_join_out(struct engine *eng, struct lease *l, uint64_t id,
			  struct engine_lease *out);
/* The same for sequence write lease l (the sequence's page table). */
void share_seq_join_out(struct engine *eng, struct lease *l, uint64_t id,
			struct engine_lease *out);

#endif /* KVPOOL_ENGINE_SHARE_H */
